"""Math answers checked with `math-verify` (GSM8K, MATH, MATH-500, AIME24).

A `\\boxed{}` answer is preferred, other final-answer forms are accepted; with Qwen3's thinking mode only the text
after the last `</think>` counts. math-verify's time limits use `signal.alarm`, which works only in the main thread,
so they are off in verl's reward worker threads.
"""

from __future__ import annotations

import logging
import threading

MAIN_THREAD_TIMEOUT_S = 5


class _DropTimeoutNotice(logging.Filter):
    """math-verify warns on every call made with its time limits off; once is known, keep the logs readable."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutNotice())


def final_text(solution_str: str) -> str:
    """The part of a response after the last `</think>` (the whole response when there is none)."""
    marker = "</think>"
    return solution_str.rsplit(marker, 1)[1] if marker in solution_str else solution_str


def _timeouts() -> dict:
    if threading.current_thread() is threading.main_thread():
        return {"parsing_timeout": MAIN_THREAD_TIMEOUT_S, "timeout_seconds": MAIN_THREAD_TIMEOUT_S}
    return {"parsing_timeout": None, "timeout_seconds": None}


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the response's final answer equals `ground_truth` mathematically, else 0.0 (never raises)."""
    try:
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    except ImportError as e:  # pragma: no cover - install hint
        raise ImportError('math rewards need math-verify: pip install "math-verify[antlr4_9_3]==0.9.0"') from e

    if not isinstance(solution_str, str) or not solution_str.strip():
        return 0.0
    limits = _timeouts()
    try:
        gold_text = str(ground_truth).strip()
        gold = parse(f"$\\boxed{{{gold_text}}}$", parsing_timeout=limits["parsing_timeout"])
        if not gold:
            gold = parse(gold_text, parsing_timeout=limits["parsing_timeout"])
        pred = parse(
            final_text(solution_str),
            extraction_config=[LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()],
            parsing_timeout=limits["parsing_timeout"],
        )
        if not gold or not pred:
            return 0.0
        return 1.0 if verify(gold, pred, timeout_seconds=limits["timeout_seconds"]) else 0.0
    except Exception:  # math-verify's parsers can raise on odd LaTeX; a malformed answer scores 0
        return 0.0
