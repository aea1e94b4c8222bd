"""Handlers a worker runs, by task kind. Each Worker has its own registry (no globals)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from delayq import check
from delayq.backoff import DEFAULT_BACKOFF, DEFAULT_JITTER, Backoff, validate_backoff
from delayq.errors import ConfigurationError
from delayq.spec import MAX_ATTEMPTS, validate_kind
from delayq.timing import Duration, config_seconds

DEFAULT_MAX_ATTEMPTS = 5

HandlerFn = Callable[..., Any]


@dataclass(frozen=True)
class Handler:
    kind: str
    fn: HandlerFn
    is_async: bool
    max_attempts: int
    backoff: Backoff
    jitter: float
    timeout: float | None
    # A worker's own dispatcher (a cron occurrence's runner, the expiry handler) that calls
    # the user's function through WorkerContext.invoke itself: the middleware wraps that
    # call, not this one.
    internal: bool = False
    # Most runs of this kind held at once by one worker (running or claimed to start); None:
    # only the worker's concurrency bounds them.
    concurrency: int | None = None
    # A TaskType's handler: turns the payload a producer wrote into one of its type (raises
    # for one that does not match: the task is dead), and the dead reason of that error.
    # None for a plain kind, whose payload is handed over as decoded.
    load: Callable[[Any], Any] | None = None
    refused: Callable[[Exception], str] | None = None

    def attempts_allowed(self, record_max: int) -> int:
        """A limit given at schedule time (``max_attempts=``) wins over the handler's."""
        return record_max if record_max > 0 else self.max_attempts


def make_handler(
    kind: str,
    fn: HandlerFn,
    *,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    backoff: Backoff = DEFAULT_BACKOFF,
    jitter: float = DEFAULT_JITTER,
    timeout: Duration | None = None,
    internal: bool = False,
    concurrency: int | None = None,
    load: Callable[[Any], Any] | None = None,
    refused: Callable[[Exception], str] | None = None,
) -> Handler:
    validate_kind(kind)
    if not callable(fn):
        raise ConfigurationError(f"handler for {kind!r} is not callable: {fn!r}")
    check.whole(max_attempts, "max_attempts", 1, MAX_ATTEMPTS, hint=f" (for {kind!r})")
    jitter = check.real(jitter, "jitter", 0, 1, hint=f" (a share of the backoff, for {kind!r})")
    return Handler(
        kind=kind,
        fn=fn,
        is_async=inspect.iscoroutinefunction(fn),
        max_attempts=max_attempts,
        backoff=validate_backoff(backoff),
        jitter=jitter,
        timeout=(
            config_seconds(timeout, "timeout", 0.001, f" (for {kind!r}; None: no timeout)")
            if timeout is not None
            else None
        ),
        internal=internal,
        concurrency=concurrency,
        load=load,
        refused=refused,
    )


class Registry:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self.on_dead: list[HandlerFn] = []

    def add(self, handler: Handler) -> None:
        if handler.kind in self._handlers:
            raise ConfigurationError(f"a handler for {handler.kind!r} is already registered")
        self._handlers[handler.kind] = handler

    def get(self, kind: str) -> Handler | None:
        return self._handlers.get(kind)

    def kinds(self) -> list[str]:
        return sorted(self._handlers)

    def caps(self) -> dict[str, int]:
        """Kind -> its handler's ``concurrency``, for the kinds that have one."""
        return {k: h.concurrency for k, h in self._handlers.items() if h.concurrency is not None}


def handler_options(
    kind: Any, given: dict[str, Any], concurrency: int | None, most: int
) -> tuple[str, dict[str, Any]]:
    """``Worker.handler``'s kind and the options of its :func:`make_handler`: a TaskType's
    defaults (and its payload's loader) under the decorator's own ``given`` (None: not
    given), a kind's cap checked against the worker's ``most`` slots."""
    from delayq import controls
    from delayq.spec import TaskType

    options: dict[str, Any] = {"max_attempts": DEFAULT_MAX_ATTEMPTS}
    if isinstance(kind, TaskType):
        options.update(kind.options)  # its defaults, under the decorator's own
        options["load"], options["refused"] = kind.load, kind.reason
        kind = kind.kind
    options.update((k, v) for k, v in given.items() if v is not None)
    if concurrency is not None:
        options["concurrency"] = controls.checked_concurrency(kind, concurrency, most)
    return kind, options
