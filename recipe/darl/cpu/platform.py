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

import logging
import os
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Optional

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

logger = logging.getLogger(__name__)

PLATFORM_NAME = "cpu"
ENV_VAR = "VERL_PLATFORM"


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


def is_requested() -> bool:
    """True when ``VERL_PLATFORM=cpu`` asks for this platform."""
    return os.environ.get(ENV_VAR, "").strip().lower() == PLATFORM_NAME


def _nothing(*args: Any, **kwargs: Any) -> None:
    """An accelerator call with nothing to do on CPU."""


class _CPUDeviceModule(ModuleType):
    """``torch.cpu`` plus the accelerator calls verl makes on ``get_torch_device()`` (name, memory, RNG, cache)."""

    def __init__(self):
        super().__init__("verl_cpu_device_module", doc=self.__class__.__doc__)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)  # is_available, device_count, current_device, set_device, synchronize

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "CPU"  # the key of verl.utils.flops_counter._DEVICE_FLOPS for CPUs

    # the CUDA allocator's calls: nothing to do on CPU, and no accelerator memory in use
    empty_cache = ipc_collect = reset_peak_memory_stats = set_per_process_memory_fraction = staticmethod(_nothing)
    memory_allocated = memory_reserved = max_memory_allocated = max_memory_reserved = staticmethod(lambda device=None: 0)

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total

    # the RNG: torch's CPU generator (verl passes no device argument)
    get_rng_state = staticmethod(torch.get_rng_state)
    set_rng_state = staticmethod(torch.set_rng_state)
    manual_seed = manual_seed_all = staticmethod(torch.manual_seed)


CPU_DEVICE_MODULE = _CPUDeviceModule()


class PlatformCPU(PlatformBase):
    """verl platform for CPU: device "cpu", collective backend gloo, Ray resource CPU."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # only ever selected by name (VERL_PLATFORM=cpu), never by auto-detection
        return not use_smi_check

    def current_device(self) -> str:
        # an integer would mean "accelerator <n>" to torch (.to(0), torch.device(0))
        return "cpu"

    def device_count(self) -> int:
        return 1

    manual_seed = manual_seed_all = staticmethod(torch.manual_seed)
    # no device to select or wait for; no CUDA allocator settings (e.g. "expandable_segments:False"), cache or profiler
    set_device = synchronize = set_allocator_settings = empty_cache = profiler_start = profiler_stop = _nothing

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # nothing reads it on CPU; a name of its own so CUDA_VISIBLE_DEVICES is left alone
        return "VERL_CPU_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        # Ray takes CPUs as num_cpus, not as a custom resource
        return {"num_cpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _patch_process_group_backend() -> None:
    """Point 2: the default backend becomes plain "gloo" (torch refuses verl's "cpu:gloo,cpu:gloo"); an explicit one
    is kept. Modules importing the function by name (engine_workers) load after verl's plugins, so get this one."""
    import verl.utils.distributed as distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_darl_cpu", False):
        return

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    initialize_global_process_group_ray._darl_cpu = True
    initialize_global_process_group_ray.__wrapped__ = original
    initialize_global_process_group_ray.__doc__ = original.__doc__
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray


def _patch_cpu_offload_pin_memory() -> None:
    """Point 8: verl hard-codes ``CPUOffloadPolicy(pin_memory=True)`` for forward-only FSDP2 engines, and pinning
    needs an accelerator; no config key turns it off, so here the policy never pins."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    original = CPUOffloadPolicy.__init__
    if getattr(original, "_darl_cpu", False):
        return

    def __init__(self, pin_memory: bool = True, *args, **kwargs):
        original(self, False, *args, **kwargs)

    __init__._darl_cpu = True
    __init__.__wrapped__ = original
    CPUOffloadPolicy.__init__ = __init__


def activate() -> None:
    """Register the CPU platform and apply what verl needs on CPU. Idempotent."""
    if PlatformRegistry.get(PLATFORM_NAME) is not PlatformCPU:
        PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)
    # point 3: verl's own switch for engine lookup; the FSDP engines are registered for cuda/npu only
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    _patch_process_group_backend()
    _patch_cpu_offload_pin_memory()


if is_requested():
    activate()
