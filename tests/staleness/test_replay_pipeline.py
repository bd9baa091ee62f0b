"""Section 5 through fully-async: the threshold it runs at (section 6's verdict, or the fallback), and its family of
two with Holm's correction, printed once every held-out seed has its launches."""

import pytest

from benchmarks.staleness import replay_pipeline as leg
from benchmarks.staleness import threshold_sweep as sweep
from benchmarks.staleness.protocol import REPLAY_CONFIGS, REPLAY_HELDOUT_SEEDS

ORIGIN = {"commit": "a" * 40, "dirty": False, "host": "h", "cpu": "c", "boot": "b", "date": "2026-01-01T00:00:00"}


def cell(config, t, seed, final):
    return {"seed": seed, "method_name": config, "staleness": t, "final_accuracy": final, "provenance": dict(ORIGIN)}


def sweep_runs(gain_at):
    """Section 6's held-out launches: decoupled PPO at 0.30, the preset gain_at[t] above it (+-1 point by seed)."""
    out = []
    for i, seed in enumerate(sweep.HELDOUT_SEEDS):
        for t in sweep.THRESHOLDS:
            out += [cell(sweep.BASELINE, t, seed, 0.30), cell(sweep.ALTERNATIVE, t, seed, 0.31),
                    cell(sweep.PRESET, t, seed, 0.30 + gain_at[t] + (0.01 if i % 2 else -0.01))]
    return out


def test_it_runs_from_the_smallest_supported_threshold_or_at_the_fallback():
    assert leg.threshold(sweep_runs({0.5: 0.0, 1: 0.1, 2: 0.1, 4: 0.2})) == 1
    assert leg.threshold(sweep_runs({0.5: 0.1, 1: 0.1, 2: 0.1, 4: -0.1})) == leg.FALLBACK == 4
    assert leg.threshold(sweep_runs({0.5: 0.1, 1: 0.1, 2: 0.1, 4: 0.1})[:-1]) is None  # section 6 not finished


def test_the_family_prints_once_every_seed_has_its_three_launches():
    """The preset 4 or 6 points (alternating) above replay off: +5.0, supported; per-prompt replay 1 point above or
    below it: +0.0, not separated."""
    preset, off, prompt_only = REPLAY_CONFIGS
    runs = []
    for i, seed in enumerate(REPLAY_HELDOUT_SEEDS):
        sign = 1 if i % 2 else -1
        runs += [cell(off, 2, seed, 0.3), cell(prompt_only, 2, seed, 0.3 + 0.01 * sign),
                 cell(preset, 2, seed, 0.35 + 0.01 * sign)]
    text = leg.report(runs)
    assert text.startswith("60 of 60 held-out seeds have their three launches (staleness_threshold 2).\n\n| threshold |")
    rows = [line for line in text.splitlines() if line.startswith("| 2 |")]
    assert [r.split(" | ")[1] for r in rows] == [f"{preset} - {off}", f"{prompt_only} - {off}"]
    assert "| +5.0 [" in rows[0] and rows[0].endswith("| supported |") and "| 60 (60) |" in rows[0]
    assert "| +0.0 [" in rows[1] and rows[1].endswith("| not separated |")
    assert leg.report(runs[:-1]) == "59 of 60 held-out seeds have their three launches; the table follows once all have them.\n"
    with pytest.raises(ValueError, match="one threshold per stage"):
        leg.report(runs + [cell(off, 4, REPLAY_HELDOUT_SEEDS[0], 0.3)])


def test_the_stage_waits_for_section_6(tmp_path, capsys):
    assert leg.main(["threshold", str(tmp_path)]) == 1
    assert "section 6 has not reported yet" in capsys.readouterr().err
