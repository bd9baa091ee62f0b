"""Every launch attempt of a study, failed and interrupted ones too: `attempts.jsonl` beside a study's results.

One JSON line per event: {"event": "started" | "finished" | "failed", the run's identity (harness: method_name,
staleness, seed, common; pipeline: trainer, config, seed), "time", and where known provenance, pid or error}. A start
with neither a finish nor a failure was interrupted (or is still running). Written by `run_study` and
`pipeline_check.sh`, archived and restored beside the results (`protocol archive`, `threshold_sweep archive`).
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

NAME = "attempts.jsonl"
# fields that describe an event, not which run it belongs to
EVENT_FIELDS = ("event", "time", "pid", "provenance", "error", "host", "commit")


def record(path: str | Path, event: str, **run: Any) -> None:
    """Appends one event of one run to PATH (whole short lines: safe from concurrent workers)."""
    from benchmarks.staleness.provenance import utc_now

    with open(path, "a") as f:
        f.write(json.dumps({"event": event, **run, "time": utc_now()}) + "\n")


def summary(path: Path) -> str:
    """How many runs PATH saw start, finish and fail, how many were interrupted (or are running) and how many started
    more than once."""
    if not path.exists():
        return "attempts: none recorded"
    events: dict[str, Counter] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            a = json.loads(line)
            key = json.dumps({k: v for k, v in a.items() if k not in EVENT_FIELDS}, sort_keys=True)
            events.setdefault(key, Counter())[a["event"]] += 1
    started, finished, failed = (sum(c[e] for c in events.values()) for e in ("started", "finished", "failed"))
    again = sum(c["started"] > 1 for c in events.values())
    return (f"attempts: {started} started, {finished} finished, {failed} failed, "
            f"{started - finished - failed} interrupted or running; {again} run(s) started more than once")


def run_key(method: str, staleness: int, seed: int, common: dict[str, Any] | None) -> str:
    """The identity of a harness run: its method, staleness, seed and the settings every run of its study shares."""
    return json.dumps([method, staleness, seed, sorted((common or {}).items())])


def pack(source: Path, target: Path, results: list[dict[str, Any]] = ()) -> Path:
    """SOURCE (an attempts.jsonl) as TARGET (.jsonl.gz). A finished line without provenance (written by a study
    process from before finishes carried it) takes its run's result record's: the same run, so the same origin."""
    origin = {run_key(r["method_name"], r["staleness"], r["seed"], r.get("common")): r.get("provenance")
              for r in results}
    lines = []
    for line in source.read_text().splitlines():
        entry = json.loads(line) if line.strip() else None
        if entry and entry.get("event") == "finished" and not entry.get("provenance") and "method_name" in entry:
            found = origin.get(run_key(entry["method_name"], entry["staleness"], entry["seed"], entry.get("common")))
            if found:
                line = json.dumps({**entry, "provenance": found})
        lines.append(line)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    return target


def unpack(packed: Path, target: Path) -> bool:
    """Appends the lines of PACKED that TARGET lacks; True when it wrote any."""
    have = set(target.read_text().splitlines()) if target.exists() else set()
    lines = [line for line in gzip.decompress(packed.read_bytes()).decode().splitlines() if line and line not in have]
    if lines:
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a") as f:
            f.write("".join(line + "\n" for line in lines))
    return bool(lines)
