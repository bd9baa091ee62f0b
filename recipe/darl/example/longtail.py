"""The long-tail example (`TASK=longtail`), DARTS' CPU timing testbed (docs/darts.md): the arithmetic prompts
answered by the untrained tiny model, whose response lengths are roughly geometric with a long tail, and a dense
reward (the share of digits) so every group is informative."""

from __future__ import annotations

from typing import Any, Optional


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Optional[dict] = None,
                  **kwargs: Any) -> float:
    """Share of digits among the response's characters (0 for an empty response); a verl custom reward."""
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)
