"""delayq.contrib.opentelemetry: one trace from the scheduling request through every attempt,
exported by the OpenTelemetry SDK's in-memory exporter, on a real server."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from opentelemetry import baggage, trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler, SamplingResult
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags

from delayq import AsyncQueue, Discard, Fail, Queue, Retry, Task, TaskSpec, Worker
from delayq.contrib.opentelemetry import instrument, is_instrumented, uninstrument
from delayq.embedded import EmbeddedServer
from delayq.testing import VirtualClock, adrain, drain


class Asked(Sampler):
    """ParentBased(ALWAYS_ON), the SDK's default, noting the name of each span it is asked
    about: a span the instrumentation never starts is never asked about."""

    def __init__(self) -> None:
        self.inner = ParentBased(ALWAYS_ON)
        self.names: list[str] = []

    def should_sample(
        self, parent_context: Context | None, trace_id: int, name: str, *args: Any, **kwargs: Any
    ) -> SamplingResult:
        self.names.append(name)
        return self.inner.should_sample(parent_context, trace_id, name, *args, **kwargs)

    def get_description(self) -> str:
        return "Asked"


class Started(SpanProcessor):
    def __init__(self) -> None:
        self.names: list[str] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.names.append(span.name)


class Traced:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.sampler = Asked()
        self.started = Started()
        self.provider = TracerProvider(sampler=self.sampler)
        self.provider.add_span_processor(self.started)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("app")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        found = list(self.exporter.get_finished_spans())
        return [s for s in found if name is None or s.name == name]


@pytest.fixture
def traced() -> Iterator[Traced]:
    t = Traced()
    instrument(tracer_provider=t.provider)
    try:
        yield t
    finally:
        uninstrument()


@pytest.fixture
def vqueue(server: EmbeddedServer, qname: str) -> Iterator[Queue]:
    q = Queue(qname, url=server.url, clock=VirtualClock())
    yield q
    q.close()


def test_one_trace_across_the_request_the_task_and_its_retry(traced: Traced, vqueue: Queue) -> None:
    worker = Worker(vqueue)

    @worker.handler("charge", max_attempts=3, jitter=0, backoff=[30])
    def charge(task: Task) -> None:
        if task.attempt == 1:
            raise ConnectionError("payment service down")

    with traced.tracer.start_as_current_span("POST /orders") as request:
        vqueue.schedule("charge", {"order": 1}, task_id="charge:1", delay=60)
    out = drain(worker, until=timedelta(minutes=5))
    assert [(r.attempt, r.outcome) for r in out.ran] == [(1, "retry"), (2, "done")]

    (req,) = traced.spans("POST /orders")
    (send,) = traced.spans(f"send {vqueue.name}")
    first, second = sorted(traced.spans(f"process {vqueue.name}"), key=lambda s: s.start_time or 0)
    trace_id = request.get_span_context().trace_id
    assert {s.context.trace_id for s in (req, send, first, second) if s.context} == {trace_id}
    assert send.kind is SpanKind.PRODUCER and send.parent is not None
    assert send.parent.span_id == req.context.span_id  # type: ignore[union-attr]
    assert send.attributes is not None and send.attributes["messaging.message.id"] == "charge:1"
    assert send.attributes["messaging.system"] == "delayq"
    assert send.attributes["messaging.destination.name"] == vqueue.name
    assert send.attributes["messaging.operation.type"] == "send"
    for attempt, span in ((1, first), (2, second)):
        assert span.kind is SpanKind.CONSUMER
        assert span.parent is not None and span.parent.span_id == send.context.span_id  # type: ignore[union-attr]
        attrs = span.attributes or {}
        assert attrs["messaging.operation.type"] == "process"
        assert attrs["messaging.message.id"] == "charge:1"
        assert attrs["delayq.task.kind"] == "charge"
        assert attrs["delayq.attempt"] == attempt
        assert isinstance(attrs["delayq.lateness_ms"], float)
    assert first.status.status_code is StatusCode.ERROR
    assert [e.name for e in first.events] == ["exception"]
    assert (first.events[0].attributes or {})["exception.type"] == "ConnectionError"
    assert (first.attributes or {})["delayq.outcome"] == "error"
    assert second.status.status_code is not StatusCode.ERROR
    assert (second.attributes or {})["delayq.outcome"] == "done"


def test_retry_discard_and_fail_are_outcomes_not_errors(traced: Traced, vqueue: Queue) -> None:
    worker = Worker(vqueue)

    @worker.handler("k", max_attempts=2, jitter=0, backoff=[1])
    def k(task: Task) -> None:
        match task.payload, task.attempt:
            case "retry", 1:
                raise Retry(after=1, reason="later")
            case "discard", _:
                raise Discard("nothing to do")
            case "fail", _:
                raise Fail("bad input")

    vqueue.schedule_many([TaskSpec("k", p, task_id=p) for p in ("retry", "discard", "fail")])
    drain(worker, until=timedelta(minutes=1))
    outcomes = sorted(
        ((s.attributes or {})["messaging.message.id"], (s.attributes or {})["delayq.outcome"])
        for s in traced.spans(f"process {vqueue.name}")
    )
    assert outcomes == [
        ("discard", "discard"),
        ("fail", "fail"),
        ("retry", "done"),
        ("retry", "retry"),
    ]
    assert all(
        s.status.status_code is not StatusCode.ERROR and not s.events
        for s in traced.spans(f"process {vqueue.name}")
    )
    (batch,) = traced.spans(f"send {vqueue.name}")
    assert (batch.attributes or {})["messaging.batch.message_count"] == 3


async def test_asyncio_queue_and_worker(traced: Traced, server: EmbeddedServer, qname: str) -> None:
    queue = AsyncQueue(qname, url=server.url, clock=VirtualClock())
    worker = Worker(queue)
    seen: list[str] = []

    @worker.handler("ping")
    async def ping(task: Task) -> None:
        seen.append(task.headers.get("traceparent", ""))

    with traced.tracer.start_as_current_span("job") as parent:
        await queue.schedule("ping", task_id="p")
    await adrain(worker)
    await queue.close()
    trace_hex = format(parent.get_span_context().trace_id, "032x")
    assert len(seen) == 1 and seen[0].split("-")[1] == trace_hex
    (process,) = traced.spans(f"process {qname}")
    assert (
        process.context is not None
        and process.context.trace_id == parent.get_span_context().trace_id
    )


def test_uninstrument_stops_tracing_and_restores_the_queue(
    server: EmbeddedServer, qname: str
) -> None:
    original = Queue.schedule
    t = Traced()
    instrument(tracer_provider=t.provider)
    instrument(tracer_provider=t.provider)  # idempotent
    assert is_instrumented() and Queue.schedule is not original
    uninstrument()
    assert not is_instrumented() and Queue.schedule is original
    with Queue(qname, url=server.url) as q:
        q.schedule("k", task_id="x")
        info = q.get("x")
    assert info is not None and "traceparent" not in info.headers
    assert t.spans() == []


def test_without_the_extra_the_import_names_the_pip_command() -> None:
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "try:\n"
        "    import delayq.contrib.opentelemetry\n"
        "except ImportError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (
        "MissingExtra delayq.contrib.opentelemetry needs the otel extra: pip install 'delayq[otel]'"
    )


def test_uninstrument_after_the_hook_lists_were_reset_still_forgets_it() -> None:
    """Found by review: uninstrument() raised ValueError when the lists had been reset (as
    a test fixture does), and instrument() then did nothing for the rest of the process."""
    from delayq import hooks

    saved = list(hooks.middleware), list(hooks.before_schedule)
    instrument(tracer_provider=Traced().provider)
    hooks.middleware[:], hooks.before_schedule[:] = saved
    uninstrument()
    assert not is_instrumented() and hooks.middleware == saved[0]
    instrument(tracer_provider=Traced().provider)
    try:
        assert is_instrumented() and len(hooks.middleware) == len(saved[0]) + 1
    finally:
        uninstrument()


def test_the_send_span_names_the_kind_when_it_is_passed_by_keyword(
    traced: Traced, vqueue: Queue
) -> None:
    """Found by review: only a positional kind reached the span's delayq.task.kind."""
    vqueue.schedule(kind="charge", payload={"order": 2}, task_id="charge:2", delay=60)
    (send,) = traced.spans(f"send {vqueue.name}")
    assert (send.attributes or {})["delayq.task.kind"] == "charge"


UNSAMPLED = SpanContext(
    0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, False, TraceFlags(0)
)
PROCESS_ATTRIBUTES = {
    "messaging.system",
    "messaging.destination.name",
    "messaging.message.id",
    "messaging.operation.type",
    "messaging.operation.name",
    "delayq.task.kind",
    "delayq.attempt",
    "delayq.lateness_ms",
    "delayq.outcome",
}


def test_an_unsampled_trace_starts_no_span_but_passes_on_to_what_the_handler_schedules(
    traced: Traced, vqueue: Queue
) -> None:
    """Issue 30 item 5: an attempt whose parent is not sampled starts no span at all (before,
    the tracer was asked for one, and a sampler that does not follow its parent recorded it),
    and the tasks its handler schedules are in the same trace, still not sampled."""
    worker = Worker(vqueue)

    @worker.handler("parent")
    def parent(task: Task) -> None:
        vqueue.schedule("child", task_id="child", delay=60)

    with trace.use_span(NonRecordingSpan(UNSAMPLED)):
        vqueue.schedule("parent", task_id="parent")
    drain(worker, until=timedelta(seconds=1))

    process = f"process {vqueue.name}"
    assert process not in traced.sampler.names  # the tracer was never asked for the span
    assert process not in traced.started.names
    assert traced.spans() == []  # neither the sends nor the attempt recorded anything
    info = vqueue.get("child")
    assert info is not None and info.state == "scheduled"
    version, trace_id, span_id, flags = info.headers["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", format(UNSAMPLED.trace_id, "032x"), "00")
    assert span_id != format(UNSAMPLED.span_id, "016x")  # the child's send, not the request


async def test_an_unsampled_parent_keeps_its_baggage_and_trace_state(
    traced: Traced, server: EmbeddedServer, qname: str
) -> None:
    """Headers the fast path does not read (baggage, tracestate) go through the propagator:
    the handler sees the baggage, and what it schedules carries both on."""
    queue = AsyncQueue(qname, url=server.url, clock=VirtualClock())
    worker = Worker(queue)
    seen: list[object] = []

    @worker.handler("parent")
    async def parent(task: Task) -> None:
        seen.append(baggage.get_baggage("tenant"))
        await queue.schedule("child", task_id="child", delay=60)

    tp = f"00-{UNSAMPLED.trace_id:032x}-{UNSAMPLED.span_id:016x}-00"
    headers = {"traceparent": tp, "tracestate": "vendor=1", "baggage": "tenant=a"}
    uninstrument()  # scheduled as a producer in another language would: these headers only
    try:
        await queue.schedule("parent", task_id="parent", headers=headers)
    finally:
        instrument(tracer_provider=traced.provider)
    await adrain(worker)
    info = await queue.get("child")
    await queue.close()
    assert seen == ["a"] and traced.spans() == []
    assert f"process {qname}" not in traced.sampler.names
    assert info is not None and info.headers["traceparent"].endswith("-00")
    assert info.headers["traceparent"].split("-")[1] == f"{UNSAMPLED.trace_id:032x}"
    assert info.headers["tracestate"] == "vendor=1" and info.headers["baggage"] == "tenant=a"


def test_a_sampled_attempt_and_a_root_attempt_have_every_attribute(
    traced: Traced, vqueue: Queue
) -> None:
    """The attributes of a recorded attempt, whether its parent was sampled (given at the
    span's start) or it has none (the sampler decides; the rest are set afterwards)."""
    worker = Worker(vqueue)

    @worker.handler("k")
    def k(task: Task) -> None:
        return None

    vqueue.schedule("k", task_id="sampled")
    uninstrument()
    try:
        vqueue.schedule("k", task_id="root")  # no traceparent: a root span
    finally:
        instrument(tracer_provider=traced.provider)
    drain(worker, until=timedelta(seconds=1))
    (send,) = traced.spans(f"send {vqueue.name}")
    spans = {
        (s.attributes or {})["messaging.message.id"]: s
        for s in traced.spans(f"process {vqueue.name}")
    }
    assert set(spans) == {"sampled", "root"}
    assert (
        spans["sampled"].parent is not None
        and spans["sampled"].parent.span_id == send.context.span_id
    )
    assert spans["root"].parent is None
    for task_id, span in spans.items():
        attrs = dict(span.attributes or {})
        assert set(attrs) == PROCESS_ATTRIBUTES
        lateness = attrs.pop("delayq.lateness_ms")
        assert isinstance(lateness, float)
        assert attrs == {
            "messaging.system": "delayq",
            "messaging.destination.name": vqueue.name,
            "messaging.message.id": task_id,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "delayq.task.kind": "k",
            "delayq.attempt": 1,
            "delayq.outcome": "done",
        }
        assert span.kind is SpanKind.CONSUMER


@pytest.mark.parametrize(
    "traceparent",
    [
        f"00-{'0' * 32}-b7ad6b7169203331-00",  # an invalid trace id
        f"00-0af7651916cd43dd8448eb211c80319c-{'0' * 16}-00",  # an invalid span id
        "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-00",  # upper case
    ],
)
def test_a_traceparent_the_propagator_ignores_leaves_the_attempt_a_root(
    traced: Traced, vqueue: Queue, traceparent: str
) -> None:
    """The fast path reads only what the propagator reads as a parent: with any other
    traceparent the attempt is a root, the sampler's to decide (here: recorded)."""
    worker = Worker(vqueue)

    @worker.handler("k")
    def k(task: Task) -> None:
        return None

    uninstrument()
    try:
        vqueue.schedule("k", task_id="x", headers={"traceparent": traceparent})
    finally:
        instrument(tracer_provider=traced.provider)
    drain(worker, until=timedelta(seconds=1))
    (span,) = traced.spans(f"process {vqueue.name}")
    assert span.parent is None and (span.attributes or {})["messaging.message.id"] == "x"


def test_a_propagator_that_does_not_read_traceparent_is_followed(
    traced: Traced, vqueue: Queue
) -> None:
    """Found by review: the fast path checked only that the propagator reads no header
    beyond the W3C ones, so a baggage-only propagator's worker read traceparent anyway."""
    from opentelemetry import propagate
    from opentelemetry.baggage.propagation import W3CBaggagePropagator

    worker = Worker(vqueue)

    @worker.handler("k")
    def k(task: Task) -> None:
        return None

    tp = f"00-{UNSAMPLED.trace_id:032x}-{UNSAMPLED.span_id:016x}-00"
    uninstrument()
    try:
        vqueue.schedule("k", task_id="x", headers={"traceparent": tp})
    finally:
        instrument(tracer_provider=traced.provider)
    configured = propagate.get_global_textmap()
    propagate.set_global_textmap(W3CBaggagePropagator())
    try:
        drain(worker, until=timedelta(seconds=1))
    finally:
        propagate.set_global_textmap(configured)
    (span,) = traced.spans(f"process {vqueue.name}")  # not a parent to it: a root
    assert span.parent is None and span.context is not None
    assert span.context.trace_id != UNSAMPLED.trace_id
