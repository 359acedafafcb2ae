"""From a failed distributed test's exception text to an outcome and the
first line of the error (no torch import: the CI test checks these alone)."""
from __future__ import annotations


def first_error_line(text: str) -> str:
    """The exception line of the last traceback in text (what was raised,
    not where); text without a traceback: its last non-empty line."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if starts:
        for line in lines[starts[-1] + 1:]:
            if line and not line[0].isspace():
                return line.strip()
    rest = [line.strip() for line in lines if line.strip()]
    return rest[-1] if rest else ""


def classify(exc_text: str) -> tuple[str, str]:
    """(outcome, first error line) of a test that raised in the parent. The
    parent turns the ranks' exceptions into one RuntimeError carrying their
    tracebacks ("Process 0 exited with error code 10 and exception:\\n..."),
    so unittest's failure/error split says nothing: a rank whose test raised
    AssertionError "failed" (a check on the result did not hold); anything
    else "errored" (the backend raised, a rank died or timed out). The first
    rank that reported decides."""
    marker = "and exception:\n"
    if marker in exc_text:
        rank_tb = exc_text.split(marker, 1)[1].split("\nProcess ", 1)[0]
        line = first_error_line(rank_tb)
    else:
        line = first_error_line(exc_text)
    return ("failed" if line.startswith("AssertionError") else "errored"), line
