"""OpenTelemetry traces for delayq: ``pip install 'delayq[otel]'``, then::

    from delayq.contrib.opentelemetry import instrument
    instrument()

From then on, in this process:

- each ``schedule``/``schedule_many`` call of a ``Queue`` or ``AsyncQueue`` is a PRODUCER
  span ``send {queue}``, and its context is injected into each task's headers (W3C
  ``traceparent``, through the configured propagator);
- each attempt a worker runs (a task's handler, a cron occurrence, an expiring key's
  callback) is a CONSUMER span ``process {queue}``, the child of the span that scheduled
  the task, so the scheduling request, the task and its retries are one trace.

Attributes follow the messaging conventions (``messaging.system`` = ``delayq``,
``messaging.destination.name``, ``messaging.message.id``, ``messaging.operation.type`` and
``.name``), plus ``delayq.task.kind``, ``delayq.attempt`` and ``delayq.lateness_ms``. An
exception that fails the attempt sets the span's status to ERROR and is recorded on it;
``Retry``, ``Discard``, ``Fail`` and ``Defer`` are the task's outcomes, not errors: they are
the attribute ``delayq.outcome``. Only the OpenTelemetry API is used: spans go wherever the
application's tracer provider sends them. Workers and queues made before ``instrument()``
are instrumented too, except a worker already serving.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

from delayq import hooks
from delayq.extras import require

require("otel", "delayq.contrib.opentelemetry")

from opentelemetry import context as otel_context  # noqa: E402
from opentelemetry import propagate, trace  # noqa: E402
from opentelemetry.trace import SpanKind, Status, StatusCode  # noqa: E402

from delayq.errors import Defer, Discard, Fail, Retry  # noqa: E402
from delayq.queue import AsyncQueue, Queue  # noqa: E402
from delayq.spec import TaskSpec  # noqa: E402
from delayq.task import Task  # noqa: E402

__all__ = ["instrument", "is_instrumented", "uninstrument"]

SYSTEM = "delayq"
OUTCOMES: tuple[tuple[type[BaseException], str], ...] = (
    (Retry, "retry"),
    (Discard, "discard"),
    (Fail, "fail"),
    (Defer, "defer"),
)
_PATCHED = ("schedule", "schedule_many")
_state: dict[str, Any] = {}


def is_instrumented() -> bool:
    return bool(_state)


def instrument(tracer_provider: trace.TracerProvider | None = None) -> None:
    """Trace every queue and worker of this process (idempotent). ``tracer_provider``: the
    one to use instead of the global one (tests pass the SDK's with an in-memory exporter).
    """
    if _state:
        return
    from delayq import __version__

    tracer = trace.get_tracer("delayq", __version__, tracer_provider=tracer_provider)
    originals = {
        (cls, name): getattr(cls, name) for cls in (Queue, AsyncQueue) for name in _PATCHED
    }
    for (cls, name), original in originals.items():
        wrap = _async_send if cls is AsyncQueue else _send
        setattr(cls, name, wrap(tracer, original, batch=name == "schedule_many"))
    hooks.before_schedule.insert(0, _inject)
    process = _process(tracer)
    hooks.middleware.insert(0, process)
    _state.update(originals=originals, process=process)


def uninstrument() -> None:
    """Undo :func:`instrument`: queues and workers made afterwards are not traced."""
    if not _state:
        return
    try:
        for (cls, name), original in _state["originals"].items():
            setattr(cls, name, original)
        # Someone may have reset the lists meanwhile (a test restoring them): remove what
        # is still there, and forget the instrumentation whatever happens.
        if _inject in hooks.before_schedule:
            hooks.before_schedule.remove(_inject)
        if _state["process"] in hooks.middleware:
            hooks.middleware.remove(_state["process"])
    finally:
        _state.clear()


# -- producing ----------------------------------------------------------------------------------


def _send_attributes(
    queue: Queue | AsyncQueue, args: tuple[Any, ...], kwargs: dict[str, Any], batch: bool
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue.name,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
    }
    kind = args[0] if args else kwargs.get("kind")
    if not batch and kind is not None:
        attributes["delayq.task.kind"] = kind
    return attributes


def _sent(span: trace.Span, result: Any, batch: bool) -> None:
    if batch:
        span.set_attribute("messaging.batch.message_count", len(result))
    else:
        span.set_attribute("messaging.message.id", str(result))


def _send(tracer: trace.Tracer, original: Callable[..., Any], *, batch: bool) -> Callable[..., Any]:
    @functools.wraps(original)
    def send(self: Queue, *args: Any, **kwargs: Any) -> Any:
        attributes = _send_attributes(self, args, kwargs, batch)
        with tracer.start_as_current_span(
            f"send {self.name}", kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            result = original(self, *args, **kwargs)
            _sent(span, result, batch)
            return result

    return send


def _async_send(
    tracer: trace.Tracer, original: Callable[..., Any], *, batch: bool
) -> Callable[..., Any]:
    @functools.wraps(original)
    async def send(self: AsyncQueue, *args: Any, **kwargs: Any) -> Any:
        attributes = _send_attributes(self, args, kwargs, batch)
        with tracer.start_as_current_span(
            f"send {self.name}", kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            result = await original(self, *args, **kwargs)
            _sent(span, result, batch)
            return result

    return send


def _inject(spec: TaskSpec) -> TaskSpec:
    """The current context (the send span) into the task's headers: a before_schedule hook."""
    carrier: dict[str, str] = dict(spec.headers or {})
    propagate.inject(carrier)
    return dataclasses.replace(spec, headers=carrier)


# -- processing ---------------------------------------------------------------------------------


def _process(tracer: trace.Tracer) -> hooks.Middleware:
    async def process(task: Task, call_next: hooks.CallNext) -> Any:
        parent = propagate.extract(task.headers) if task.headers else None
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": task.queue,
            "messaging.message.id": task.id,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "delayq.task.kind": task.kind,
            "delayq.attempt": task.attempt,
            "delayq.lateness_ms": round(time.time() * 1000 - task.due_at.timestamp() * 1000, 3),
        }
        # start_span and attach by hand: start_as_current_span's context manager costs a
        # fifth of the span again, on every attempt.
        span = tracer.start_span(
            f"process {task.queue}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        outcome = "done"
        try:
            return await call_next(task)
        except Exception as e:
            outcome = next((name for cls, name in OUTCOMES if isinstance(e, cls)), "error")
            if outcome == "error":
                span.record_exception(e)
                span.set_status(Status(StatusCode.ERROR, f"{type(e).__name__}: {e}"))
            raise
        except BaseException:  # cancelled: shutdown, a lost lease, a timeout
            outcome = "cancelled"
            raise
        finally:
            otel_context.detach(token)
            span.set_attribute("delayq.outcome", outcome)
            span.end()

    return process
