"""OpenTelemetry traces for delayq: ``pip install 'delayq[otel]'``, then::

    from delayq.contrib.opentelemetry import instrument
    instrument()

From then on, in this process:

- each ``schedule``/``schedule_many`` call of a ``Queue`` or ``AsyncQueue`` is a PRODUCER
  span ``send {queue}``, and its context is injected into each task's headers (W3C
  ``traceparent``, through the configured propagator);
- each attempt a worker runs (a task's handler, a cron occurrence, an expiring key's
  callback) is a CONSUMER span ``process {queue}``, the child of the span that scheduled
  the task, so the scheduling request, the task and its retries are one trace. An attempt
  whose parent trace is not sampled (its ``traceparent``'s sampled flag is off) is no span at
  all, whatever the sampler: the producer's decision stands, and the tracer is not asked.
  Its parent's context is still current while the handler runs, so the tasks it schedules
  (and any span it starts) are in the same trace, not sampled either.

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
import re
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

# A W3C traceparent as the fast path reads it (version 00, nothing after the flags); any other
# goes through the configured propagator, which says what it means.
_TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}").fullmatch
_NO_TRACE, _NO_SPAN = "0" * 32, "0" * 16  # (all zeros: invalid, the propagator ignores it)
# The headers the W3C propagators (OpenTelemetry's default) read: the fast path is taken only
# while the configured propagator reads traceparent and no others, so that it finds what the
# propagator would.
_W3C_FIELDS = frozenset(("traceparent", "tracestate", "baggage"))
_w3c: list[Any] = [None, False]  # the propagator last checked, and whether it is such a one
_EMPTY = otel_context.Context()  # what propagate.extract starts from


class _Remote(trace.NonRecordingSpan):
    """The remote parent a valid ``traceparent`` names, its SpanContext made only when asked
    for (by a span started under it, or an injection into what the handler schedules): most
    unsampled attempts never ask, and making it is half of reading the header."""

    # (NonRecordingSpan's own attribute is not used: both its readers are overridden here.)
    def __init__(self, traceparent: str) -> None:
        self._traceparent = traceparent
        self._remote: trace.SpanContext | None = None

    def get_span_context(self) -> trace.SpanContext:
        remote = self._remote
        if remote is None:
            tp = self._traceparent
            flags = trace.TraceFlags(int(tp[53:], 16))
            remote = trace.SpanContext(int(tp[3:35], 16), int(tp[36:52], 16), True, flags)
            self._remote = remote
        return remote

    def __repr__(self) -> str:
        return f"_Remote({self.get_span_context()!r})"


def _extract(headers: dict[str, str]) -> tuple[otel_context.Context, bool | None]:
    """The context a task's headers carry, and whether its remote parent's trace is sampled
    (None: there is no valid parent). A lone ``traceparent`` is read here, for a fraction of
    what ``propagate.extract`` costs; with a ``tracestate`` or ``baggage`` to carry, an
    unusual ``traceparent``, or a propagator that reads other headers, the propagator reads
    them."""
    tp = headers.get("traceparent")
    if (
        tp is not None
        and (len(headers) == 1 or ("tracestate" not in headers and "baggage" not in headers))
        and _TRACEPARENT(tp) is not None
        and not tp.startswith(_NO_TRACE, 3)
        and not tp.startswith(_NO_SPAN, 36)
    ):
        textmap = propagate.get_global_textmap()
        if textmap is not _w3c[0]:
            fields = textmap.fields
            _w3c[:] = textmap, "traceparent" in fields and fields <= _W3C_FIELDS
        if _w3c[1]:
            sampled = tp[54] in "13579bdf"  # the flags' low bit
            return trace.set_span_in_context(_Remote(tp), _EMPTY), sampled
    parent = propagate.extract(headers)
    sc = trace.get_current_span(parent).get_span_context()
    return parent, (sc.trace_flags.sampled if sc.is_valid else None)


def _process(tracer: trace.Tracer) -> hooks.Middleware:
    async def process(task: Task, call_next: hooks.CallNext) -> Any:
        headers = task.headers
        if not headers:
            return await _traced(tracer, task, call_next, None, None)
        parent, sampled = _extract(headers)
        if sampled is not False:
            return await _traced(tracer, task, call_next, parent, sampled)
        # The producer's trace is not sampled: no span at all (a parent-based sampler would
        # drop it), but its context is current while the handler runs, so what the handler
        # schedules (and any span it starts) stays in that trace, unsampled.
        token = otel_context.attach(parent)
        try:
            return await call_next(task)
        finally:
            otel_context.detach(token)

    return process


async def _traced(
    tracer: trace.Tracer,
    task: Task,
    call_next: hooks.CallNext,
    parent: otel_context.Context | None,
    sampled: bool | None,
) -> Any:
    """The attempt as a CONSUMER span, child of ``parent``'s span. A sampled parent's child
    records (the usual sampler follows its parent): every attribute is given at its start.
    With no parent (None) the sampler decides: it gets the attributes the messaging
    conventions name for sampling, and the rest are made only for a span that records."""
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": task.queue,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "delayq.task.kind": task.kind,
    }
    if sampled:
        attributes.update(_recorded(task))
    span = tracer.start_span(
        f"process {task.queue}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    )
    recording = span.is_recording()
    if recording and not sampled:
        span.set_attributes(_recorded(task))
    # start_span and attach by hand: start_as_current_span's context manager costs a fifth
    # of the span again, on every attempt.
    token = otel_context.attach(trace.set_span_in_context(span, parent))
    outcome = "done"
    try:
        return await call_next(task)
    except Exception as e:
        outcome = next((name for cls, name in OUTCOMES if isinstance(e, cls)), "error")
        if outcome == "error" and recording:
            span.record_exception(e)
            span.set_status(Status(StatusCode.ERROR, f"{type(e).__name__}: {e}"))
        raise
    except BaseException:  # cancelled: shutdown, a lost lease, a timeout
        outcome = "cancelled"
        raise
    finally:
        otel_context.detach(token)
        if recording:
            span.set_attribute("delayq.outcome", outcome)
            span.end()


def _recorded(task: Task) -> dict[str, Any]:
    """The attributes of an attempt's span that no sampler needs."""
    return {
        "messaging.message.id": task.id,
        "delayq.attempt": task.attempt,
        "delayq.lateness_ms": round(time.time() * 1000 - task.due_at.timestamp() * 1000, 3),
    }
