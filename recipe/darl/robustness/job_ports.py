"""The torch.distributed port of each verl worker group, from the job's own range: two jobs on one host never race.

verl's `RayWorkerGroup` picks a worker group's MASTER_PORT by binding port 0 (a port of the kernel's ephemeral
range, 32768-60999 on Linux) and closing it; rank 0 binds torch's TCPStore there seconds later, once its process
has started. Any socket another job opens in between (Ray's own connections take ephemeral ports by the hundred)
can take that port, and the launch dies with EADDRINUSE. Here every worker group of a job takes its port from a
range below the ephemeral one that belongs to the job: `DARL_PORT_RANGE=LO-HI` when set (shells/run.sh sets it
from the Slurm job id), otherwise a 64-port slot of 20000-31999 drawn at random for the process. verl's own
`master_port_range` hook scans the range for a port that binds; each worker group of the process starts its scan
one port further, so two groups of one job do not pick the same port either.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
from typing import Iterator, Optional

from verl.single_controller.ray import RayWorkerGroup

ENV = "DARL_PORT_RANGE"
LOW, HIGH, SLOT = 20000, 32000, 64  # below Linux's ephemeral range and above Ray's worker ports (10002-19999)


def job_port_range(environ: Optional[dict] = None, rng: Optional[random.Random] = None) -> tuple[int, int]:
    """[lo, hi) of this job's ports: `DARL_PORT_RANGE=LO-HI` (at least 8 ports, within 1024-65535) or a random slot."""
    environ = os.environ if environ is None else environ
    text = environ.get(ENV, "").strip()
    if text:
        try:
            lo, hi = (int(x) for x in text.split("-"))
        except ValueError:
            raise ValueError(f"{ENV}={text!r}: expected LO-HI, for example {ENV}=23000-23064") from None
        if not 1024 <= lo < hi <= 65536 or hi - lo < 8:
            raise ValueError(f"{ENV}={text!r}: needs 1024 <= LO, LO + 8 <= HI <= 65536")
        return lo, hi
    slot = (rng or random.SystemRandom()).randrange((HIGH - LOW) // SLOT)
    return LOW + slot * SLOT, LOW + (slot + 1) * SLOT


_RANGE: Optional[tuple[int, int]] = None
_NEXT = itertools.count()
handed_out: list[int] = []  # the first port of each group's scan, for the error message


class JobPortWorkerGroup(RayWorkerGroup):
    """verl's RayWorkerGroup whose master port comes from the job's range (verl's `master_port_range` hook)."""

    def __init__(self, *args, **kwargs):
        global _RANGE
        if kwargs.get("master_port") is None and kwargs.get("master_port_range") is None:
            _RANGE = _RANGE or job_port_range()
            lo, hi = _RANGE
            start = lo + next(_NEXT) % (hi - lo)
            handed_out.append(start)
            kwargs["master_port_range"] = [start, hi]
        super().__init__(*args, **kwargs)


def is_port_clash(exc: BaseException) -> bool:
    """torch's TCPStore could not bind, or verl's scan found no free port in the range."""
    text = str(exc)
    return any(s in text for s in ("EADDRINUSE", "ddress already in use", "Could not find a free port"))


@contextlib.contextmanager
def port_clash_named() -> Iterator[None]:
    """A worker group that still fails to bind its port raises an error naming the ports and the setting."""
    try:
        yield
    except Exception as exc:
        if not is_port_clash(exc):
            raise
        lo, hi = _RANGE or (None, None)
        raise RuntimeError(
            f"a worker group found no free torch.distributed port or lost it before binding it (scans started at "
            f"{handed_out}, this job's range {lo}-{hi}). Other programs use ports there: give this job a free range "
            f"with {ENV}=LO-HI (for example {ENV}=24000-24064) and relaunch.") from exc
