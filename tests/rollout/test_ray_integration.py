"""The hf rollout inside verl's own machinery, through Ray, on CPU (ray_sync_check.py in a fresh process).

verl's `LLMServerManager` (standalone mode, as the one-step-off trainer uses it) builds the hf replica,
its `CheckpointEngineWorker` (hf server adapter, ray_object_store checkpoint engine) and the server actor;
a real FSDP2 trainer worker (verl's `DetachActorWorker`) syncs its weights with verl's
`CheckpointEngineManager`; generation goes through verl's `LLMServerClient` and load balancer.

The registration travels as the ``verl.plugins`` entry point ``darl_rollout = recipe.darl.cpu.rollout``.
When the installed package does not declare it yet, the test declares exactly that entry point in a
throw-away distribution on PYTHONPATH, which every process of the run (Ray workers included) sees.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENTRY_POINT = "darl_rollout = recipe.darl.cpu.rollout"
TOL = 1e-5


def _plugin_env(tmp_path) -> dict[str, str]:
    if any(ep.value == "recipe.darl.cpu.rollout" for ep in entry_points(group="verl.plugins")):
        return {}
    dist = tmp_path / "site" / "darl_rollout_probe-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: darl-rollout-probe\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(f"[verl.plugins]\n{ENTRY_POINT}\n")
    path = os.pathsep.join(p for p in (str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


def test_standalone_rollout_and_weight_sync_through_verl(run_script, tiny_model_path, tmp_path):
    out = run_script(HERE / "ray_sync_check.py", tiny_model_path, timeout=900, **_plugin_env(tmp_path))

    # wiring: verl found the replica, the adapter and the checkpoint engine by their names
    assert out["replica_class"] == "HFReplica"
    assert out["worker_facts"] == {"adapter": "hf_rollout.hf_adapter.HFServerAdapter",
                                   "engine": "RayObjectStoreCheckpointEngine", "plugin_loaded": True,
                                   "has_server": True}
    assert out["server_addresses"][0].startswith("hf://")

    # load_format=dummy: random weights and no version until the first sync
    assert out["before_version"] is None and out["dummy_differs"]
    syncs = out["syncs"]
    for version in ("1", "2"):
        s = syncs[version]
        assert s["checksum_equal"], s
        # the rollout's log-probs equal the trainer's: a fixed sequence, greedy and sampled generations
        assert s["fixed_err"] < TOL and s["greedy_err"] < TOL and s["sampled_err"] < TOL, s
        # every response carries the synced version
        assert s["versions"] == [int(version)] * 4
        assert all(lo == hi == int(version) for lo, hi in s["min_max"])
        assert all(0 < n <= 8 for n in s["lengths"])  # response_length
        assert s["metrics"]["checkpoint_engine/tensors"] > 0
    assert syncs["1"]["rollout_fixed"] != syncs["2"]["rollout_fixed"]  # the trainer's change arrived

    # RolloutReplica's control calls reach the server; abort returns the partial response
    assert out["aborted"]["stop_reason"] == "aborted" and 0 < out["aborted"]["n"] < 4000
    assert out["aborted"]["n_log_probs"] == out["aborted"]["n"] and out["aborted"]["version"] == 2
    assert out["after_abort"] == {"stop_reason": "completed", "n": 8}
    assert out["server_stats"]["weight_updates"] == 2
