"""A verl-signature reward over math-verify: 1.0 when the completion's answer is
mathematically equal to the ground truth, else 0.0.

    [environment.reward]  python = "tandem_envs.math_verify_reward:compute_score"

math-verify bounds parsing and verification with `signal.alarm`, which only works in a
process's main thread (off it, it raises ValueError, and verl's reward workers turned that into
a score of 0 for every MATH answer). Tandem's pool calls rewards in the worker's main thread, so
the alarm works; and every error (a parse or verify timeout included) is raised here
(`raise_on_error=True`), so it becomes a failed sample with its reason, never a silent 0.0.
A completion with no extractable answer is a plain 0.0 (the model answered nothing checkable).
"""

import threading

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

TIMEOUT_S = 5


def _parse(text, what):
    return parse(
        text,
        extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
        parsing_timeout=TIMEOUT_S,
        raise_on_error=True,
    )


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("math-verify's timeouts need the main thread")
    gold_text = str(ground_truth)
    if "$" not in gold_text and "\\boxed" not in gold_text:
        gold_text = f"${gold_text}$"
    gold = _parse(gold_text, "ground truth")
    if not gold:
        raise ValueError(f"math-verify parsed nothing from the ground truth {ground_truth!r}")
    answer = _parse(solution_str, "completion")
    if not answer:
        return {"score": 0.0, "extracted": 0.0}
    ok = verify(gold, answer, timeout_seconds=TIMEOUT_S, raise_on_error=True)
    return {"score": 1.0 if ok else 0.0, "extracted": 1.0}
