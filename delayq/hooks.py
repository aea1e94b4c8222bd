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

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from delayq.errors import ConfigurationError

if TYPE_CHECKING:
    from delayq.spec import TaskSpec
    from delayq.task import Task

BeforeSchedule = Callable[["TaskSpec"], "TaskSpec | None"]
CallNext = Callable[["Task"], Awaitable[Any]]
Middleware = Callable[["Task", CallNext], Awaitable[Any]]

before_schedule: list[BeforeSchedule] = []
middleware: list[Middleware] = []


def check_middleware(fn: Any) -> Middleware:
    """``fn`` if it is a middleware: an ``async def (task, call_next)`` function, or an object
    whose ``__call__`` is one (a ``functools.partial`` of one too). Anything else raises
    ConfigurationError when it is registered, not on every task it would fail."""
    call: Any = fn if inspect.isroutine(fn) or isinstance(fn, functools.partial) else None
    if call is None and callable(fn):
        call = type(fn).__call__  # an instance: its class's __call__ decides
    if call is None or not inspect.iscoroutinefunction(call):
        raise ConfigurationError(
            f"a middleware is an async function (task, call_next), or an object whose "
            f"__call__ is one; got {fn!r}: define it with 'async def'"
        )
    return fn  # type: ignore[no-any-return]
