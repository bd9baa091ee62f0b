"""The long-tail example (`TASK=longtail`), DARTS' CPU testbed (docs/darts.md).

The example's arithmetic prompts, answered by the tiny model *untrained* (hidden 128, seed 0): its end-of-turn token
is one of 101, so a response ends at a roughly geometric length, and the responses to one prompt have a long tail
(measured at 128 tokens, temperature 1, one prompt x 64: median 40, 17% cut at the limit). The reward is dense, the
share of digits in the response, so every group is informative and RL has something to climb from the first step.
It is a timing testbed for DARTS, not a reasoning task.
"""

from __future__ import annotations

from typing import Any, Optional

MAX_RESPONSE_TOKENS = 128


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Optional[dict] = None,
                  **kwargs: Any) -> float:
    """Share of digits among the response's characters (0 for an empty response); a verl custom reward."""
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)
