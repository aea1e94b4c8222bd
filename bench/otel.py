"""OpenTelemetry's cost: a drain with ``instrument()`` against the same drain without, and
against the SDK's own cost of the span it makes.

20,000 no-op tasks (async handler) due at once on a fresh server (AOF off), drained by one
in-process ``Worker`` (concurrency 64) until ``stats().done`` reaches the count; this
process's CPU time per task (every thread's: the ``BatchSpanProcessor``'s export thread
too, flushed inside the window). Four runs per round, alternating, in one process:

- plain: no instrumentation; the tasks carry no headers;
- unsampled: ``instrument()``, each task scheduled by its own trace (a random trace id) that
  was not sampled (``traceparent`` flags 00), as a producer with a ratio sampler leaves
  most tasks;
- sampled: the same with the sampled flag on (01): every attempt is a recording CONSUMER
  span;
- SDK floor: no delayq at all: start and end, through the same ``TracerProvider``
  (``ParentBased(ALWAYS_ON)``), ``BatchSpanProcessor`` and exporter (which drops the spans),
  one CONSUMER span per task with the attributes delayq sets on an attempt, the child of a
  remote sampled parent (made beforehand: propagation is delayq's cost, not the SDK's).

Medians over the rounds. The bars (issue 30, item 5): unsampled <= 1.2x plain, and sampled
<= plain + 1.5x the SDK floor, that is (sampled - plain) / floor <= 1.5.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import Any

from common import Report, fresh_server, median
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import SpanKind

from delayq import AsyncQueue, Task, TaskSpec, Worker
from delayq.contrib.opentelemetry import instrument, uninstrument

NAME = "otel"
TITLE = "OpenTelemetry: a drain's worker CPU per task, unsampled and sampled, against the SDK's"
N = 20_000
ROUNDS = 5
UNSAMPLED_BAR = 1.2  # x plain
SAMPLED_BAR = 1.5  # x the SDK's span, over plain


class Dropping(SpanExporter):
    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def _provider(n: int) -> tuple[TracerProvider, Dropping]:
    exporter = Dropping()
    provider = TracerProvider(sampler=ParentBased(ALWAYS_ON))
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=n * 2))
    return provider, exporter


def _traceparents(n: int, sampled: bool) -> list[str]:
    flags = "01" if sampled else "00"
    rand = random.Random(n + sampled)
    return [
        f"00-{rand.getrandbits(128) | 1:032x}-{rand.getrandbits(64) | 1:016x}-{flags}"
        for _ in range(n)
    ]


def _parents(traceparents: list[str]) -> dict[str, Any]:
    """Task id -> its remote sampled parent's context, made beforehand for the floor's runs
    (reading the headers is delayq's cost, not the SDK's)."""
    out = {}
    for i, tp in enumerate(traceparents):
        remote = trace.SpanContext(int(tp[3:35], 16), int(tp[36:52], 16), True, trace.TraceFlags(1))
        out[f"t{i}"] = trace.set_span_in_context(trace.NonRecordingSpan(remote))
    return out


def _span_only(tracer: trace.Tracer, parents: dict[str, Any]) -> Any:
    """A middleware making what the SDK makes for an attempt, and nothing else: one CONSUMER
    span with delayq's eight attributes (the lateness a constant), its outcome, its end."""

    async def span_only(task: Task, call_next: Any) -> Any:
        span = tracer.start_span(
            f"process {task.queue}",
            context=parents[task.id],
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "delayq",
                "messaging.destination.name": task.queue,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "delayq.task.kind": task.kind,
                "messaging.message.id": task.id,
                "delayq.attempt": task.attempt,
                "delayq.lateness_ms": 1.5,
            },
        )
        try:
            return await call_next(task)
        finally:
            span.set_attribute("delayq.outcome", "done")
            span.end()

    return span_only


def _lookup_only(parents: dict[str, Any]) -> Any:
    """The same middleware without the span: what the floor's runs cost besides the SDK."""

    async def lookup_only(task: Task, call_next: Any) -> Any:
        parents[task.id]  # (as span_only looks its parent up)
        return await call_next(task)

    return lookup_only


async def _drain(
    url: str,
    n: int,
    traceparents: list[str] | None,
    traced: Any = None,
    middleware: Any = None,
    flush: Any = None,
) -> float:
    queue = AsyncQueue(f"otel-{time.monotonic_ns()}", url=url)
    if traceparents is None:
        specs = [TaskSpec("noop", i, task_id=f"t{i}") for i in range(n)]
    else:
        specs = [
            TaskSpec("noop", i, task_id=f"t{i}", headers={"traceparent": t})
            for i, t in enumerate(traceparents)
        ]
    await queue.schedule_many(specs)  # not instrumented yet: each task keeps its traceparent
    if traced is not None:
        instrument(tracer_provider=traced)  # before serving: the worker takes its middleware
    worker = Worker(queue, concurrency=64)
    if middleware is not None:
        worker.middleware(middleware)

    @worker.handler("noop")
    async def noop(task: Task) -> None:
        return None

    serving = asyncio.create_task(worker.serve())
    cpu0 = time.process_time()
    while (await queue.stats()).done < n:
        await asyncio.sleep(0.02)
    if flush is not None:
        flush()  # the export thread's work is inside the window
    cpu = time.process_time() - cpu0
    worker.stop()
    await serving
    await queue.close()
    return cpu / n * 1e6


def drain(url: str, n: int, mode: str) -> tuple[float, int]:
    """CPU us per task of a drain in ``mode`` and the spans the exporter saw: plain;
    unsampled and sampled (instrument()); sdk and lookup (the floor's: a middleware making
    the SDK's span and no more, and the same without the span)."""
    if mode == "plain":
        return asyncio.run(_drain(url, n, None)), 0
    provider, exporter = _provider(n)
    try:
        if mode in ("unsampled", "sampled"):
            tps = _traceparents(n, sampled=mode == "sampled")
            cpu_us = asyncio.run(_drain(url, n, tps, provider, flush=provider.force_flush))
        else:
            parents = _parents(_traceparents(n, sampled=True))
            tracer = provider.get_tracer("delayq")
            mw = _span_only(tracer, parents) if mode == "sdk" else _lookup_only(parents)
            cpu_us = asyncio.run(_drain(url, n, None, middleware=mw, flush=provider.force_flush))
    finally:
        uninstrument()
        provider.shutdown()
    return cpu_us, exporter.spans


def tight(n: int, queue: str = "otel-floor") -> float:
    """CPU us per span of the same span made in a loop, no worker around it (caches hot:
    a lower figure than the SDK's in a worker; shown, not a bar)."""
    provider, _ = _provider(n)
    tracer = provider.get_tracer("delayq")
    parents = list(_parents(_traceparents(n, sampled=True)).values())
    name = f"process {queue}"
    cpu0 = time.process_time()
    for i, parent in enumerate(parents):
        span = tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "delayq",
                "messaging.destination.name": queue,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "delayq.task.kind": "noop",
                "messaging.message.id": f"t{i}",
                "delayq.attempt": 1,
                "delayq.lateness_ms": 1.5,
            },
        )
        span.set_attribute("delayq.outcome", "done")
        span.end()
    provider.force_flush()
    cpu = time.process_time() - cpu0
    provider.shutdown()
    return cpu / n * 1e6


MODES = ("plain", "unsampled", "sampled", "lookup", "sdk")
SPANS = {"plain": 0, "unsampled": 0, "sampled": 1, "lookup": 0, "sdk": 1}


def run(rep: Report) -> None:
    n = rep.n(N)
    cpu: dict[str, list[float]] = {mode: [] for mode in (*MODES, "tight")}
    with fresh_server(appendonly=False) as srv:
        for i in range(ROUNDS):
            for mode in MODES:
                cpu_us, spans = drain(srv.url, n, mode)
                cpu[mode].append(cpu_us)
                rep.line(f"round {i + 1} {mode:9}: {cpu_us:6.1f} us CPU/task, {spans:,} spans")
                if spans != SPANS[mode] * n:
                    raise AssertionError(f"{mode}: {spans} spans exported, not {SPANS[mode] * n}")
            cpu["tight"].append(tight(n))
            rep.line(f"round {i + 1} tight    : {cpu['tight'][-1]:6.1f} us CPU/span")
    rep.figure("cpu_us_per_task", cpu)
    m = {mode: median(v) for mode, v in cpu.items()}
    sdk = m["sdk"] - m["lookup"]
    rep.line(
        f"median CPU per task: plain {m['plain']:.1f} us, unsampled {m['unsampled']:.1f} us,"
        f" sampled {m['sampled']:.1f} us"
    )
    rep.line(
        f"the SDK's span in a worker: {m['sdk']:.1f} - {m['lookup']:.1f} = {sdk:.1f} us"
        f" (in a loop, caches hot: {m['tight']:.1f} us)"
    )
    rounds = [u / p for u, p in zip(cpu["unsampled"], cpu["plain"], strict=True)]
    rep.line("unsampled / plain, round by round: " + ", ".join(f"{r:.2f}" for r in rounds))
    rep.bar("unsampled / plain CPU per task", m["unsampled"] / m["plain"], "<=", UNSAMPLED_BAR, "x")
    rep.line(
        f"sampled: plain + {m['sampled'] - m['plain']:.1f} us;"
        f" bar: plain + {SAMPLED_BAR * sdk:.1f} us"
    )
    rep.bar(
        "(sampled - plain) / the SDK's span, CPU",
        (m["sampled"] - m["plain"]) / sdk,
        "<=",
        SAMPLED_BAR,
        "x",
    )
