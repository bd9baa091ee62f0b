"""A verl platform plugin that runs verl 0.9.1's FSDP2 engines on CPU (device "cpu", gloo).

Active only when the environment variable ``VERL_PLATFORM=cpu`` is set. Without it, importing this
module changes nothing: no platform is registered, no environment variable is set, nothing is
patched, and verl's platform auto-detection is exactly as shipped.

It loads in every process that imports verl (driver and Ray workers) through the setuptools entry
point ``verl.plugins: darl_cpu = recipe.darl.cpu.platform`` (setup.py), which ``verl/__init__.py``
imports. ``VERL_USE_EXTERNAL_MODULES=recipe.darl.cpu.platform`` works too where the package is not
installed. ``VERL_PLATFORM`` must be in the environment before Ray starts (Ray workers inherit the
driver's environment), and verl then selects the platform by that name
(``verl/plugin/platform/platform_manager.py::_detect_platform_name``).

Stock verl 0.9.1 needs ten changes to run on CPU, numbered here (the code and tests cite them by number).
What this module does when active:

1. registers ``PlatformCPU`` as "cpu" with verl's ``PlatformRegistry``: device "cpu", backend gloo,
   Ray resource CPU; ``auto_set_device`` then keeps ``trainer.device=cpu``;
2. ``initialize_global_process_group_ray`` gets the plain backend "gloo" (a patch: verl builds
   ``"cpu:gloo,<device>:<backend>"``, which torch refuses as ``"cpu:gloo,cpu:gloo"``);
3. sets ``VERL_ENGINE_DEVICE=cuda`` (verl's own override in ``EngineRegistry.get_engine_cls``) so the
   FSDP engines, registered only for cuda/npu, are found; they place tensors with the platform's device;
6. the current device is the string "cpu", not an accelerator index;
7. the device module answers ``get_device_name()`` ("CPU", which verl's FLOPs table knows) and the
   memory queries verl logs (0 for accelerator memory);
8. FSDP2's ``CPUOffloadPolicy`` never pins memory (a patch: verl hard-codes ``pin_memory=True`` for
   forward-only engines such as the reference policy, and pinning needs an accelerator).

Points 4, 5, 9 and 10 are configuration: ``cpu_overrides()`` returns them as Hydra overrides:

4. ``attn_implementation`` defaults to flash_attention_2: ``sdpa``;
5. ``strategy=fsdp`` (FSDP1) fails on CPU (``sync_module_states``): ``fsdp2``;
9. ``use_torch_compile`` works but adds about 20 s: off;
10. Ray's resource check counts only GPUs/NPUs: Ray starts with logical GPUs covering the trainer and rollout
    processes, and enough logical CPUs (the one-step-off task runner asks for 10).
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

    ray_gpus: logical GPUs for Ray, at least the trainer plus rollout processes (verl's
    ResourcePoolManager counts only GPUs before it places workers, which then ask for CPUs);
    ray_cpus: logical CPUs (the one-step-off task runner alone asks for 10);
    fp32: compute in fp32 (verl's default mixed precision casts parameters to bf16, slow on most CPUs).
    """
    overrides = [
        "trainer.device=cpu",  # 1: kept as is by auto_set_device on this platform
        "++actor_rollout_ref.model.override_config.attn_implementation=sdpa",  # 4: flash_attention_2 by default
        "actor_rollout_ref.actor.strategy=fsdp2",  # 5: FSDP1 fails on CPU (sync_module_states); ref follows
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",  # 9: compiling costs ~20 s
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile=false",
        f"++ray_kwargs.ray_init.num_gpus={int(ray_gpus)}",  # 10
        f"++ray_kwargs.ray_init.num_cpus={int(ray_cpus)}",
    ]
    if fp32:
        for role in ("actor", "ref"):
            overrides += [f"++actor_rollout_ref.{role}.fsdp_config.mixed_precision.{key}=fp32"
                          for key in ("param_dtype", "reduce_dtype", "buffer_dtype")]
    return overrides


def is_requested() -> bool:
    """True when ``VERL_PLATFORM=cpu`` asks for this platform."""
    return os.environ.get(ENV_VAR, "").strip().lower() == PLATFORM_NAME


class _CPUDeviceModule(ModuleType):
    """``torch.cpu`` plus the accelerator calls verl makes on ``get_torch_device()``.

    verl treats the platform's device module like ``torch.cuda``: it asks for the device name (the
    MFU counter), memory statistics (logged every step), RNG state and cache control. ``torch.cpu``
    has none of these; on CPU they have trivial answers. Anything else is looked up on ``torch.cpu``.
    """

    def __init__(self):
        super().__init__("verl_cpu_device_module", doc=self.__class__.__doc__)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "CPU"  # the key of verl.utils.flops_counter._DEVICE_FLOPS for CPUs

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed


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

    def set_device(self, device_index: Any) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None  # e.g. "expandable_segments:False": a CUDA allocator setting

    def empty_cache(self) -> None:
        return None

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

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

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
    """Point 2: verl's Ray workers ask for the backend "cpu:gloo,<device>:<backend>".

    On CPU that is "cpu:gloo,cpu:gloo", which torch.distributed refuses ("Duplicate device type cpu").
    No hook selects the string, so the default of ``initialize_global_process_group_ray`` becomes
    plain "gloo"; an explicit backend (the checkpoint engine passes "cpu:gloo") is kept. Modules that
    import the function by name (engine_workers) are imported after verl's plugins, so they get this one.
    """
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
    """Point 8: verl builds ``CPUOffloadPolicy(pin_memory=True)`` for every forward-only FSDP2 engine.

    Pinning host memory needs an accelerator ("Cannot access accelerator device when none is
    available"), and no config key turns it off, so on this platform the policy never pins.
    """
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
