"""Every script behind a published figure, run as its documentation runs it, on its smallest setting: it exits 0 and
what it prints or writes holds the documented table (recomputed from the archived raw results where docs/evidence
keeps them) or numbers in a plausible range. Scripts that launch trainers run with their launches printed (the
launch scripts' DARL_PRINT_CMD) and on finished runs they keep; their smallest real runs are `full` (make test-all).
benchmarks/metric_ranges.py is run in tests/test_docs.py, the DARTS rollout benchmark on vLLM in
tests/vllm/test_rollout_bench.py."""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "docs" / "evidence"


def run(argv: list, timeout: float = 120, **env: str) -> str:
    """stdout of `argv` run from the repository root; fails the test, showing the output, unless it exits 0."""
    done = subprocess.run([str(a) for a in argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable, **env})
    if done.returncode != 0:
        pytest.fail(f"{argv} exited with {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n"
                    f"{done.stderr[-4000:]}", pytrace=False)
    return done.stdout


def python(*args, timeout: float = 120, **env: str) -> str:
    return run([sys.executable, *args], timeout=timeout, **env)


def block(page: str, name: str) -> str:
    """The text between <!-- name --> and <!-- /name --> of a docs page."""
    text = (ROOT / "docs" / page).read_text()
    return text.split(f"<!-- {name} -->\n", 1)[1].split(f"\n<!-- /{name} -->", 1)[0].strip()


def is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def write_log(path: Path, steps: dict[int, dict]) -> None:
    """A verl file-logger metrics.jsonl (one {"step", "data"} line a step, written as verl writes it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"step": s, "data": d}, separators=(",", ":")) + "\n"
                            for s, d in steps.items()))


# ---------------------------------------------------------------------------------------------------------- DARTS


def test_rollout_bench_table_is_darts_md():
    """docs/darts.md's CPU table is what rollout_bench.py's `table` gives on the archived raw runs; unknown settings
    are refused before anything starts."""
    from benchmarks.darts.rollout_bench import main, table

    bench = json.loads((EVIDENCE / "darts" / "rollout_cpu.json").read_text())
    text = table(bench)
    assert text.startswith("| lengths | setting | generation s | base / setting | tokens decoded | tokens kept |")
    assert len(text.splitlines()) == 2 + 15 and text in (ROOT / "docs" / "darts.md").read_text()
    with pytest.raises(SystemExit) as refused:
        main(["--out", "unused.json", "--settings", "base,fixed9"])
    assert refused.value.code == 2


def predicted(prompts: int, *extra: str, timeout: float = 120) -> list[list[str]]:
    """The rows of `simulator.py --predict` on the archived H100 decode costs: [model, lengths, (seed,) base s,
    base, fixed r=12 L=0, fixed r=12 L=1, adaptive L=0, released]."""
    out = python("benchmarks/darts/simulator.py", "--predict", EVIDENCE / "darts" / "gpu" / "decode_cost_h100.json",
                 "--prompts", str(prompts), *extra, timeout=timeout)
    return [line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith("| Qwen3-")]


def speedups(rows: list[list[str]], columns: tuple[int, ...], lengths: set[str]) -> str:
    values = [float(r[c].rstrip("x")) for r in rows if r[1] in lengths for c in columns]
    return f"{min(values):.2f}-{max(values):.2f}x"


def test_simulator_predictions_are_darts_md():
    """docs/darts.md's table of predicted speed-ups on an H100 (ranges over both models) is what `--predict` prints
    for 128 and 32 prompts; its CPU validation sentence is what `--validate` prints."""
    wide, narrow = predicted(128, timeout=300), predicted(32)
    assert len(wide) == len(narrow) == 8
    light, longer, tail = {"GSM8K-like", "MATH-like", "long reasoning"}, {"MATH-like", "long reasoning"}, {"heavy tail"}
    cut = (4, 6)  # fixed r = 12 and adaptive, both L = 0; the released defaults are the last column
    page = " ".join((ROOT / "docs" / "darts.md").read_text().split())
    assert (f"| GSM8K-like, MATH-like, long reasoning | {speedups(wide, cut, light)} | "
            f"{speedups(narrow, cut, longer)} (MATH-like and longer) | {speedups(wide + narrow, (7,), light)} |") in page
    assert (f"| heavy tail | **{speedups(wide, cut, tail)}** | **{speedups(narrow, cut, tail)}** | "
            f"{speedups(wide + narrow, (7,), tail)} |") in page
    out = python("benchmarks/darts/simulator.py", "--validate", EVIDENCE / "darts" / "rollout_cpu.json")
    found = re.search(r"out of sample \(12 cells\): within 15% in (\d+) of 12, errors (\S+) to (\S+),", out)
    assert found and f"within 15% in {found[1]} of 12 ({found[2]} to {found[3]})" in page
    # the large measured L = 0 speed-ups (heavy tails), and by how much the simulator over-predicts them
    over = [float(c[6].split(" / ")[1].rstrip("x")) / float(c[6].split(" / ")[0].rstrip("x"))
            for c in (line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith("| heavy"))
            if c[1].endswith("0")]
    assert f"over-predicts the large L = 0 speed-ups by {min(over) - 1:.0%}-{max(over) - 1:.0%}".replace("%-", "-") \
        in page


def test_simulator_heavy_tail_counts_its_seeds():
    """Over seeds 0-3, the printed count of seeds where fixed r = 12 is ahead of adaptive (both L = 0) is the
    count of the printed rows."""
    rows = predicted(32, "--workloads", "heavy tail", "--seeds", "0", "1", "2", "3")
    assert len(rows) == 2 * 4
    out = python("benchmarks/darts/simulator.py", "--predict", EVIDENCE / "darts" / "gpu" / "decode_cost_h100.json",
                 "--prompts", "32", "--workloads", "heavy tail", "--seeds", "0", "1", "2", "3")
    for model in ("1.7B", "4B"):
        ahead = sum(float(r[5].rstrip("x")) > float(r[7].rstrip("x")) for r in rows if r[0] == f"Qwen3-{model}")
        assert f"Qwen3-{model}, heavy tail: fixed r=12, L=0 ahead of adaptive, L=0 in {ahead} of 4 seeds" in out


@pytest.mark.full
def test_simulator_heavy_tail_over_20_seeds_is_darts_md():
    """docs/darts.md's counts over seeds 0-19 (fixed r = 12 ahead of adaptive, both L = 0) and fixed r = 12's
    range, from `--predict --seeds 0 ... 19` for 32 and 128 prompts (minutes)."""
    seeds = ("--workloads", "heavy tail", "--seeds", *map(str, range(20)))
    ahead, spread = {}, {}
    for prompts in (32, 128):
        rows = predicted(prompts, *seeds, timeout=900)
        assert len(rows) == 2 * 20
        for model in ("1.7B", "4B"):
            mine = [r for r in rows if r[0] == f"Qwen3-{model}"]
            ahead[prompts, model] = sum(float(r[5].rstrip("x")) > float(r[7].rstrip("x")) for r in mine)
        spread[prompts] = [float(r[5].rstrip("x")) for r in rows]
    assert ahead[32, "1.7B"] == ahead[32, "4B"]
    page = " ".join((ROOT / "docs" / "darts.md").read_text().split())
    assert (f"fixed r = 12 was ahead in {ahead[32, '4B']} of 20 draws for 32 prompts and in {ahead[128, '1.7B']} "
            f"(1.7B) and {ahead[128, '4B']} (4B) of 20 for 128 prompts") in page
    assert (f"fixed r = 12 alone ranged over {min(spread[32]):.1f}-{max(spread[32]):.1f}x (32 prompts) and "
            f"{min(spread[128]):.1f}-{max(spread[128]):.1f}x (128)") in page


def test_darts_summary_gives_the_released_defaults_table(tmp_path):
    """summary.py on the archived vLLM runs gives docs/darts.md's end-to-end table; its plot of the archived CPU runs
    is a PNG."""
    out = python("benchmarks/darts/summary.py", EVIDENCE / "darts" / "vllm_released")
    rows = {line.split(" | ")[1]: line.split(" | ") for line in out.splitlines() if line.startswith("| preset_on |")}
    # gen_s, decoded, kept, step_s, p50 (columns 4-8) as docs/darts.md rounds them
    assert [rows["base"][i] for i in (3, 4, 5, 6, 7)] == ["6.728", "11202.000", "11202.000", "13.613", "96.000"]
    assert [rows["released"][i] for i in (3, 4, 5, 6, 7)] == ["9.067", "12358.000", "8478.000", "14.305", "57.500"]
    assert "base / released = 0.74x" in out
    doc = (ROOT / "docs" / "darts.md").read_text()
    assert "| base (r = n) | 6.73 | 1.00x | 11,202 | 11,202 | 13.61 | 96 | 0.154 |" in doc
    assert "| released defaults | 9.07 | 0.74x | 12,358 | 8,478 | 14.31 | 57.5 | 0.154 |" in doc
    python("benchmarks/darts/summary.py", EVIDENCE / "darts", "--plot", tmp_path / "curves.png")
    assert is_png(tmp_path / "curves.png")


def test_darts_run_sh_launches_each_config(tmp_path):
    """benchmarks/darts/run.sh with the launches printed: each config's command carries its rollout_shaping keys."""
    run(["bash", "benchmarks/darts/run.sh", tmp_path], SEEDS="0", CONFIGS="base released", DARL_PRINT_CMD="1")
    base = (tmp_path / "preset_on" / "seed0" / "base.log").read_text()
    released = (tmp_path / "preset_on" / "seed0" / "released.log").read_text()
    assert "rollout_shaping.responses=8" in base and "rollout_shaping.keep_last=0" in base
    assert "rollout_shaping.adaptive=true" in released and "rollout_shaping.enable=true" in released
    assert "one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg" in base and "data.seed=0" in base


def test_decode_cost_quick_on_cpu(tmp_path):
    """decode_cost.py's smoke grid on the tiny shape: the JSON the simulator reads, with a fit of every point."""
    python("benchmarks/darts/decode_cost.py", "--out", tmp_path / "cost.json", "--models", "tiny", "--quick",
           "--repeats", "2")
    cost = json.loads((tmp_path / "cost.json").read_text())
    tiny = cost["models"]["tiny"]
    assert cost["device"] == "cpu" and not cost["cuda_graphs"]
    assert {(p["b"], p["c"]) for p in tiny["decode"]} == {(1, 64), (4, 64), (1, 256), (4, 256)}
    assert all(0 < p["ms"] < 1e4 for p in tiny["decode"] + tiny["prefill"])
    assert set(tiny["fit"]) == {"fixed_ms", "per_seq_ms", "per_ctx_token_ms", "max_rel_error"}
    assert all(math.isfinite(v) for v in tiny["fit"].values()) and tiny["prefill_ms_per_token"] > 0


# ------------------------------------------------------------------------------------------------ core and engine


def test_bench_core_smallest(tmp_path):
    out = python("benchmarks/bench_core.py", "--prompts", "8", "--length", "64", "--repeats", "1", "--json",
                 tmp_path / "core.json")
    assert out.startswith("| figure | value |") and "| buffer bytes per stored response token |" in out
    figures = json.loads((tmp_path / "core.json").read_text())
    assert figures["candidates"].startswith("32 groups x 8 responses")
    # docs/performance.md's "9.04 + 4 per recorded version" at 4,096 tokens; short responses carry more per token
    assert 8 < figures["bytes_per_token_without_recorded"] < 32
    assert figures["bytes_per_token"] == pytest.approx(figures["bytes_per_token_without_recorded"]
                                                       + 4 * figures["recorded_versions_per_group"])
    assert all(figures[k] > 0 for k in ("insert_s", "score_s", "weights_s")) and 0 < figures["m2_gated_fraction"] < 1


def test_bench_logprobs_on_cpu():
    out = python("benchmarks/bench_logprobs.py", "--device", "cpu", "--tokens", "64", "--vocab", "1000",
                 "--repeats", "1")
    result = json.loads(out.strip().splitlines()[-1])
    assert result["tokens"] == 64 and result["device"] == "cpu"
    assert set(result["seconds"]) == {f"{d}/{f}" for d in ("bfloat16", "float32") for f in ("v2_row_loop", "naive")}
    assert all(0 < s < 60 for s in result["seconds"].values())


def test_bench_engine_loss_cpu_check(tmp_path):
    """The CPU check of the script its docstring gives: verl's FSDP2 TrainingWorker trains the same mini-batch with
    both losses."""
    out = python("benchmarks/bench_engine_loss.py", "--model", "tiny", "--prompts", "2", "--n", "2",
                 "--prompt-length", "16", "--response-length", "16", "--max-tokens", "64", "--repeats", "1",
                 "--json", tmp_path / "loss.json", VERL_PLATFORM="cpu", OMP_NUM_THREADS="1", timeout=240)
    assert "| loss | median s / mini-batch | tokens/s | peak GiB |" in out and "darl / decoupled:" in out
    result = json.loads((tmp_path / "loss.json").read_text())
    assert result["samples"] == 4 and result["device"] == "cpu" and result["parameters"] > 0
    assert set(result["median_s"]) == {"decoupled", "darl"} and all(v > 0 for v in result["median_s"].values())
    assert 0.1 < result["ratio"] < 10


def test_bench_code_reward_smallest():
    """Two HumanEval programs and two stdin ones through this tree's scorer and HEAD's: every one scores 1 (the
    script asserts it) and the table has both rows."""
    out = python("benchmarks/bench_code_reward.py", "--baseline", "HEAD", "--rounds", "1", "--limit", "2",
                 timeout=240)
    assert "4 programs per round" in out
    rates = {m.group(1): float(m.group(2)) for m in re.finditer(r"^\| (HEAD|this tree) \| ([\d.]+) \|$", out, re.M)}
    assert set(rates) == {"HEAD", "this tree"} and all(r > 0 for r in rates.values())
    assert re.search(r"this tree takes [\d.]+x the baseline's time per program", out)


# ------------------------------------------------------------------------------------------------ shell studies


def test_preset_cost_sh_prints_its_launches(tmp_path):
    out = run(["bash", "benchmarks/preset_cost.sh", tmp_path], SEEDS="1", DARL_PRINT_CMD="1")
    assert "launches printed, not run" in out
    logs = {c: (tmp_path / f"{c}_seed1.log").read_text() for c in ("decoupled", "equal_update", "pmis_sg")}
    assert "one_step_off_grpo_tiny_arith_cpu_replay_4_decoupled_seed1" in logs["decoupled"]
    assert "actor_rollout_ref.actor.ppo_epochs=2" in logs["equal_update"]
    assert "ppo_epochs" not in logs["decoupled"] and "preset=darl_tokens_e2" in logs["pmis_sg"]
    assert all("data.seed=1" in log and "trainer.total_training_steps=12" in log for log in logs.values())


def test_preset_cost_sh_reports_finished_runs(tmp_path):
    """Finished runs are kept (nothing launches) and the table's medians over steps 3.. are theirs."""
    times = {"decoupled": [9, 9, 2, 2, 2], "equal_update": [9, 9, 3, 2, 4], "pmis_sg": [9, 9, 3, 3, 4]}
    for config, series in times.items():
        write_log(tmp_path / f"{config}_seed1" / "metrics.jsonl",
                  {s: {"perf/time_per_step": t, **({"replay/selected": 14} if config == "pmis_sg" else {})}
                   for s, t in enumerate(series, 1)})
    out = run(["bash", "benchmarks/preset_cost.sh", tmp_path], SEEDS="1")
    assert "| 1 | 2.00 | 3.00 | 3.00 | 1.50x | 1.00x | 14.0 |" in out, out
    assert "median ratios over 1 seed(s): preset / decoupled 1.50x, preset / equal_update 1.00x" in out
    assert not list(tmp_path.glob("*.log"))  # nothing launched


def test_cpu_trainers_sh_prints_its_launches(tmp_path):
    out = run(["bash", "benchmarks/cpu_trainers.sh", tmp_path], DARL_PRINT_CMD="1")
    assert "launches printed, not run" in out
    assert "recipe.darl.main_one_step_off" in (tmp_path / "one_step_off.log").read_text()
    assert "recipe.darl.main_fully_async" in (tmp_path / "fully_async.log").read_text()


def test_cpu_trainers_sh_reports_finished_runs(tmp_path):
    from recipe.darl.example.arithmetic import VAL_KEY

    for kind, idle in (("one_step_off", {}), ("fully_async", {"fully_async/trainer/idle_ratio": 0.1,
                                                               "fully_async/rollouter/idle_ratio": 0.3})):
        steps = {0: {VAL_KEY: 0.3}}
        for s, t in enumerate([5, 5, 2, 4], 1):
            steps[s] = {"perf/time_per_step": t, "replay/staleness_hist/s1": 0.75, "replay/staleness_hist/s2": 0.25,
                        "replay/staleness_mean": 1.25, **idle}
        steps[4][VAL_KEY] = 0.45
        write_log(tmp_path / kind / "metrics.jsonl", steps)
    out = run(["bash", "benchmarks/cpu_trainers.sh", tmp_path], STEPS="4")
    assert "| one_step_off | 3.00 | 1: 0.75, 2: 0.25 | 1.25 | 0: 0.300, 4: 0.450 | - | - |" in out, out
    assert "| fully_async | 3.00 | 1: 0.75, 2: 0.25 | 1.25 | 0: 0.300, 4: 0.450 | 0.10 | 0.30 |" in out
    assert not list(tmp_path.glob("*.log"))  # nothing launched


# the smallest real runs: the scripts' batch (16 prompts x 8) on the tests' rollout, a few steps


@pytest.mark.full
def test_preset_cost_sh_smallest_run(tmp_path):
    out = run(["bash", "benchmarks/preset_cost.sh", tmp_path], SEEDS="1", STEPS="3", ROLLOUT="hf", timeout=1800)
    (row,) = [line for line in out.splitlines() if line.startswith("| 1 |")]
    cells = row.strip("| ").split(" | ")
    decoupled, equal_update, preset = (float(c) for c in cells[1:4])
    assert all(0 < step < 600 for step in (decoupled, equal_update, preset)), row
    # a 3-step run's step times are one noisy sample each, so the ratios are checked against the cells, not a range
    for cell, ratio in zip(cells[4:6], (preset / decoupled, preset / equal_update)):
        assert float(cell.rstrip("x")) == pytest.approx(ratio, rel=0.03, abs=0.01), row
    assert 0 < float(cells[6]) <= 16, row  # groups the preset trained in a step of 16


@pytest.mark.full
def test_cpu_trainers_sh_smallest_run(tmp_path):
    # 6 steps: the fully-async config check refuses a run no longer than replay's 5 warm-up steps
    out = run(["bash", "benchmarks/cpu_trainers.sh", tmp_path], STEPS="6", ROLLOUT="hf", timeout=1800)
    for kind in ("one_step_off", "fully_async"):
        (row,) = [line for line in out.splitlines() if line.startswith(f"| {kind} |")]
        cells = row.strip("| ").split(" | ")
        assert 0 < float(cells[1]) < 600 and float(cells[3]) >= 1, row  # step s; staleness counts versions
        assert re.fullmatch(r"(\d+: [01]\.\d{3}(, )?)+", cells[4]), row  # validation accuracies by step


# ------------------------------------------------------------------------------------------ the staleness study


@pytest.mark.parametrize("study", ["stress", "scarce"])
def test_run_study_report_of_an_archive(study, tmp_path):
    """`run_study --report-only --results ARCHIVE` (how docs/evidence/before_protocol.md says to print a study's full
    table): one row per (s, method) in the raw runs, each with the seed count and the final accuracy's mean ± std
    computed here from the raw lines, and the figures."""
    archive = EVIDENCE / study / "results.jsonl.gz"
    python("-m", "benchmarks.staleness.run_study", "--report-only", "--results", archive, "--out", tmp_path)
    with gzip.open(archive, "rt") as f:
        runs = [json.loads(line) for line in f if line.strip()]
    cells: dict[tuple[int, str], list[float]] = {}
    for r in runs:
        cells.setdefault((r["staleness"], r["method_name"]), []).append(r["final_accuracy"])
    rows = {(int(c[0].strip("| ")), c[1]): c for c in (line.split(" | ") for line in (tmp_path / "summary.md").read_text()
                                           .splitlines() if re.match(r"\| \d+ \| ", line)) if len(c) == 8}
    assert set(rows) == set(cells)
    for key, finals in cells.items():
        mean = sum(finals) / len(finals)
        std = (sum((v - mean) ** 2 for v in finals) / (len(finals) - 1)) ** 0.5 if len(finals) > 1 else 0.0
        assert rows[key][2] == str(len(finals)) and rows[key][4] == f"{mean:.3f} ± {std:.3f}", (key, rows[key])
    stalenesses = {s for s, _ in cells}
    assert {f"accuracy_vs_samples_s{s}.png" for s in stalenesses if s} <= {p.name for p in tmp_path.glob("*.png")}
    assert all(is_png(p) for p in tmp_path.glob("*.png"))


def test_protocol_choose_headline_and_pipeline_give_evidence_md(tmp_path):
    """The three report commands docs/evidence.md gives, on the archived runs: each writes its block of
    docs/evidence.md, the held-out and pipeline ones with their figures beside it."""
    archive = EVIDENCE / "protocol" / "scarce"
    chosen = ["--preset", "darl_tokens_e2", "--alternative", "decoupled_prompt_e2"]
    python("-m", "benchmarks.staleness.protocol", "choose", archive / "dev", "--out", tmp_path / "choose.md")
    assert (tmp_path / "choose.md").read_text().strip() == block("evidence.md", "development")
    (tmp_path / "heldout").mkdir()
    python("-m", "benchmarks.staleness.protocol", "headline", archive / "heldout", *chosen,
           "--out", tmp_path / "heldout" / "headline.md")
    assert (tmp_path / "heldout" / "headline.md").read_text().strip() == block("evidence.md", "heldout")
    assert all(is_png(tmp_path / "heldout" / f"two_axes_s{s}.png") for s in (4, 8))
    (tmp_path / "pipeline").mkdir()
    python("-m", "benchmarks.staleness.protocol", "pipeline", archive / "pipeline" / "results.jsonl.gz", *chosen,
           "--out", tmp_path / "pipeline" / "pipeline.md")
    assert (tmp_path / "pipeline" / "pipeline.md").read_text().strip() == block("evidence.md", "pipeline")
    assert all(is_png(tmp_path / "pipeline" / f"two_axes_{t}.png") for t in ("one_step_off", "fully_async"))


def test_validation_check_and_report(tmp_path):
    """`validation --check` passes on the archived testbed and fails on one learning rate alone (where staleness
    has too few seeds to show); the report is docs/evidence.md's validation block."""
    root = EVIDENCE / "protocol" / "validation" / "scarce"
    assert "validated: staleness hurts" in python("-m", "benchmarks.staleness.validation", root, "--check")
    shutil.copytree(root / "lr0.0001", tmp_path / "one" / "lr0.0001")
    failed = subprocess.run([sys.executable, "-m", "benchmarks.staleness.validation", tmp_path / "one", "--check"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1 and "not validated" in failed.stdout
    python("-m", "benchmarks.staleness.validation", root, "--out", tmp_path / "validation.md")
    assert (tmp_path / "validation.md").read_text().strip() == block("evidence.md", "validation")


def test_pipeline_report_of_the_archive(tmp_path):
    """The pipeline study's report from its archive (the module docstring's 'again from the raw results'): per
    trainer, one row per configuration whose finals per seed are the last validation records read here from the raw
    lines, and every trainer's figures."""
    from benchmarks.staleness.pipeline_report import VAL_KEY

    src = EVIDENCE / "pipeline_scarce"
    python("-m", "benchmarks.staleness.pipeline_report", src / "results.jsonl.gz", "--out", tmp_path)
    with gzip.open(src / "results.jsonl.gz", "rt") as f:
        runs = [json.loads(line) for line in f]
    finals: dict[tuple[str, str], dict[int, float]] = {}
    for run in runs:
        evals = sorted((r["step"], r["data"][VAL_KEY]) for r in run["records"] if VAL_KEY in r["data"])
        finals.setdefault((run["trainer"], run["config"]), {})[run["seed"]] = evals[-1][1]
    text = (tmp_path / "summary.md").read_text()
    for trainer in {t for t, _ in finals}:
        section = text.split(f"## {trainer}\n")[1].split("\n## ")[0]
        rows = {c[0].strip("| `"): c for c in (line.split(" | ") for line in section.splitlines()
                                            if line.startswith("| `"))}
        assert set(rows) == {c for t, c in finals if t == trainer}
        for config, row in rows.items():
            per_seed = finals[trainer, config]
            assert row[2] == ", ".join(f"{per_seed[s]:.3f}" for s in sorted(per_seed)), (trainer, config)
        assert is_png(tmp_path / f"accuracy_vs_wall_{trainer}.png")
