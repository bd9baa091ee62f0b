"""Where and from what a run came: commit, dirty tree, host, CPU, cores, date, command.

Every record the study writes carries `provenance()`; two runs count as a side-by-side pair only when
`same_origin` holds for them (same commit, clean tree, same host). Records archived without it are read as
"no provenance" and never count as side by side.
"""

from __future__ import annotations

from typing import Any

# one definition for the product's launches and the study's runs
from recipe.darl.robustness.run_records import cpu_model, provenance, utc_now

__all__ = ["cpu_model", "provenance", "same_origin", "utc_now"]


def same_origin(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Both records ran from one clean commit on one host: a side-by-side pair."""
    if not a or not b or a.get("dirty") or b.get("dirty") or not a.get("commit"):
        return False
    return a.get("commit") == b.get("commit") and a.get("host") == b.get("host")
