"""The staleness-threshold sweep (protocol.md, section 6): its family, where the preset pays, the development block's
power, and its archives read back from the pipeline stage's real runs."""

import json
import math
from pathlib import Path

import pytest

from benchmarks.staleness import pipeline_report, threshold_sweep as sweep
from benchmarks.staleness.paired import seeds_for_power

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "docs/evidence/protocol/scarce/pipeline/results.jsonl.gz"
ORIGIN = {"commit": "a" * 40, "dirty": False, "host": "h", "cpu": "c", "boot": "b", "date": "2026-01-01T00:00:00"}


def cell(config, t, seed, final):
    return {"seed": seed, "method_name": config, "staleness": t, "final_accuracy": final, "provenance": dict(ORIGIN)}


def sweep_runs(gain_at, seeds=range(8)):
    """Decoupled PPO at 0.30 + a seed's wobble; the preset `gain_at[t]` above it (+-0.01 by seed parity)."""
    out = []
    for t in sweep.THRESHOLDS:
        for s in seeds:
            base = 0.30 + 0.01 * (s % 3)
            out += [cell(sweep.BASELINE, t, s, base), cell(sweep.ALTERNATIVE, t, s, base + 0.005),
                    cell(sweep.PRESET, t, s, base + gain_at[t] + (0.01 if s % 2 else -0.01))]
    return out


def test_the_preset_pays_from_the_smallest_threshold_supported_at_every_larger_one():
    rows, secondary = sweep.family(sweep_runs({0.5: 0.0, 1: 0.1, 2: 0.1, 4: 0.2}), range(8))
    by_t = {r["threshold"]: r for r in rows}
    assert by_t[0.5]["verdict"] == "not separated" and by_t[1]["verdict"] == "supported"
    assert math.isclose(by_t[4]["diff"].mean, 0.2) and by_t[4]["diff"].n == 8 and by_t[4]["side_by_side"] == 8
    assert sweep.pays_from(rows) == 1
    assert [r["b"] for r in secondary] == [sweep.ALTERNATIVE] * 4
    # a gap in the middle: the preset pays only from above it
    rows, _ = sweep.family(sweep_runs({0.5: 0.2, 1: 0.0, 2: 0.2, 4: 0.2}), range(8))
    assert sweep.pays_from(rows) == 2
    rows, _ = sweep.family(sweep_runs({0.5: 0.2, 1: 0.2, 2: 0.2, 4: -0.2}), range(8))
    loses = sweep_runs({0.5: 0.2, 1: 0.2, 2: 0.2, 4: -0.2})
    assert sweep.pays_from(rows) is None and "not supported at the largest" in sweep.report(loses, range(8))
    assert sweep.report(loses, range(8)).startswith("8 of 8 held-out seeds have their 12 launches.\n\n| threshold |")
    # a seed without its last launch: a count, no table (the family is read once, whole)
    assert sweep.report(loses[:-1], range(8)) == "7 of 8 held-out seeds have their 12 launches; the table follows once all have them.\n"


def test_holm_adjusts_across_the_four_thresholds():
    rows, _ = sweep.family(sweep_runs({0.5: 0.05, 1: 0.1, 2: 0.1, 4: 0.2}), range(8))
    ps = sorted(r["diff"].p for r in rows)
    assert min(r["p_holm"] for r in rows) == min(1.0, 4 * ps[0])  # the smallest p is multiplied by the family's size


def test_the_development_block_asks_for_seeds_by_the_largest_sd():
    runs = []
    for t, spread in zip(sweep.DEV_THRESHOLDS, (0.02, 0.08, 0.04)):
        for i, s in enumerate(sweep.DEV_SEEDS):
            runs += [cell(sweep.BASELINE, t, s, 0.3), cell(sweep.PRESET, t, s, 0.3 + (spread if i else -spread))]
    text = sweep.power(runs)
    sd = math.sqrt(2) * 0.08  # two differences, +-0.08: their sample sd
    assert f"largest sd {100 * sd:.1f} points" in text
    assert f"held-out seeds {seeds_for_power(sd, 0.03, low=sweep.MIN_SEEDS, high=sweep.MAX_SEEDS)}" in text
    assert "held-out seeds 12" in text  # the cap binds at this spread
    assert "not yet" in sweep.power(runs[:-1])


def test_archived_runs_round_trip_through_a_stage_folder(tmp_path):
    runs = [r for r in pipeline_report.load_runs(PIPELINE) if r["trainer"] == "fully_async" and r["config"] != "sync"
            and r["seed"] in (1344, 1808)]
    assert len(runs) == 6 and all(r["resolved_config"]["async_training"]["staleness_threshold"] == 4 for r in runs)
    pipeline_report.archive(runs, tmp_path / "archive" / "t4")
    stage = tmp_path / "stage"
    assert sweep.restore(tmp_path / "archive", stage) == 6 and sweep.restore(tmp_path / "archive", stage) == 0
    got = sweep.results(stage)
    assert {(r["method_name"], r["seed"], r["staleness"]) for r in got} == {
        (c, s, 4) for c in sweep.CONFIGS for s in (1344, 1808)}
    finals = {(r["config"], r["seed"]): pipeline_report.as_result(r, 0)["final_accuracy"] for r in runs}
    assert all(math.isclose(r["final_accuracy"], finals[(r["method_name"], r["seed"])]) for r in got)
    again = sweep.archive(stage, tmp_path / "again")
    assert [p.read_bytes() for p in again] == [(tmp_path / "archive" / "t4" / "results.jsonl.gz").read_bytes()]
    # the launch attempts (pipeline_check.sh writes them) travel with the runs, failed and interrupted ones included
    from benchmarks.staleness import attempts

    log = stage / "t4" / attempts.NAME
    for event, seed in (("started", 1344), ("failed", 1344), ("started", 1344), ("finished", 1344), ("started", 1808)):
        attempts.record(log, event, trainer="fully_async", config="decoupled", seed=seed)
    assert attempts.summary(log) == (
        "attempts: 3 started, 1 finished, 1 failed, 1 interrupted or running; 1 run(s) started more than once")
    packed = sweep.archive(stage, tmp_path / "third")
    assert [p.name for p in packed] == ["attempts.jsonl.gz", "results.jsonl.gz"]
    fresh = tmp_path / "fresh"
    sweep.restore(tmp_path / "third", fresh)
    assert (fresh / "t4" / attempts.NAME).read_text() == log.read_text()


def test_pipeline_check_writes_a_json_line_per_launch_event(tmp_path):
    """pipeline_check.sh's `attempt` function, run as the script runs it: lines attempts.summary reads."""
    import subprocess

    from benchmarks.staleness import attempts

    script = (Path(__file__).resolve().parents[2] / "benchmarks/staleness/pipeline_check.sh").read_text()
    function = script[script.index("attempt() {"):script.index("\n}\n", script.index("attempt() {")) + 3]
    body = (f'OUT={tmp_path}; commit=abc; trainer=fully_async; cfg=darl_tokens_e2; seed=50549\n{function}'
            "attempt started; attempt failed; attempt started\n")
    subprocess.run(["bash", "-c", body], check=True)
    lines = [json.loads(line) for line in (tmp_path / attempts.NAME).read_text().splitlines()]
    assert [x["event"] for x in lines] == ["started", "failed", "started"]
    assert lines[0]["seed"] == 50549 and lines[0]["config"] == "darl_tokens_e2" and lines[0]["commit"] == "abc"
    assert attempts.summary(tmp_path / attempts.NAME).startswith("attempts: 2 started, 0 finished, 1 failed, 1 interrupted")


def test_the_heldout_seeds_are_the_protocols():
    """Section 6 lists the held-out seeds the stage runs: as many as the development block's power calculation asks
    (within the bounds), from 100000-999999, none a development seed."""
    page = " ".join((Path(__file__).resolve().parents[2] / "docs/evidence/protocol.md").read_text().split())
    section = page.split("## 6. Addendum")[1].split("## 7.")[0]
    assert " ".join(map(str, sweep.HELDOUT_SEEDS)) in section
    assert sweep.MIN_SEEDS <= len(sweep.HELDOUT_SEEDS) <= sweep.MAX_SEEDS
    assert all(100000 <= s <= 999999 for s in sweep.HELDOUT_SEEDS) and not set(sweep.HELDOUT_SEEDS) & set(sweep.DEV_SEEDS)
    archived = sweep.results(Path(__file__).resolve().parents[2] / "docs/evidence/protocol/scarce/threshold_dev")
    assert f"held-out seeds {len(sweep.HELDOUT_SEEDS)};" in sweep.power(archived)


def test_a_threshold_with_only_attempts_has_no_runs_yet(tmp_path):
    """An archive taken while a threshold's first launch ran holds its attempts but no runs: nothing to read there."""
    (tmp_path / "t2").mkdir()
    (tmp_path / "t2" / "attempts.jsonl.gz").write_bytes(b"")
    assert sweep.results(tmp_path) == []


def test_a_report_on_a_folder_without_threshold_folders_names_it(tmp_path, capsys):
    (tmp_path / "t3").mkdir()  # not a threshold of the sweep
    with pytest.raises(SystemExit) as stop:
        sweep.main(["report", str(tmp_path)])
    assert stop.value.code == 2
    assert f"{tmp_path} holds no threshold folder (t0.5, t1, t2, t4)" in capsys.readouterr().err
