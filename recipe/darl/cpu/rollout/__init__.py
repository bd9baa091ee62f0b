"""The project's verl plugin for CPU machines: what verl's rollout and weight sync need to run without a GPU.

Importing it registers verl's "vllm" replica on CPU (with ``VERL_PLATFORM=cpu``, `recipe.darl.cpu.vllm_rollout`)
and the "ray_object_store" checkpoint engine (`recipe.darl.cpu.checkpoint_engine_ray`; this package imports the
engine's module, never the reverse). Each registration runs when verl imports the registry's package (at once if
it is already imported); `after_import` offers the same to other backends. The ``verl.plugins`` entry point
``darl_rollout`` (or ``VERL_USE_EXTERNAL_MODULES``) loads it in every process that imports verl.
"""

from __future__ import annotations

import importlib
import importlib.abc
import logging
import sys

# cheap: imports no verl; registers verl's own "vllm" rollout on CPU (a replica without accelerator ids), and
# does nothing without VERL_PLATFORM=cpu
from recipe.darl.cpu.vllm_rollout import register as register_vllm_cpu

logger = logging.getLogger(__name__)

# Registration waits until verl imports the registries' packages itself, so a process that only needs, say,
# verl.protocol does not pay for transformers (~1 s). Importing recipe.darl.cpu.checkpoint_engine_ray registers
# the "ray_object_store" checkpoint engine.
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
            if finder is self or isinstance(finder, _AfterImportFinder) or not hasattr(finder, "find_spec"):
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
    from recipe.darl.cpu import platform  # noqa: F401

    if not any(isinstance(finder, _AfterImportFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImportFinder())
    for name in _AFTER_IMPORT:
        if name in sys.modules:  # imported before this plugin: register now
            _run_all(name)


_install()
