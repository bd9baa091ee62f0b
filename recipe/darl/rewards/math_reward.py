"""Math answers checked with `math-verify` (GSM8K, MATH, MATH-500, AIME24).

A `\\boxed{}` answer is preferred, other final-answer forms are accepted; with Qwen3's thinking mode only the text
after the last `</think>` counts. math-verify's time limits use `signal.alarm`, which works only in the main thread,
so they are off in verl's reward worker threads.
"""

from __future__ import annotations

import logging
import threading

MAIN_THREAD_TIMEOUT_S = 5


def _drop_timeout_notice(record: logging.LogRecord) -> bool:
    """math-verify warns on every call made with its time limits off; once is known, keep the logs readable."""
    return not str(record.msg).startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_drop_timeout_notice)


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the response's final answer equals `ground_truth` mathematically, else 0.0 (never raises)."""
    try:
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    except ImportError as e:  # pragma: no cover - install hint
        raise ImportError('math rewards need math-verify: pip install "math-verify[antlr4_9_3]==0.9.0"') from e

    if not isinstance(solution_str, str) or not solution_str.strip():
        return 0.0
    timeout = MAIN_THREAD_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    try:
        gold_text = str(ground_truth).strip()
        gold = parse(f"$\\boxed{{{gold_text}}}$", parsing_timeout=timeout) or parse(gold_text, parsing_timeout=timeout)
        pred = parse(
            solution_str.rsplit("</think>", 1)[-1],  # after the last </think> (all of it when there is none)
            extraction_config=[LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()],
            parsing_timeout=timeout,
        )
        if not gold or not pred:
            return 0.0
        return 1.0 if verify(gold, pred, timeout_seconds=timeout) else 0.0
    except Exception:  # math-verify's parsers can raise on odd LaTeX; a malformed answer scores 0
        return 0.0
