"""Process-wide hooks, for instrumentation that must reach every queue and worker (such as
``delayq.contrib.opentelemetry.instrument()``): what is registered here applies, before
their own hooks, to every ``Queue``/``AsyncQueue`` call from then on and to every ``Worker``
that starts serving afterwards (a worker already serving keeps the chain it started with).

- ``before_schedule``: functions given each ``TaskSpec`` before it is encoded; one may add
  headers to ``spec.headers``, or return a new spec (None keeps the one given).
- ``middleware``: async functions ``(task, call_next)`` around every handler invocation
  (tasks, cron occurrences, expiring keys' callbacks), outermost first.

Nothing is registered by default, and a queue or worker that finds both lists empty pays
nothing for them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from delayq.core import TaskSpec
    from delayq.task import Task

BeforeSchedule = Callable[["TaskSpec"], "TaskSpec | None"]
CallNext = Callable[["Task"], Awaitable[Any]]
Middleware = Callable[["Task", CallNext], Awaitable[Any]]

before_schedule: list[BeforeSchedule] = []
middleware: list[Middleware] = []
