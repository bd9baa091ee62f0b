"""The study's names: the archives renamed once by one mapping, and each live name meaning what it ran."""

import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from benchmarks.staleness.harness import HarnessConfig
from benchmarks.staleness.names import RENAMES, main, ran_source_weight, rename_run
from benchmarks.staleness.paired import paired, t975
from benchmarks.staleness.run_study import METHODS, load_results
from recipe.darl.core.config import PRESET, ReplayConfig

EVIDENCE = Path(__file__).resolve().parents[2] / "docs" / "evidence"


def test_rename_is_once_and_by_archive(tmp_path):
    runs = [{"method_name": "darl", "seed": 0}, {"method_name": "darl_prompt_zero", "seed": 0},
            {"method_name": "decoupled", "seed": 0}]
    folder = tmp_path / "scarce"
    folder.mkdir()
    (folder / "results.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in runs).encode()))
    main([str(tmp_path)])
    once = load_results(folder / "results.jsonl")
    assert [r["method_name"] for r in once] == ["darl_no_prompt", "darl", "decoupled"]
    assert [r.get("name_at_run") for r in once] == ["darl", "darl_prompt_zero", None]
    # a run of today's preset added to the renamed archive keeps its name when the mapping runs again
    later = once + [{"method_name": "darl", "seed": 1}]
    (folder / "results.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in later).encode()))
    main([str(tmp_path)])
    assert load_results(folder / "results.jsonl") == later
    assert rename_run({"config": "pmis_sg"}, RENAMES["pipeline_scarce"]) == {"config": "pmis_sg_no_prompt",
                                                                              "name_at_run": "pmis_sg"}


def _resolved(config: dict) -> dict:
    fields = {f.name for f in dataclasses.fields(HarnessConfig)}
    kept = {k: v for k, v in config.items() if k in fields and k not in ("model_dir", "label")}
    kept.pop("source_weight", None)  # only replay weighs its sources
    if config["method"] == "darl":
        kept["source_weight"] = ran_source_weight(config)
    rc = HarnessConfig(**kept).replay_config()
    keys = {f.name: rc.resolved(f.name) if f.name in PRESET else getattr(rc, f.name) for f in dataclasses.fields(rc)}
    return {**keys, "method": config["method"], "epochs": config.get("epochs", 1)}


@pytest.mark.parametrize("study", ["scarce", "benign_shipped", "stress_shipped"])
def test_every_archived_run_under_a_live_name_ran_that_configuration(study):
    """A run the study reports under one of its names (run_study.METHODS) ran exactly that name's configuration, as
    today's code resolves it: the renamed archives keep every figure's meaning."""
    runs = load_results(EVIDENCE / study / "results.jsonl")
    live = [r for r in runs if r["method_name"] in METHODS]
    assert {r["method_name"] for r in live} >= {"decoupled", "darl_no_prompt"}
    for r in live:
        want = {k: v for k, v in METHODS[r["method_name"]].items() if k != "staleness"}
        assert _resolved(r["config"]) == _resolved(dataclasses.asdict(HarnessConfig(**want))), \
            (study, r["method_name"], r["seed"])


def test_paired_interval_by_hand():
    """Six paired seeds, differences -6.6, +8.0, +16.0, +4.6, +14.6, +2.8 points: mean +6.567, sd 8.331,
    t_0.975,5 = 2.571, half-width 2.571 x 8.331 / sqrt 6 = 8.744."""
    a = {s: 0.5 + d / 100 for s, d in enumerate([-6.6, 8.0, 16.0, 4.6, 14.6, 2.8])}
    b = {s: 0.5 for s in range(6)}
    d = paired(a, b)
    assert d.n == 6 and d.above == 5
    assert 100 * d.mean == pytest.approx(6.567, abs=1e-3)
    assert 100 * d.low == pytest.approx(6.567 - 8.744, abs=0.005) and 100 * d.high == pytest.approx(6.567 + 8.744, abs=0.005)
    assert d.points() == "+6.6 [-2.2, +15.3], 5 of 6 above" and not d.supported
    assert t975(11) == 2.201 and t975(100) == 1.96
    with pytest.raises(ValueError):
        t975(0)


def test_a_null_source_weight_in_an_archive_reads_as_what_it_meant_then():
    """Before 2026-12-02 null meant ESS under pmis and tokens without; the harness now records the value it ran, so
    a record made today never holds null."""
    assert ran_source_weight({"method": "darl", "source_weight": None}) == "ess"
    assert ran_source_weight({"method": "darl", "pmis": False, "source_weight": None}) == "tokens"
    assert ran_source_weight({"method": "darl", "pmis": True, "source_weight": "tokens"}) == "tokens"
    assert dataclasses.asdict(HarnessConfig(**METHODS["darl_tokens_e2"]))["source_weight"] == "tokens"
    assert dataclasses.asdict(HarnessConfig(method="darl"))["source_weight"] == "tokens"
    scarce = [r for r in load_results(EVIDENCE / "scarce" / "results.jsonl") if r["method_name"] == "darl_no_prompt"]
    assert scarce and all(ran_source_weight(r["config"]) == "ess" for r in scarce)


def test_seeds_for_power_by_hand():
    """sd 8, effect 3, alpha 0.05, power 0.8: z = 1.95996 + 0.84162 = 2.80158; (2.80158 x 8 / 3)^2 = 55.814, plus
    1.95996^2 / 2 = 1.921: 57.73, so 58 seeds; 58 seeds detect 2.99 points; the clamp holds both ends."""
    from benchmarks.staleness.paired import detectable_effect, seeds_for_power

    assert seeds_for_power(8.0, 3.0, high=1000) == 58
    assert seeds_for_power(8.0, 3.0) == 58 and seeds_for_power(8.0, 1.0) == 60 and seeds_for_power(1.0, 10.0) == 12
    assert detectable_effect(8.0, 58) == pytest.approx(2.993, abs=1e-3)
    with pytest.raises(ValueError):
        seeds_for_power(8.0, 0.0)
