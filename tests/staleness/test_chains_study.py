"""The second testbed's stages (protocol.md, section 7): constants fixed as written, the development choice over its
own seeds and candidates, the held-out family of six with Holm's correction, and the stage script's refusals."""

import json
import re
import subprocess
from pathlib import Path

import pytest

from benchmarks.staleness import chains_study as chains
from benchmarks.staleness.paired import holm, paired
from benchmarks.staleness.run_study import METHODS

REPO = Path(__file__).resolve().parents[2]
ORIGIN = {"commit": "a" * 40, "dirty": False, "host": "h1", "cpu": "c1", "boot": "b1", "date": "2026-01-01T00:00:00"}


def run(method, s, seed, final):
    return {"method_name": method, "staleness": 0 if method == "sync" else s, "seed": seed, "final_accuracy": final,
            "best_accuracy": final, "initial_accuracy": 0.2, "common": {"lr": 1e-4, "task": "chains"},
            "provenance": dict(ORIGIN)}


def test_the_constants_are_the_protocols():
    page = " ".join((REPO / "docs/evidence/protocol.md").read_text().split())
    section = page.split("## 7. Addendum: a second testbed")[1]
    assert " ".join(map(str, chains.HELDOUT_SEEDS)) in section
    assert "learning rates 3e-5, 1e-4 and 3e-4 over seeds 0-2" in section and chains.LRS == (3e-5, 1e-4, 3e-4)
    assert chains.SYNC_SEEDS == (0, 1, 2) and "sync over seeds 0-7" in section and chains.STALE_SEEDS == tuple(range(8))
    assert "seeds " + ", ".join(map(str, chains.DEV_SEEDS)) in section
    assert all(f"`{c}`" in section for c in chains.DEV_CONFIGS + chains.HELDOUT_BASELINES)
    assert all(c in METHODS for c in chains.DEV_CONFIGS + chains.HELDOUT_BASELINES)
    assert not set(chains.HELDOUT_SEEDS) & set(chains.DEV_SEEDS)
    assert all(100000 <= s <= 999999 for s in chains.HELDOUT_SEEDS) and len(chains.HELDOUT_SEEDS) >= 12
    assert all(10000 <= s <= 99999 for s in chains.DEV_SEEDS)


def test_development_chooses_by_the_mean_over_both_stalenesses():
    results = [run("sync", 0, x, 0.6) for x in chains.DEV_SEEDS]
    for i, name in enumerate(chains.DEV_CONFIGS[1:]):
        for s in (4, 8):
            results += [run(name, s, x, 0.30 + 0.01 * i + (0.02 if s == 8 else 0.0)) for x in chains.DEV_SEEDS]
    text = chains.development_report(results)
    assert text.startswith(f"{len(results)} of {len(results)} development runs.")
    # the last of each list scores highest: darl_e2 among D-ARL's, decoupled_prompt_e2 among the simple ones
    assert "preset: darl_e2" in text and "alternative: decoupled_prompt_e2" in text
    incomplete = [r for r in results if not (r["method_name"] == "darl_own_e2" and r["seed"] == chains.DEV_SEEDS[0])]
    assert "preset: not yet" in chains.development_report(incomplete)


def test_the_heldout_family_is_six_comparisons_with_holm_across_them():
    preset, alt = "darl_tokens_e2", "equal_update"
    finals = {"decoupled": 0.30, alt: 0.40, "replay_off_e2": 0.48, "sync": 0.50}
    results = []
    for k, seed in enumerate(chains.HELDOUT_SEEDS):
        wobble = 0.01 * (k % 3)
        for s in (4, 8):
            results.append(run(preset, s, seed, 0.50 + wobble))
            results += [run(b, s, seed, v + 0.02 * (k % 2)) for b, v in finals.items() if b != "sync"]
        results.append(run("sync", 0, seed, finals["sync"]))
    family, secondary = chains.heldout_family(results, preset, alt)
    assert [(r["s"], r["b"]) for r in family] == [(s, b) for b in ("decoupled", alt, "replay_off_e2") for s in (4, 8)]
    # by hand: each row's paired difference over the 12 seeds, Holm across the six
    raw = []
    for r in family:
        a = {x["seed"]: x["final_accuracy"] for x in results if x["method_name"] == preset and x["staleness"] == r["s"]}
        b = {x["seed"]: x["final_accuracy"] for x in results if x["method_name"] == r["b"] and x["staleness"] == r["s"]}
        diff = paired(a, b)
        assert r["diff"].mean == pytest.approx(diff.mean) and r["diff"].n == 12 and r["side_by_side"] == 12
        raw.append(diff.p)
    assert [r["p_holm"] for r in family] == pytest.approx(holm(raw))
    assert {r["verdict"] for r in family[:4]} == {"supported"}
    assert [(r["s"], r["b"]) for r in secondary] == [(4, "sync"), (8, "sync")]
    from benchmarks.staleness.protocol import headline_table

    table = headline_table(family, secondary)
    assert table.count("| supported |") == sum(r["verdict"] == "supported" for r in family)
    assert table.count("(secondary)") == 2
    for r in results:  # what the secondary figures read: a step time and two evaluations
        r.update(step_time_mean=1.0, steps=[{"step": i, "updates": 1} for i in range(50)],
                 evals=[{"step": 0, "samples": 0, "wall": 0.0, "accuracy": 0.2},
                        {"step": 50, "samples": 800, "wall": 50.0, "accuracy": r["final_accuracy"]}])
    assert chains.heldout_report(results, preset, alt).startswith(f"12 of 12 held-out seeds have their 9 runs.\n\n{table}")
    assert chains.heldout_report(results[:-1], preset, alt) == (  # the last seed lacks its sync run: a count, no table
        "11 of 12 held-out seeds have their 9 runs; the table follows once all have them.\n")


def test_the_stage_script_refuses_an_unknown_stage_and_a_dirty_heldout(tmp_path):
    script = REPO / "benchmarks/staleness/chains.sh"
    out = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    text = script.read_text()
    assert re.search(r'\[\[ "\$STAGE" == heldout \]\] && \[\[ -n "\$\(git status --porcelain', text)
    consts = subprocess.run([sys_python(), "-c", "from benchmarks.staleness import chains_study as c; "
                             "print(' '.join(map(format, c.LRS)))"], capture_output=True, text=True, cwd=REPO)
    assert consts.stdout.split() == ["3e-05", "0.0001", "0.0003"]


def sys_python() -> str:
    import sys

    return sys.executable


def test_cli_prints_the_development_report(tmp_path):
    study = tmp_path / "dev"
    study.mkdir()
    (study / "results.jsonl").write_text("".join(json.dumps(run("decoupled", 4, x, 0.3)) + "\n"
                                                 for x in chains.DEV_SEEDS))
    out = subprocess.run([sys_python(), "-m", "benchmarks.staleness.chains_study", "dev", study, "--out",
                          tmp_path / "choice.md"], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert out.startswith("4 of ") and "preset: not yet" in (tmp_path / "choice.md").read_text()
