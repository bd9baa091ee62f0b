"""The pipeline study's report (benchmarks/staleness/pipeline_report.py) on hand-made verl logs, and the
argument checks of pipeline_check.sh (they fail before anything starts)."""

import gzip
import json
import os
import subprocess
from pathlib import Path

import pytest

from benchmarks.staleness.pipeline_report import archive, load_runs, main, merge_runs, report
from recipe.darl.example.arithmetic import VAL_KEY

ROOT = Path(__file__).resolve().parents[2]

# final accuracies per (config, seed); evaluations at steps 0, 10, 20
CURVES = {
    ("decoupled", 0): [0.2, 0.3, 0.40], ("decoupled", 1): [0.2, 0.25, 0.30],
    ("gates_only", 0): [0.2, 0.35, 0.45], ("gates_only", 1): [0.2, 0.30, 0.30],
    ("pmis_sg", 0): [0.2, 0.42, 0.50], ("pmis_sg", 1): [0.2, 0.31, 0.36],
}


def _write_runs(root: Path, curves: dict = CURVES) -> None:
    for (cfg, seed), accs in curves.items():
        d = root / "one_step_off" / f"seed{seed}" / cfg
        d.mkdir(parents=True)
        lines = []
        for step in range(0, 21):
            data = {"training/global_step": step, "replay/buffer_groups/s3": 1.0, "other/key": 5.0}
            if step:
                # the preset steps take 2 s, the others 1 s (so the step-time ratio is 2.00x)
                data["timing_s/step"] = 2.0 if cfg == "pmis_sg" else 1.0
            if step % 10 == 0:
                data[VAL_KEY] = accs[step // 10]
            lines.append(json.dumps({"step": step, "data": data}, separators=(",", ":")))
        (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_report_by_hand(tmp_path):
    _write_runs(tmp_path / "runs")
    runs = load_runs(tmp_path / "runs")
    assert len(runs) == 6
    # the archive keeps the study's keys and drops per-version and unrelated ones
    kept = runs[0]["records"][10]["data"]
    assert VAL_KEY in kept and "timing_s/step" in kept and "training/global_step" in kept
    assert "replay/buffer_groups/s3" not in kept and "other/key" not in kept

    text = report(runs, tmp_path / "out", samples_per_step=100)
    row = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
           for line in text.splitlines() if line.startswith("| `")}
    # finals, mean ± std: pmis_sg 0.50, 0.36 -> 0.430 ± 0.099
    assert row["`pmis_sg`"][2] == "0.500, 0.360" and row["`pmis_sg`"][3] == "0.430 ± 0.099"
    # paired minus decoupled: +10, +6 points -> mean +8.0, s.e. = stdev(10, 6) / sqrt 2 = 2.0, x 12.706: [-17.4, +33.4]
    assert row["`pmis_sg`"][6] == "+8.0 [-17.4, +33.4] (+10.0, +6.0; 0 of 2 side by side)"  # no launch records
    # minus gates_only: +5, +6 -> +5.5, s.e. 0.5, t_0.975,1 = 12.706: [-0.9, +11.9]
    assert row["`pmis_sg`"][7] == "+5.5 [-0.9, +11.9] (+5.0, +6.0; 0 of 2 side by side)"
    # samples to the same seed's decoupled final (0.40 at step 20; 0.30 at step 20) over decoupled's 2,000:
    # pmis_sg seed 0 reaches 0.40 at step 10 (0.50x), seed 1 reaches 0.30 at step 10 (0.50x);
    # gates_only seed 0 first >= 0.40 at step 20 (1.00x), seed 1 at step 10 (0.50x)
    assert row["`pmis_sg`"][8] == "0.50x, 0.50x"
    assert row["`gates_only`"][8] == "1.00x, 0.50x"
    assert row["`pmis_sg`"][9] == "2.00 / 2.00x" and row["`decoupled`"][9] == "1.00 / 1.00x"
    assert (tmp_path / "out" / "summary.md").read_text().strip() == text.strip()
    # one seed in common: the difference without a spread (seed 1's gates_only left out)
    one = report([r for r in runs if (r["config"], r["seed"]) != ("gates_only", 1)], tmp_path / "one", 100)
    line = next(x for x in one.splitlines() if x.startswith("| `gates_only`"))
    assert "+5.0 (1 seed)" in line and "nan" not in one
    assert (tmp_path / "out" / "accuracy_vs_samples_one_step_off.png").stat().st_size > 0
    assert (tmp_path / "out" / "accuracy_vs_wall_one_step_off.png").stat().st_size > 0


def test_no_samples_figure_where_decoupled_ends_at_its_start(tmp_path):
    # seed 1's decoupled run ends at 0.20, its start: every run "reaches" that at step 0, so that seed reads n/a
    _write_runs(tmp_path / "runs", {**CURVES, ("decoupled", 1): [0.2, 0.25, 0.20]})
    text = report(load_runs(tmp_path / "runs"), tmp_path / "out", samples_per_step=100)
    row = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
           for line in text.splitlines() if line.startswith("| `")}
    assert row["`pmis_sg`"][8] == "0.50x, n/a" and row["`gates_only`"][8] == "1.00x, n/a"


def test_pairs_count_as_side_by_side_only_from_one_clean_commit_on_one_host(tmp_path):
    """Each run's checkpoints/launches.jsonl (what the entry points append, run_records.record_launch): the preset
    and decoupled PPO ran from one commit on one host; gates_only's seed 1 elsewhere, and seed 0 resumed on
    another commit; the archive keeps the launches and the resolved config."""
    _write_runs(tmp_path / "runs")
    here = {"commit": "a" * 40, "dirty": False, "host": "node1"}
    launches = {("gates_only", 1): [{**here, "host": "node2"}], ("gates_only", 0): [here, {**here, "commit": "b" * 40}]}
    for (cfg, seed) in CURVES:
        folder = tmp_path / "runs" / "one_step_off" / f"seed{seed}" / cfg / "checkpoints"
        folder.mkdir()
        folder.joinpath("launches.jsonl").write_text("".join(
            json.dumps({"provenance": p, "versions": {"verl": "0.9.1"}, "config": _config(seed, 16)}) + "\n"
            for p in launches.get((cfg, seed), [here])))
    runs = load_runs(tmp_path / "runs")
    text = report(runs, tmp_path / "out", samples_per_step=100)
    row = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
           for line in text.splitlines() if line.startswith("| `")}
    assert row["`pmis_sg`"][6].endswith("; 2 of 2 side by side)")
    assert row["`pmis_sg`"][7].endswith("; 0 of 2 side by side)")
    archive(runs, tmp_path / "ev")
    kept = [json.loads(x) for x in gzip.decompress((tmp_path / "ev" / "results.jsonl.gz").read_bytes()).splitlines()]
    assert all(r["launches"][0]["versions"] == {"verl": "0.9.1"} and r["resolved_config"] == _config(r["seed"], 16)
               for r in kept)
    # each archived run says where it started: the first launch's commit and host
    assert {(r["config"], r["seed"]): r["provenance"]["host"] for r in kept}[("gates_only", 1)] == "node2"
    assert all(r["provenance"]["commit"] == "a" * 40 for r in kept)


def _config(seed: int, prompts: int, mini: int = 8, require: int = 2) -> dict:
    """The keys of a resolved config that give a step's samples (fully-async's data.train_batch_size is 0)."""
    return {"seed": seed, "data": {"train_batch_size": prompts}, "async_training": {"require_batches": require},
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": mini}, "rollout": {"n": 8}}}


def test_samples_a_step_come_from_each_runs_config(tmp_path):
    """One-step-off: prompts x group size; fully-async (train_batch_size 0): require_batches mini-batches a step;
    a run without a launch record: the default. The samples axis and the header follow."""
    from benchmarks.staleness.pipeline_report import as_result, samples_per_step

    assert samples_per_step({"resolved_config": _config(0, 32)}, 128) == 256
    assert samples_per_step({"resolved_config": _config(0, 0, mini=16, require=2)}, 128) == 256
    assert samples_per_step({"resolved_config": _config(0, 0, mini=8, require=2)}, 999) == 128
    assert samples_per_step({}, 100) == 100
    _write_runs(tmp_path / "runs")
    runs = load_runs(tmp_path / "runs")
    for run in runs:
        if run["config"] != "decoupled":
            run["resolved_config"] = _config(run["seed"], 32)
    by = {(r["config"], r["seed"]): as_result(r, 100) for r in runs}
    assert by[("pmis_sg", 0)]["evals"][-1]["samples"] == 20 * 256
    assert by[("decoupled", 0)]["evals"][-1]["samples"] == 20 * 100
    assert "; 100/256 generated samples a step;" in report(runs, tmp_path / "out", 100)


def test_a_run_still_going_is_left_out_and_named(tmp_path):
    _write_runs(tmp_path / "runs")
    d = tmp_path / "runs" / "one_step_off" / "seed0" / "async"
    d.mkdir()
    (d / "metrics.jsonl").write_text(json.dumps({"step": 0, "data": {VAL_KEY: 0.2}}) + "\n")
    text = report(load_runs(tmp_path / "runs"), tmp_path / "out")
    assert "(step 20). Not finished, left out: one_step_off/async/seed 0." in text
    assert "`async`" not in text and "`pmis_sg`" in text


def test_archive_round_trip_and_cli(tmp_path):
    _write_runs(tmp_path / "runs")
    assert main([str(tmp_path / "runs"), "--archive", str(tmp_path / "ev")]) == 0
    path = tmp_path / "ev" / "results.jsonl.gz"
    first = path.read_bytes()
    assert len(gzip.decompress(first).decode().splitlines()) == 6
    # the same runs archive to the same bytes (no timestamp in the gzip header)
    archive(load_runs(tmp_path / "runs"), tmp_path / "ev")
    assert path.read_bytes() == first
    # the archive holds runs, never their report; the report from the archive is the report from the run folder
    assert not (tmp_path / "ev" / "summary.md").exists()
    from_runs = (tmp_path / "runs" / "summary.md").read_text()
    assert main([str(path), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "summary.md").read_text() == from_runs
    with pytest.raises(FileNotFoundError, match="no TRAINER/seedS/CONFIG"):
        load_runs(tmp_path / "empty-dir-that-is-not-there")


def test_sources_merge_and_a_later_run_replaces_an_earlier(tmp_path):
    _write_runs(tmp_path / "runs")
    assert main([str(tmp_path / "runs"), "--archive", str(tmp_path / "ev")]) == 0
    # a later study: a new config (sync, seed 0) and a rerun of decoupled seed 1 that ends at 0.20 instead of 0.30
    later = tmp_path / "later" / "one_step_off"
    for cfg, seed, final in (("sync", 0, 0.33), ("decoupled", 1, 0.20)):
        d = later / f"seed{seed}" / cfg
        d.mkdir(parents=True)
        d.joinpath("metrics.jsonl").write_text("".join(
            json.dumps({"step": s, "data": {VAL_KEY: a, "timing_s/step": 1.0}}) + "\n"
            for s, a in ((0, 0.2), (10, 0.25), (20, final))))
    merged = merge_runs([tmp_path / "ev" / "results.jsonl.gz", tmp_path / "later"])
    assert len(merged) == 7
    by_key = {(r["config"], r["seed"]): r for r in merged}
    assert by_key[("decoupled", 1)]["records"][-1]["data"][VAL_KEY] == 0.20
    assert main([str(tmp_path / "ev" / "results.jsonl.gz"), str(tmp_path / "later"),
                 "--archive", str(tmp_path / "ev2"), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "summary.md").read_text()
    # decoupled's finals are now 0.40, 0.20; pmis_sg minus decoupled: +10, +16 -> +13.0, s.e. 3.0: [-25.1, +51.1]
    assert "| `decoupled` | decoupled PPO | 0.400, 0.200 |" in text
    assert "+13.0 [-25.1, +51.1] (+10.0, +16.0; 0 of 2 side by side)" in text
    assert "| `sync` | sync (decoupled, staleness 0) | 0.330 |" in text


def test_restore_writes_archived_runs_back_as_run_folders_that_count_as_done(tmp_path):
    _write_runs(tmp_path / "runs")
    launch = {"provenance": {"commit": "a" * 40, "dirty": False, "host": "h", "cpu": "c", "boot": "b"},
              "versions": {"verl": "0.9.1"}, "config": {**_config(0, 16), "trainer": {"total_training_steps": 20}}}
    ckpt = tmp_path / "runs" / "one_step_off" / "seed0" / "decoupled" / "checkpoints"
    ckpt.mkdir()
    (ckpt / "launches.jsonl").write_text(json.dumps(launch) + "\n")
    assert main([str(tmp_path / "runs"), "--archive", str(tmp_path / "ev")]) == 0
    packed = tmp_path / "ev" / "results.jsonl.gz"
    # a new machine that already finished one run of its own: that one is kept, the other five come back
    mine = tmp_path / "new" / "one_step_off" / "seed1" / "pmis_sg"
    mine.mkdir(parents=True)
    (mine / "metrics.jsonl").write_text(json.dumps({"step": 20, "data": {VAL_KEY: 0.9}}) + "\n")
    assert main([str(packed), "--restore", str(tmp_path / "new")]) == 0
    back = {(r["config"], r["seed"]): r for r in load_runs(tmp_path / "new")}
    archived = {(r["config"], r["seed"]): r for r in load_runs(packed)}
    assert back.keys() == archived.keys() and back[("pmis_sg", 1)]["records"] == [{"step": 20, "data": {VAL_KEY: 0.9}}]
    for key in archived.keys() - {("pmis_sg", 1)}:
        assert back[key] == archived[key], key  # records, launches and resolved config as archived
    assert back[("decoupled", 0)]["launches"][0]["provenance"]["boot"] == "b"
    # pipeline_check.sh's test for a finished run (its last step logged) holds for a restored one
    assert '"step": 20' in (tmp_path / "new" / "one_step_off" / "seed0" / "decoupled" / "metrics.jsonl").read_text()


def test_every_row_is_compared_with_the_configurations_asked(tmp_path):
    _write_runs(tmp_path / "runs")
    text = report(load_runs(tmp_path / "runs"), tmp_path / "out", 100, versus=("decoupled", "pmis_sg", "sync"))
    assert "| minus decoupled, points (paired, [95% interval]) | minus pmis_sg | minus sync |" in text
    row = next(x for x in text.splitlines() if x.startswith("| `gates_only`"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    # gates_only minus pmis_sg: -5, -6 -> -5.5 [-11.9, +0.9]; no sync runs: no difference
    assert cells[7] == "-5.5 [-11.9, +0.9] (-5.0, -6.0; 0 of 2 side by side)" and cells[8] == "-"
    assert text.count("|---|---|---|---|---|---|---|---|---|---|---|") == 1  # 11 columns


@pytest.mark.parametrize("env,message", [
    ({"CONFIGS": "decoupld"}, "unknown config 'decoupld' in CONFIGS"),
    ({"TRAINERS": "one_step"}, "unknown trainer 'one_step' in TRAINERS"),
])
def test_pipeline_check_rejects_unknown_names(tmp_path, env, message):
    result = subprocess.run(["bash", str(ROOT / "benchmarks/staleness/pipeline_check.sh"), str(tmp_path / "out")],
                            env={**os.environ, **env, "SEEDS": "0"}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr


def test_pipeline_headline_by_hand(tmp_path):
    """The preset minus decoupled over seeds 0-1: +10 and +6 points -> +8.0, s.e. 2.0, x t_0.975,1 = 12.706:
    [-17.4, +33.4], both seeds above; within noise, so the target reads 'no'."""
    from benchmarks.staleness.targets import pipeline_headline, pipeline_table

    _write_runs(tmp_path / "runs")
    rows = {r["baseline"]: r for r in pipeline_headline(load_runs(tmp_path / "runs"), samples_per_step=100)}
    assert set(rows) == {"decoupled", "gates_only"}  # baselines that did not run are left out
    assert rows["decoupled"]["diff"].points() == "+8.0 [-17.4, +33.4], 2 of 2 above"
    assert rows["decoupled"]["verdict"] == "within noise" and rows["decoupled"]["preset"] == "0.430 ± 0.099"
    assert "| one_step_off | decoupled | 2 | 0.430 ± 0.099 | 0.350 ± 0.071 |" in pipeline_table(list(rows.values()))
