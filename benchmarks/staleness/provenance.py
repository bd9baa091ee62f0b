"""Where and from what a run came: commit, dirty tree, host, CPU, cores, date, command.

Every record the study writes carries `provenance()`; two runs count as a side-by-side pair only when
`same_origin` holds for them (same commit, clean tree, same machine: host name, CPU and boot id, since virtual
machines often share a host name). Records from before boot ids were recorded count as side by side only when one
study process wrote both (same `date`, read once a process). Records archived without provenance never count.
"""

from __future__ import annotations

from typing import Any

# one definition for the product's launches and the study's runs
from recipe.darl.robustness.run_records import cpu_model, provenance, utc_now

__all__ = ["cpu_model", "provenance", "same_origin", "utc_now"]


def same_origin(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Both records ran from one clean commit on one machine: a side-by-side pair."""
    if not a or not b or a.get("dirty") or b.get("dirty") or not a.get("commit"):
        return False
    if any(a.get(key) != b.get(key) for key in ("commit", "host", "cpu")):
        return False
    if a.get("boot") and b.get("boot"):
        return a["boot"] == b["boot"]
    return a.get("date") == b.get("date")  # no boot id on one side: only one study process proves one machine
