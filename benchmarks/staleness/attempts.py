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


def identity(line: str) -> str:
    """One event's identity: its line less the provenance, which an archive adds to a finish written without it."""
    return json.dumps({k: v for k, v in json.loads(line).items() if k != "provenance"}, sort_keys=True)


def distinct(lines: list[str]) -> list[str]:
    """LINES, in order, with each event as many times as it happened: a restore appends the archive's copy (with
    provenance) of a finish the file already holds without it, so an identity counts max(bare, with provenance)
    times, provenance preferred."""
    lines = [line for line in lines if line.strip()]
    ids = [identity(line) for line in lines]
    has = [bool(json.loads(line).get("provenance")) for line in lines]
    bare, kept = Counter(i for i, h in zip(ids, has) if not h), Counter(i for i, h in zip(ids, has) if h)
    emitted, left = Counter(), Counter(kept)
    out = []
    for line, i, h in zip(lines, ids, has):
        need = max(bare[i], kept[i])
        if h:
            left[i] -= 1
        if emitted[i] < need and (h or emitted[i] + left[i] < need):
            emitted[i] += 1
            out.append(line)
    return out


def summary(path: Path) -> str:
    """How many runs PATH saw start, finish and fail, how many were interrupted (or are running) and how many started
    more than once (each event counted once, see `distinct`)."""
    if not path.exists():
        return "attempts: none recorded"
    events: dict[str, Counter] = {}
    for line in distinct(path.read_text().splitlines()):
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
    """SOURCE (an attempts.jsonl) as TARGET (.jsonl.gz), each event once. A finished line without provenance
    (written by a study process from before finishes carried it) takes its run's result record's: the same run, so
    the same origin."""
    origin = {run_key(r["method_name"], r["staleness"], r["seed"], r.get("common")): r.get("provenance")
              for r in results}
    lines = []
    for line in distinct(source.read_text().splitlines()):
        entry = json.loads(line)
        if entry.get("event") == "finished" and not entry.get("provenance") and "method_name" in entry:
            found = origin.get(run_key(entry["method_name"], entry["staleness"], entry["seed"], entry.get("common")))
            if found:
                line = json.dumps({**entry, "provenance": found})
        lines.append(line)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(gzip.compress("".join(line + "\n" for line in lines).encode(), mtime=0))
    return target


def unpack(packed: Path, target: Path) -> bool:
    """Appends the events of PACKED that TARGET lacks (each event as often as PACKED holds it, compared by
    `identity`); True when it wrote any."""
    have = Counter(identity(line) for line in distinct(target.read_text().splitlines())) if target.exists() else {}
    lines = []
    for line in distinct(gzip.decompress(packed.read_bytes()).decode().splitlines()):
        if have.get(identity(line), 0) > 0:
            have[identity(line)] -= 1
        else:
            lines.append(line)
    if lines:
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a") as f:
            f.write("".join(line + "\n" for line in lines))
    return bool(lines)
