"""The built-in example: shipped warm-started weights (sha256), safe concurrent first use, the scarce split."""

import json
import multiprocessing as mp
import shutil
from pathlib import Path

import pytest

from recipe.darl.example import build
from recipe.darl.example.arithmetic import carries, is_hard
from recipe.darl.example.build import ExampleSettings, build_example, problem_splits, sha256, shipped_weights


def test_shipped_weights_match_their_recorded_sha256():
    folder = shipped_weights(ExampleSettings())
    assert folder is not None, "the default example's warm-started weights must ship with the package"
    meta = json.loads((folder / "example.json").read_text())
    assert set(meta["sha256"]) == set(build.model_files(folder))
    for name, digest in meta["sha256"].items():
        assert sha256(folder / name) == digest
    assert 0.0 < meta["warm_start"]["accuracy"] < 1.0
    assert shipped_weights(ExampleSettings(seed=1)) is None  # other settings are warm-started on first use


def _build(cache: str) -> str:
    return build_example(Path(cache), log=lambda _: None).model


def test_concurrent_first_uses_build_once_and_get_the_shipped_bytes(tmp_path):
    with mp.get_context("spawn").Pool(3) as pool:
        models = pool.map(_build, [str(tmp_path)] * 3)
    assert len(set(models)) == 1
    model = Path(models[0])
    folder = shipped_weights(ExampleSettings())
    assert sha256(model / "model.safetensors") == sha256(folder / "model.safetensors")
    root = model.parent
    for name in ("train.parquet", "val.parquet", "scarce_train.parquet", "scarce_val.parquet", "example.json",
                 "longtail_model/model.safetensors"):
        assert (root / name).exists()
    assert json.loads((root / "example.json").read_text())["weights"] == "shipped"
    # the trainers' scarce validation set is the controlled-staleness study's: one scale for both accuracies
    import pyarrow.parquet as pq

    from benchmarks.staleness.harness import HarnessConfig, split_problems

    rows = pq.read_table(root / "scarce_val.parquet").column("extra_info").to_pylist()
    assert [(r["a"], r["b"]) for r in rows] == split_problems(HarnessConfig(task="scarce", val_size=500))[1]
    # no private build directory left behind
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name] == []


def test_a_damaged_shipped_file_is_refused_by_name(tmp_path, monkeypatch):
    shipped = tmp_path / "weights"
    shutil.copytree(shipped_weights(ExampleSettings()), shipped / build._name(ExampleSettings()))
    target = shipped / build._name(ExampleSettings()) / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    monkeypatch.setattr(build, "SHIPPED", shipped)
    with pytest.raises(RuntimeError, match="model.safetensors: sha256"):
        build_example(tmp_path / "cache", log=lambda _: None)
    assert not (tmp_path / "cache" / build._name(ExampleSettings())).exists()  # nothing half-built is reused


def test_scarce_split_is_hard_fixed_and_disjoint():
    assert carries(187, 363) == 2 and carries(100, 100) == 0 and carries(999, 1) == 3
    assert is_hard(187, 363) and not is_hard(99, 999) and not is_hard(100, 200)
    splits = problem_splits(val_size=300)
    assert len(splits["scarce_train"]) == 256 and len(splits["scarce_val"]) == 300
    assert all(is_hard(*p) for p in splits["scarce_train"] + splits["scarce_val"])
    assert set(splits["scarce_train"]) <= set(splits["train"])
    used = set(splits["sft"]) | set(splits["train"]) | set(splits["val"])
    assert not set(splits["scarce_val"]) & used and not set(splits["heldout"]) & used
    assert problem_splits(val_size=300) == splits  # deterministic


def test_longtail_reward_is_the_share_of_digits():
    from recipe.darl.example.longtail import compute_score

    assert compute_score("darl/arithmetic", "a1b2", "3") == 0.5
    assert compute_score("darl/arithmetic", "", "3") == 0.0
