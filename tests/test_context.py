"""The worker context's one classification of a handler's exception (worker/context.py)."""

from __future__ import annotations

import pytest

from delayq import Task
from delayq.errors import Defer, Discard, Fail, Retry
from delayq.worker.context import Verdict, classify


def task(attempt: int, max_attempts: int = 3) -> Task:
    return Task.claimed("t", "k", None, attempt, max_attempts, 0, "q", 1)


@pytest.mark.parametrize(
    ("exc", "attempt", "expected"),
    [
        (Defer(0), 1, Verdict("deferred", "", due_ms=1)),
        (Defer(250), 3, Verdict("deferred", "", due_ms=250)),
        (Discard("dup"), 1, Verdict("discarded", "dup")),
        (Fail(""), 1, Verdict("dead", "Fail: ", failed=True, reason="Fail: no reason given")),
        (Fail("bad"), 1, Verdict("dead", "Fail: bad", failed=True, reason="Fail: bad")),
        (Retry(2.5), 2, Verdict("retrying", f"Retry: {Retry(2.5)}", after=2.5)),
        (
            Retry(reason="busy"),
            3,
            Verdict("dead", f"Retry: {Retry(reason='busy')}", reason=None),
        ),
        (ValueError("x"), 2, Verdict("retrying", "ValueError: x", failed=True)),
        (ValueError("x"), 3, Verdict("dead", "ValueError: x", failed=True)),
    ],
)
def test_classify(exc: BaseException, attempt: int, expected: Verdict) -> None:
    got = classify(exc, task(attempt))
    if isinstance(exc, Retry) and expected.outcome == "dead":
        assert got.reason == f"Retry requested, but no attempts left: {exc}"
        expected = Verdict("dead", expected.error, reason=got.reason)
    assert got == expected
