"""The test suite's CPU rollout backend: verl's standalone rollout path served by transformers (`rollout.name=hf`).

It exists for test time and memory on small CPU machines (docs/cpu.md, "The test suite's rollout backend"): it
starts in seconds where vLLM compiles its graphs. The product's CPU rollout is verl's vLLM. tests/conftest.py
puts this folder on PYTHONPATH and names this package in ``VERL_USE_EXTERNAL_MODULES``, so every process of a
test's job (driver, task runner, Ray workers) imports it with verl and registers it:

- ``RolloutReplicaRegistry.register("hf", ...)`` -> `hf_replica.HFReplica`, looked up by `LLMServerManager`;
- ``_ROLLOUT_REGISTRY[("hf", "async")]`` -> `hf_adapter.HFServerAdapter`, looked up by verl's
  `CheckpointEngineWorker` (standalone rollout workers) and `ActorRolloutRefWorker` (hybrid).

Pieces: `hf_engine` (sampling, KV-cached batched decoding; pure torch), `hf_server` (the Ray actor), `hf_replica`,
`hf_adapter`. The CPU scripts run it with ``ROLLOUT=hf``.
"""

from __future__ import annotations

ROLLOUT_NAME = "hf"
ADAPTER_FQN = "hf_rollout.hf_adapter.HFServerAdapter"


def _load_replica():
    from .hf_replica import HFReplica

    return HFReplica


def register() -> None:
    """Register the hf replica and server adapter with verl (idempotent)."""
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)
    _ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = ADAPTER_FQN


def _install() -> None:
    # the project's plugin first: the CPU platform must be registered before anything resolves verl's platform
    from recipe.darl.cpu.rollout import after_import

    after_import("verl.workers.rollout", register)


_install()
