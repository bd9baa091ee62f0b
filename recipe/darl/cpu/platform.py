"""A verl platform plugin that runs verl 0.9.1's FSDP2 engines on CPU (device "cpu", gloo).

Active only with ``VERL_PLATFORM=cpu`` set before Ray starts (workers inherit it); otherwise importing it changes
nothing. The ``verl.plugins`` entry point loads it in every process that imports verl.

Stock verl 0.9.1 needs ten changes to run on CPU, cited by number in the code and tests. Done here when active:
1. ``PlatformCPU`` is registered as "cpu" (device "cpu", gloo, Ray resource CPU), so ``trainer.device=cpu`` is kept;
2. ``initialize_global_process_group_ray`` defaults to plain "gloo" (torch refuses verl's "cpu:gloo,cpu:gloo");
3. ``VERL_ENGINE_DEVICE=cuda``, so the FSDP engines (registered for cuda/npu only) are found;
6. the current device is the string "cpu", not an accelerator index;
7. the device module answers ``get_device_name()`` ("CPU") and the memory queries verl logs;
8. FSDP2's ``CPUOffloadPolicy`` never pins memory (pinning needs an accelerator).
Configuration, from ``cpu_overrides()``: 4. ``attn_implementation=sdpa``; 5. ``strategy=fsdp2`` (FSDP1 fails on
CPU); 9. no torch.compile (it adds ~20 s); 10. logical GPUs for Ray (verl's resource check counts only GPUs).
"""

from __future__ import annotations

import functools
import os
from contextlib import nullcontext
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

from recipe.darl.cpu import is_requested


def cpu_overrides(ray_gpus: int, ray_cpus: int = 16, fp32: bool = True) -> list[str]:
    """Hydra overrides of verl's trainer config for a CPU run (points 1, 4, 5, 9 and 10 of the module docstring).

    ray_gpus: logical GPUs for Ray, at least the trainer plus rollout processes (verl counts only GPUs before placing);
    ray_cpus: logical CPUs (the one-step-off task runner asks for 10); fp32: no bf16 mixed precision (slow on CPUs).
    """
    overrides = [
        "trainer.device=cpu",  # 1: kept as is by auto_set_device on this platform
        "++actor_rollout_ref.model.override_config.attn_implementation=sdpa",  # 4: flash_attention_2 by default
        "actor_rollout_ref.actor.strategy=fsdp2",  # 5: FSDP1 fails on CPU (sync_module_states); ref follows
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",  # 9: compiling costs ~20 s
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile=false",
    ]
    if not os.environ.get("RAY_ADDRESS"):  # 10; a job joining a running cluster (shells/run.sh) takes its resources
        overrides += [f"++ray_kwargs.ray_init.num_gpus={int(ray_gpus)}", f"++ray_kwargs.ray_init.num_cpus={int(ray_cpus)}"]
    if fp32:
        for role in ("actor", "ref"):
            overrides += [f"++actor_rollout_ref.{role}.fsdp_config.mixed_precision.{key}=fp32"
                          for key in ("param_dtype", "reduce_dtype", "buffer_dtype")]
    return overrides


def _returns(value: Any):
    """A method or function that ignores its arguments and answers `value` (what CPU has to say to verl)."""
    return lambda *args, **kwargs: value


class _CPUDeviceModule(ModuleType):
    """``torch.cpu`` plus the accelerator calls verl makes on ``get_torch_device()`` (name, memory, RNG, cache)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)  # is_available, device_count, current_device, set_device, synchronize

    get_device_name = _returns("CPU")  # the key of verl.utils.flops_counter._DEVICE_FLOPS for CPUs
    # the CUDA allocator's calls: nothing to do on CPU, and no accelerator memory in use
    empty_cache = ipc_collect = reset_peak_memory_stats = set_per_process_memory_fraction = _returns(None)
    memory_allocated = memory_reserved = max_memory_allocated = max_memory_reserved = _returns(0)

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total

    # the RNG: torch's CPU generator (verl passes no device argument)
    get_rng_state = staticmethod(torch.get_rng_state)
    set_rng_state = staticmethod(torch.set_rng_state)
    manual_seed = manual_seed_all = staticmethod(torch.manual_seed)


class PlatformCPU(PlatformBase):
    """verl platform for CPU: device "cpu", collective backend gloo, Ray resource CPU. verl's abstract methods that
    only answer a constant here are `_returns` of it."""

    device_name = vendor_name = "cpu"
    device_module = _CPUDeviceModule("verl_cpu_device_module", _CPUDeviceModule.__doc__)
    is_available = _returns(True)
    # an integer would mean "accelerator <n>" to torch (.to(0), torch.device(0))
    current_device = _returns("cpu")
    device_count = _returns(1)
    manual_seed = manual_seed_all = staticmethod(torch.manual_seed)
    # no device to select or wait for, no CUDA allocator settings (e.g. "expandable_segments:False") or cache,
    # no profiler, no CUDA runtime
    set_device = synchronize = set_allocator_settings = empty_cache = _returns(None)
    profiler_start = profiler_stop = cudart = _returns(None)
    get_device_capability = _returns((None, None))
    communication_backend_name = _returns("gloo")
    # nothing reads it on CPU; a name of its own so CUDA_VISIBLE_DEVICES is left alone
    visible_devices_envvar = _returns("VERL_CPU_VISIBLE_DEVICES")
    nvtx_range = _returns(nullcontext())
    ray_resource_name = _returns("CPU")
    ray_noset_envvars = staticmethod(list)  # none: Ray sets no visible-devices variable for CPUs
    is_ipc_supported = _returns(False)

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # only ever selected by name (VERL_PLATFORM=cpu), never by auto-detection
        return not use_smi_check

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        # Ray takes CPUs as num_cpus, not as a custom resource
        return {"num_cpus": num_gpus}


def activate() -> None:
    """Register the CPU platform and apply points 2, 3 and 8; run once, when this module is imported."""
    import verl.utils.distributed as distributed
    from torch.distributed.fsdp import CPUOffloadPolicy

    PlatformRegistry.register(platform="cpu")(PlatformCPU)
    # point 3: verl's own switch for engine lookup; the FSDP engines are registered for cuda/npu only
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")

    # point 2: an explicit backend is kept. Modules importing the function by name (engine_workers) load after
    # verl's plugins, so get this one.
    init_process_group = distributed.initialize_global_process_group_ray

    @functools.wraps(init_process_group)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return init_process_group(timeout_second=timeout_second, backend=backend or "gloo")

    initialize_global_process_group_ray._darl_cpu = True  # how a test tells a patched process
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray

    # point 8: verl hard-codes CPUOffloadPolicy(pin_memory=True) for forward-only FSDP2 engines, and no config key
    # turns it off
    offload_init = CPUOffloadPolicy.__init__

    @functools.wraps(offload_init)
    def __init__(self, pin_memory: bool = True, *args, **kwargs):
        offload_init(self, False, *args, **kwargs)

    CPUOffloadPolicy.__init__ = __init__


if is_requested():
    activate()
