"""The project's verl plugin for CPU machines (entry point ``verl.plugins: darl_rollout``, loaded in every process
that imports verl): registers verl's "vllm" replica on CPU (`recipe.darl.cpu.vllm_rollout`, with ``VERL_PLATFORM=cpu``)
and the "ray_object_store" checkpoint engine (`recipe.darl.cpu.checkpoint_engine_ray`, which never imports this).
Each registration waits until verl imports the registry's package, so a process that only needs, say, verl.protocol
does not pay for transformers (~1 s); `after_import` offers the same to other backends.
"""

from __future__ import annotations

import importlib
import importlib.abc
import logging
import sys

from recipe.darl.cpu.vllm_rollout import register as register_vllm_cpu

logger = logging.getLogger(__name__)

_AFTER_IMPORT: dict[str, list] = {
    "verl.workers.rollout": [register_vllm_cpu],
    "verl.checkpoint_engine": [lambda: importlib.import_module("recipe.darl.cpu.checkpoint_engine_ray")],
}


def after_import(module: str, callback) -> None:
    """Runs `callback()` once `module` (one of verl's registry packages) is imported: now if it already is."""
    _AFTER_IMPORT.setdefault(module, []).append(callback)
    if module in sys.modules:
        callback()


def _run_all(module: str) -> None:
    for callback in _AFTER_IMPORT.get(module, []):
        callback()


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Finds the registry packages with the other finders, handing back their spec with a wrapped loader."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _AFTER_IMPORT:
            return None
        for finder in sys.meta_path:
            if isinstance(finder, _AfterImportFinder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module

                def exec_then_register(module):  # executes the module, then runs the registration for it
                    exec_module(module)
                    try:
                        _run_all(fullname)  # callbacks added later run too
                    except Exception:  # verl's plugin loader would hide it; say it loudly, keep verl importable
                        logger.exception("recipe.darl.cpu.rollout: registering with %s failed", module.__name__)

                spec.loader.exec_module = exec_then_register
            if spec is not None:
                return spec
        return None


def _install() -> None:
    # the CPU platform first (a no-op without VERL_PLATFORM=cpu): entry points load in no fixed order,
    # and nothing this plugin triggers may resolve verl's platform before it is registered
    importlib.import_module("recipe.darl.cpu.platform")

    sys.meta_path.insert(0, _AfterImportFinder())
    for name in _AFTER_IMPORT:
        if name in sys.modules:  # imported before this plugin: register now
            _run_all(name)


_install()
