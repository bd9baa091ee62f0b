"""Rule-based rewards for the six benchmarks: verl's custom reward function (docs/running.md, "Rewards").

verl 0.9.1 calls `compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)` from a worker
thread of its reward loop, with `reward.custom_reward_function.reward_kwargs` passed through (here `code_timeout_s`,
`code_memory_mb`, `code_sandbox`, `code_allow_shared_uid`). Code (`data_source` in CODE_SOURCES) is run in a sandbox
by `code_reward`, everything else is math (`math_reward`, math-verify). Both return 0.0 or 1.0 and never raise on a
response (a bad `code_sandbox` value does, and so does a sandbox that cannot start as configured).
"""

from __future__ import annotations

from . import code_reward, math_reward

CODE_SOURCES = frozenset({"openai/openai_humaneval", "livecodebench/code_generation_lite", "humaneval", "livecodebench"})


def compute_score(data_source, solution_str, ground_truth, extra_info=None, code_timeout_s: float = code_reward.DEFAULT_TIMEOUT_S,
                  code_memory_mb: int = code_reward.DEFAULT_MEMORY_MB, code_sandbox: str = "auto",
                  code_allow_shared_uid: bool = False, **kwargs) -> float:
    """Score of one response: 1.0 correct, 0.0 otherwise (wrong, malformed, timed out, crashed)."""
    if str(data_source) in CODE_SOURCES:
        return code_reward.compute_score(solution_str, ground_truth, timeout_s=code_timeout_s, memory_mb=code_memory_mb,
                                         sandbox=code_sandbox, allow_shared_uid=code_allow_shared_uid)
    return math_reward.compute_score(solution_str, ground_truth)
