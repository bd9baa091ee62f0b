"""The ray_object_store checkpoint engine (recipe/darl/cpu/checkpoint_engine_ray.py).

The transfer runs over plain Ray actors in a fresh process (ce_check.py): verl's protocol by hand, many
small buckets, odd dtypes and shapes, two trainer ranks, two receivers, flow control, a timeout.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_registered_and_topology():
    from verl.checkpoint_engine import CheckpointEngineRegistry

    from recipe.darl.cpu.checkpoint_engine_ray import BACKEND, RayObjectStoreCheckpointEngine

    assert BACKEND == "ray_object_store"
    assert CheckpointEngineRegistry.get(BACKEND) is RayObjectStoreCheckpointEngine
    metadata = [{"channel": "CH", "sync_id": "S"}, {}, {}, {}, {}]
    actor, rollout = RayObjectStoreCheckpointEngine.build_topology(2, 3, metadata)
    assert actor == {"rank": [0, -1], "world_size": [4, 4], "channel": ["CH"] * 2, "sync_id": ["S"] * 2}
    assert rollout == {"rank": [1, 2, 3], "world_size": [4] * 3, "channel": ["CH"] * 3, "sync_id": ["S"] * 3}


def test_transfer_is_exact(run_script):
    out = run_script(HERE / "ce_check.py", timeout=300)
    for sync in out["syncs"]:
        assert sync["exact"] and sync["order"], sync
        assert sync["actor_ranks"] == [0, -1] and sync["rollout_ranks"] == [1, 2]
        assert sync["metrics"]["checkpoint_engine/tensors"] == 7
        assert sync["metrics"]["checkpoint_engine/buckets"] >= 3  # 4 KB buckets
        assert sync["rank1_metrics"] == {}  # the non-master trainer rank sends nothing
    assert out["timeout"] == "TimeoutError" and out["timeout_seconds"] < 30
    # one bucket (1 MB) for both receivers: receiver 1 took and acknowledged it, receiver 2 never asked
    assert out["taker_names"] == out["names"]
    assert "waited 1.0 s for every receiver to acknowledge bucket 0 of 1 posted" in out["stalled"], out["stalled"]
    assert "receiver 1: fetched up to 0, acknowledged up to 0; receiver 2: fetched up to -1, acknowledged up to -1" \
        in out["stalled"], out["stalled"]


def test_imports_go_one_way():
    """The rollout package imports the engine's module (to register it); the engine's module must not import
    the rollout package back (a cycle the layout once had). Read from the source: verl's plugin entry point
    imports both packages in every process, so sys.modules cannot tell."""
    import ast

    import recipe.darl.cpu.checkpoint_engine_ray as engine

    names = set()
    for node in ast.walk(ast.parse(Path(engine.__file__).read_text())):
        if isinstance(node, ast.ImportFrom):
            names |= {f"{node.module}.{a.name}" if node.module else a.name for a in node.names}
            names.add(node.module or "")
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    back = [n for n in names if n.startswith(("recipe.darl.cpu.rollout", "rollout.")) or n == "rollout"]
    assert not back, back
    rollout_source = (Path(engine.__file__).parent / "rollout" / "__init__.py").read_text()
    assert "checkpoint_engine_ray" in rollout_source  # the one direction that remains
