"""Named probe points: the places in a run where a test may act (kill the job, freeze a rollout server).

The product calls `probe(point, step)` and knows nothing of what happens there. A hook module named by its file path
in `DARL_PROBES` (the tests' tests/faults/inject.py) is loaded once per process and registers its hooks; unset,
`probe` returns at once.

| point | where | step |
|---|---|---|
| `update` | start of the trainer's actor update | trainer step |
| `buffer_write` | inside the buffer's atomic write: temporary file complete, not yet renamed | checkpoint step |
| `after_buffer` | inside a checkpoint save: buffer (and queue) written, verl's files not yet | checkpoint step |
| `verl_save` | inside verl's save: actor shards written, `data.pt` and verl's tracker not yet | checkpoint step |
| `after_save` | right after a complete checkpoint (tracker written) | checkpoint step |
| `decode` | a CPU rollout server's decode step | the version of its weights |
| `weight_update` | a CPU rollout server after the first bucket of a weight update | its count of updates, from 1 |
"""

from __future__ import annotations

import importlib.util
import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

ENV = "DARL_PROBES"
HOOK_MODULE = "darl_probe_hooks"  # the name the hook module is loaded under
POINTS = ("update", "buffer_write", "after_buffer", "verl_save", "after_save", "decode", "weight_update")
Hook = Callable[[str, int], None]

_hooks: Optional[list[Hook]] = None  # None: the hook module is not loaded yet


def register(hook: Hook) -> None:
    """Adds `hook(point, step)`, called at every probe point of this process."""
    global _hooks
    _hooks = (_hooks or []) + [hook]


def _loaded() -> list[Hook]:
    global _hooks
    if _hooks is None:
        _hooks = []
        path = os.environ.get(ENV)
        if path:
            spec = importlib.util.spec_from_file_location(HOOK_MODULE, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"{ENV}={path!r} is not a Python file")
            module = importlib.util.module_from_spec(spec)
            sys.modules[HOOK_MODULE] = module
            spec.loader.exec_module(module)  # registers its hooks
    return _hooks


def probe(point: str, step: int) -> None:
    """Runs the registered hooks at `point` (one of POINTS) of step `step`."""
    if point not in POINTS:
        raise ValueError(f"unknown probe point {point!r}; known: {POINTS}")
    for hook in _loaded():
        hook(point, int(step))


@contextmanager
def probe_after(obj, attr: str, point: str, step: int):
    """While hooks are registered: `obj.attr(...)` runs, then `probe(point, step)` (a point inside a method of
    verl's that the trainer cannot otherwise reach, e.g. after the actor shards in `_save_checkpoint`)."""
    if not _loaded():
        yield
        return
    original = getattr(obj, attr)

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        probe(point, step)
        return result

    with swapped(obj, attr, wrapped):
        yield


@contextmanager
def swapped(obj, name: str, value: Any) -> Iterator[None]:
    """`obj.name` is `value` inside the block, its old value again after (a struct DictConfig's key included)."""
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)
