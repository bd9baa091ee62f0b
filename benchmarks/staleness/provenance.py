"""Where and from what a run came: commit, dirty tree, host, CPU, cores, date, command.

Every record the study writes carries `provenance()`; two runs count as a side-by-side pair only when
`same_origin` holds for them (same commit, clean tree, same host). Records archived without it are read as
"no provenance" and never count as side by side.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(_ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def provenance() -> dict[str, Any]:
    """The code and machine a run comes from. `dirty` counts tracked changes only (runs/ and caches are ignored)."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": _git("rev-parse", "HEAD"),
        "dirty": None if status is None else bool(status),
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "date": utc_now(),
        "argv": list(sys.argv),
    }


def same_origin(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Both records ran from one clean commit on one host: a side-by-side pair."""
    if not a or not b or a.get("dirty") or b.get("dirty") or not a.get("commit"):
        return False
    return a.get("commit") == b.get("commit") and a.get("host") == b.get("host")
