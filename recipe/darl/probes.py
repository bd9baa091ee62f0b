"""Deterministic kills for the fault-injection tests (tests/faults/, docs/faults.md).

`DARL_FAULT_INJECT="<point>:<step>[:<delay_s>][,...]"` makes the trainer SIGKILL the job when it reaches
`<point>` at trainer step `<step>` (one-step-off: `global_steps`; fully-async: the parameter version the
checkpoint folder is named by), after `<delay_s>` seconds when given (the kill then lands inside whatever the
trainer does next: a generation it awaits, the actor update). Unset (every real run), `fault_point` returns at
once. The points:

| point | where |
|---|---|
| `generate` | an hf rollout server's decode step with the weights of version `<step>` (one-step-off: while trainer step `<step>` runs, the next batch is generated) |
| `rollout_server` | the same place, but only that server's process dies (a dead rollout server; the job goes on) |
| `rollout_stop` | the same place, but that server's process is frozen with SIGSTOP (a hung server: alive to Ray, answering nothing) |
| `sync_server` | an hf rollout server receiving its `<step>`-th weight update (counted from 1, the start-up sync included), right after its first bucket is loaded: only that server's process dies, inside the trainer's weight sync |
| `update` | start of `_fit_update_actor` (with a delay: during the update) |
| `buffer_write` | inside the buffer's atomic write: temporary file complete, not yet renamed |
| `after_buffer` | inside a checkpoint save: buffer (and queue) written, verl's files not yet |
| `verl_save` | inside verl's save: actor shards written (and, with verl's own rotation, the previous ones removed), `data.pt` and the tracker not yet |
| `after_save` | right after a complete checkpoint (tracker written) |

What is killed: the process group `DARL_FAULT_PGID` (the test starts the launch script in its own session, as a
scheduler kills a job's processes), then this process (a Ray actor may live outside that group). A line is
appended to `DARL_FAULT_MARKER` first, so the test knows which kill happened.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager

ENV = "DARL_FAULT_INJECT"
POINTS = ("generate", "update", "buffer_write", "after_buffer", "verl_save", "after_save", "rollout_server",
          "rollout_stop", "sync_server")
ALONE = ("rollout_server", "rollout_stop", "sync_server")  # points that hit only the process they fire in


def parse(spec: str) -> list[tuple[str, int, float]]:
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        parts = item.split(":")
        if len(parts) not in (2, 3) or parts[0] not in POINTS:
            raise ValueError(f"{ENV}: {item!r} is not <point>:<step>[:<delay_s>] with a point among {POINTS}")
        out.append((parts[0], int(parts[1]), float(parts[2]) if len(parts) == 3 else 0.0))
    return out


def armed(point: str, step: int) -> bool:
    spec = os.environ.get(ENV)
    return bool(spec) and any(p == point and s == int(step) for p, s, _ in parse(spec))


def _kill(point: str, step: int) -> None:
    line = f"{point}:{step} pid {os.getpid()} at {time.time():.3f}"
    print(f"[D-ARL] fault injection: {'SIGSTOP' if point == 'rollout_stop' else 'SIGKILL'} at {line}", flush=True)
    marker = os.environ.get("DARL_FAULT_MARKER")
    if marker:
        with open(marker, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
    pgid = os.environ.get("DARL_FAULT_PGID")
    if pgid and point not in ALONE:
        try:
            os.killpg(int(pgid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    os.kill(os.getpid(), signal.SIGSTOP if point == "rollout_stop" else signal.SIGKILL)


def fault_point(point: str, step: int) -> None:
    """Kills the job here when `DARL_FAULT_INJECT` names this point and step (see the module docstring)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    for p, s, delay in parse(spec):
        if p == point and s == int(step):
            if delay > 0:
                timer = threading.Timer(delay, _kill, args=(point, step))
                timer.daemon = True
                timer.start()
            else:
                _kill(point, step)


@contextmanager
def after_call(obj, attr: str, point: str, step: int):
    """While armed for (point, step): `obj.attr(...)` runs, then `fault_point` fires (for a point inside a
    method of verl's that the trainer cannot otherwise reach, e.g. after the actor shards in `_save_checkpoint`)."""
    if not armed(point, step):
        yield
        return
    original = getattr(obj, attr)

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        fault_point(point, step)
        return result

    setattr(obj, attr, wrapped)
    try:
        yield
    finally:
        setattr(obj, attr, original)
