"""A memory cgroup per scored program: `code_memory_mb` bounds the program with every process it starts.

Created under the trainer's own cgroup (v2 `memory.max`, or v1 `memory.limit_in_bytes` and its swap twin) where the
trainer may write there (root in most containers; a delegated cgroup otherwise). Where it may not, `create` returns
None and the runner allows no second process or thread (RLIMIT_NPROC), so the address-space limit of its one process
bounds the program (docs/rewards.md).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
_names = itertools.count()


def _own() -> tuple[Path, str] | None:
    """(the folder of this process's memory cgroup, "v2" | "v1"), or None."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    if (ROOT / "cgroup.controllers").exists():  # the unified hierarchy mounted at the root
        path = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
        return (ROOT / path.lstrip("/"), "v2") if path is not None else None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return ROOT / "memory" / path.lstrip("/"), "v1"
    return None


class ProgramCgroup:
    """One program's cgroup: `join(pid)` before the program runs, `close()` ends what is left in it and removes it."""

    def __init__(self, path: Path, version: str):
        self.path, self.version = path, version

    @classmethod
    def create(cls, memory_mb: int) -> ProgramCgroup | None:
        """A new cgroup limited to `memory_mb` MiB (no swap), or None where this process may not make one."""
        try:
            own = _own()
            if own is None:
                return None
            parent, version = own
            if version == "v2" and "memory" not in (parent / "cgroup.subtree_control").read_text().split():
                return None  # enabling it would move this process out of its cgroup first: not ours to do
            path = parent / f"darl_code_{os.getpid()}_{next(_names)}"
            path.mkdir()
        except OSError:
            return None
        group, limit = cls(path, version), str(int(memory_mb) * 1024 * 1024)
        try:
            if version == "v2":
                (path / "memory.max").write_text(limit)
                with contextlib.suppress(FileNotFoundError):
                    (path / "memory.swap.max").write_text("0")
            else:
                (path / "memory.limit_in_bytes").write_text(limit)
                with contextlib.suppress(FileNotFoundError):  # the swap accounting is a kernel option
                    (path / "memory.memsw.limit_in_bytes").write_text(limit)
        except OSError:
            group.close()
            return None
        return group

    def join(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def close(self) -> None:
        """SIGKILL to every process left in the cgroup, then the cgroup removed (once they are gone)."""
        for attempt in range(300):
            try:
                pids = (self.path / "cgroup.procs").read_text().split()
            except FileNotFoundError:
                return
            if not pids:
                with contextlib.suppress(OSError):
                    self.path.rmdir()
                    return
            if (self.path / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (self.path / "cgroup.kill").write_text("1")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.001 if attempt < 100 else 0.01)  # a killed program is usually gone within milliseconds
