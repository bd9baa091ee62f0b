"""Deterministic kills at the product's probe points (recipe/darl/probes.py), for the fault tests.

tests/conftest.py sets `DARL_PROBES` to this file, so every process of a test's job loads it on its first probe.
`DARL_FAULT_INJECT="<fault>:<step>[:<delay_s>][,...]"` then makes the process SIGKILL the job when it reaches the
fault's probe point at step `<step>`, after `<delay_s>` seconds when given (the kill then lands inside whatever the
job does next). The faults:

| fault | probe point | what dies |
|---|---|---|
| `generate` | `decode` (one-step-off: while trainer step `<step>` runs, the next batch is generated) | the job |
| `rollout_server` | `decode` | only that rollout server's process (the job goes on) |
| `rollout_stop` | `decode` | that server's process is frozen with SIGSTOP (alive to Ray, answering nothing) |
| `sync_server` | `weight_update` (counted from 1, the start-up sync included) | only that server, inside the sync |
| `update`, `buffer_write`, `after_buffer`, `verl_save`, `after_save` | the point of the same name | the job |

What is killed: the process group `DARL_FAULT_PGID` (the test starts the launch script in its own session, as a
scheduler kills a job's processes), then this process (a Ray actor may live outside that group). A line is
appended to `DARL_FAULT_MARKER` first, so the test knows which kill happened.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from recipe.darl import probes

ENV = "DARL_FAULT_INJECT"
POINT_OF = {"generate": "decode", "rollout_server": "decode", "rollout_stop": "decode", "sync_server": "weight_update",
            **{p: p for p in ("update", "buffer_write", "after_buffer", "verl_save", "after_save")}}
ALONE = ("rollout_server", "rollout_stop", "sync_server")  # faults that hit only the process they fire in


def parse(spec: str) -> list[tuple[str, int, float]]:
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        parts = item.split(":")
        if len(parts) not in (2, 3) or parts[0] not in POINT_OF:
            raise ValueError(f"{ENV}: {item!r} is not <fault>:<step>[:<delay_s>] with a fault among {tuple(POINT_OF)}")
        out.append((parts[0], int(parts[1]), float(parts[2]) if len(parts) == 3 else 0.0))
    return out


def _kill(fault: str, step: int) -> None:
    line = f"{fault}:{step} pid {os.getpid()} at {time.time():.3f}"
    print(f"[D-ARL] fault injection: {'SIGSTOP' if fault == 'rollout_stop' else 'SIGKILL'} at {line}", flush=True)
    marker = os.environ.get("DARL_FAULT_MARKER")
    if marker:
        with open(marker, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
    pgid = os.environ.get("DARL_FAULT_PGID")
    if pgid and fault not in ALONE:
        try:
            os.killpg(int(pgid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    os.kill(os.getpid(), signal.SIGSTOP if fault == "rollout_stop" else signal.SIGKILL)


def hook(point: str, step: int) -> None:
    """The probe hook: appends `<point> <step>` to `DARL_PROBE_LOG` when set; kills here when `DARL_FAULT_INJECT`
    names a fault at this point and step."""
    seen = os.environ.get("DARL_PROBE_LOG")
    if seen:
        with open(seen, "a") as f:
            f.write(f"{point} {step}\n")
    spec = os.environ.get(ENV)
    if not spec:
        return
    for fault, s, delay in parse(spec):
        if POINT_OF[fault] == point and s == step:
            if delay > 0:
                timer = threading.Timer(delay, _kill, args=(fault, step))
                timer.daemon = True
                timer.start()
            else:
                _kill(fault, step)


probes.register(hook)
