"""Rule-based rewards for the six benchmarks, as a verl custom reward function.

verl 0.9.1 loads it from the config (the launch scripts in shells/ set both keys):

    reward.custom_reward_function.path=pkg://recipe.darl.rewards
    reward.custom_reward_function.name=compute_score

and calls `compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)` from a
worker thread of its reward loop; keyword arguments under `reward.custom_reward_function.reward_kwargs`
are passed through (here: `code_timeout_s`, `code_memory_mb`, `code_sandbox`).

- code (HumanEval, LiveCodeBench; `data_source` in CODE_SOURCES): the program runs in a sandboxed child that only
  returns outputs, the verdict is decided in the caller (`code_reward`);
- everything else is math (GSM8K, MATH, MATH-500, AIME24): `math-verify` (`math_reward`).
Both return 0.0 or 1.0 and never raise on a response (a bad `code_sandbox` value does).
"""

from __future__ import annotations

from . import code_reward, math_reward

CODE_SOURCES = frozenset({"openai/openai_humaneval", "livecodebench/code_generation_lite", "humaneval", "livecodebench"})


def compute_score(data_source, solution_str, ground_truth, extra_info=None, code_timeout_s: float = code_reward.DEFAULT_TIMEOUT_S,
                  code_memory_mb: int = code_reward.DEFAULT_MEMORY_MB, code_sandbox: str = "auto", **kwargs) -> float:
    """Score of one response: 1.0 correct, 0.0 otherwise (wrong, malformed, timed out, crashed)."""
    if str(data_source) in CODE_SOURCES:
        return code_reward.compute_score(solution_str, ground_truth, timeout_s=code_timeout_s, memory_mb=code_memory_mb,
                                         sandbox=code_sandbox)
    return math_reward.compute_score(solution_str, ground_truth)


__all__ = ["compute_score", "CODE_SOURCES", "code_reward", "math_reward"]
