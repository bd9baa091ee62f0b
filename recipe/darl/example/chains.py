"""The second example task: chains of additions and subtractions, worked line by line, answer in \\boxed{}.

A problem is a tuple of terms whose sum is the answer, e.g. (47, 385, -129, 64) for `47+385-129+64`; the response
the warm start teaches writes one intermediate line per operation:

    47+385=432
    432-129=303
    303+64=367
    \\boxed{367}

Every running total stays between 0 and 9999. Unlike the sums of `arithmetic.py`, a correct answer needs every
intermediate line right, and responses run to about 50 tokens (at most 64 with the character tokenizer). The reward
is the arithmetic example's (`arithmetic.compute_score`: the last \\boxed{} as an integer).
"""

from __future__ import annotations

import random

DATA_SOURCE = "darl/chains"
VAL_KEY = f"val-core/{DATA_SOURCE}/acc/mean@1"
INSTRUCTION = "Compute step by step. Answer in \\boxed{}."
TERMS = 4  # operands per chain: three intermediate lines
MAX_RESPONSE_TOKENS = 64  # the longest solution_text is 53 characters, plus the end-of-turn token


def make_problems(count: int, seed: int, terms: int = TERMS) -> list[tuple[int, ...]]:
    """`count` distinct chains of `terms` operands 10..999, each after the first added or subtracted, drawn from
    `seed`; a subtraction that would take the running total below 0 becomes an addition."""
    rng = random.Random(seed)
    seen: dict[tuple[int, ...], None] = {}
    while len(seen) < count:
        total = first = rng.randint(10, 999)
        chain = [first]
        for _ in range(terms - 1):
            term = rng.randint(10, 999)
            if rng.random() < 0.5 and total - term >= 0:
                term = -term
            total += term
            chain.append(term)
        seen[tuple(chain)] = None
    return list(seen)


def expression(*terms: int) -> str:
    """`47+385-129+64` for (47, 385, -129, 64)."""
    return str(terms[0]) + "".join(f"{'-' if t < 0 else '+'}{abs(t)}" for t in terms[1:])


def answer(*terms: int) -> int:
    return sum(terms)


def prompt_text(*terms: int) -> str:
    return f"{INSTRUCTION}\n{expression(*terms)}"


def solution_text(*terms: int) -> str:
    """The response the warm start teaches: one line per operation with its running total, then the box."""
    lines, total = [], terms[0]
    for term in terms[1:]:
        lines.append(f"{expression(total, term)}={total + term}")
        total += term
    return "\n".join(lines) + f"\n\\boxed{{{total}}}"


def records(problems: list[tuple[int, ...]], split: str) -> list[dict]:
    """verl RL-dataset rows: chat prompt, rule-based ground truth, split and index."""
    return [{"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": prompt_text(*p)}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(answer(*p))},
             "extra_info": {"split": split, "index": i, "terms": list(p)}}
            for i, p in enumerate(problems)]
