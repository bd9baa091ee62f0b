"""The built-in example task: two-term addition of 2-3 digit numbers, answer in \\boxed{}.

A good response reads `47+385=432 \\boxed{432}`. `compute_score` is a verl custom reward function
(`reward.custom_reward_function.path/name`) comparing the last \\boxed{} as an integer.
"""

from __future__ import annotations

import random
from typing import Optional

DATA_SOURCE = "darl/arithmetic"
# the validation accuracy verl logs for this data source (greedy, one response per problem)
VAL_KEY = f"val-core/{DATA_SOURCE}/acc/mean@1"
INSTRUCTION = "Add. Answer in \\boxed{}."
HARD_CARRIES = 2


def make_problems(count: int, seed: int) -> list[tuple[int, int]]:
    """`count` distinct pairs (a, b), each 10..999, drawn from `seed`."""
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    while len(seen) < count:
        seen.add((rng.randint(10, 999), rng.randint(10, 999)))
    return sorted(seen, key=lambda _: rng.random())


def carries(a: int, b: int) -> int:
    """Carries in the column addition of a + b."""
    count = carry = 0
    while a or b:
        carry = (a % 10 + b % 10 + carry) // 10
        count += carry
        a, b = a // 10, b // 10
    return count


def is_hard(a: int, b: int) -> bool:
    """The scarce regime's problems (two 3-digit operands, >= HARD_CARRIES carries), rarely solved by the
    warm-started model (docs/evidence.md)."""
    return a >= 100 and b >= 100 and carries(a, b) >= HARD_CARRIES


def answer(a: int, b: int) -> int:
    return a + b


def prompt_text(a: int, b: int) -> str:
    return f"{INSTRUCTION}\n{a}+{b}"


def solution_text(a: int, b: int) -> str:
    """The response the warm-start teaches: the chain, then the box."""
    return f"{a}+{b}={a + b} \\boxed{{{a + b}}}"


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Optional[dict] = None,
                  **kwargs) -> float:
    """verl custom reward: 1.0 when the last \\boxed{} holds the right integer, else 0.0."""
    from verl.utils.reward_score.math_reward import last_boxed_only_string, remove_boxed

    boxed = last_boxed_only_string(solution_str)
    try:
        answer = "" if boxed is None else remove_boxed(boxed).strip()
    except (AssertionError, IndexError):
        return 0.0
    return 1.0 if answer.isdigit() and int(answer) == int(ground_truth) else 0.0


def records(problems: list[tuple[int, int]], split: str) -> list[dict]:
    """verl RL-dataset rows: chat prompt, rule-based ground truth, split and index."""
    return [{"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": prompt_text(a, b)}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(a + b)},
             "extra_info": {"split": split, "index": i, "a": a, "b": b}}
            for i, (a, b) in enumerate(problems)]
