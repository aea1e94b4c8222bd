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


async def _drain(url: str, n: int, traceparents: list[str] | None, traced: Any) -> float:
    queue = AsyncQueue(f"otel-{time.monotonic_ns()}", url=url)
    if traceparents is None:
        specs = [TaskSpec("noop", i) for i in range(n)]
    else:
        specs = [
            TaskSpec("noop", i, headers={"traceparent": t}) for i, t in enumerate(traceparents)
        ]
    await queue.schedule_many(specs)  # not instrumented yet: each task keeps its traceparent
    if traced is not None:
        instrument(tracer_provider=traced)  # before serving: the worker takes its middleware
    worker = Worker(queue, concurrency=64)

    @worker.handler("noop")
    async def noop(task: Task) -> None:
        return None

    serving = asyncio.create_task(worker.serve())
    cpu0 = time.process_time()
    while (await queue.stats()).done < n:
        await asyncio.sleep(0.02)
    if traced is not None:
        traced.force_flush()  # the export thread's work is inside the window
    cpu = time.process_time() - cpu0
    worker.stop()
    await serving
    await queue.close()
    return cpu / n * 1e6


def drain(url: str, n: int, mode: str) -> tuple[float, int]:
    """CPU us per task of a drain in ``mode`` (plain, unsampled, sampled) and the spans the
    exporter saw."""
    if mode == "plain":
        return asyncio.run(_drain(url, n, None, None)), 0
    provider, exporter = _provider(n)
    try:
        tps = _traceparents(n, sampled=mode == "sampled")
        cpu_us = asyncio.run(_drain(url, n, tps, provider))
    finally:
        uninstrument()
        provider.shutdown()
    return cpu_us, exporter.spans


def floor(n: int, queue: str = "otel-floor") -> tuple[float, int]:
    """CPU us per span of the SDK alone, making the span delayq makes for an attempt."""
    provider, exporter = _provider(n)
    tracer = provider.get_tracer("delayq")
    parents = []
    for tp in _traceparents(n, sampled=True):
        remote = trace.SpanContext(int(tp[3:35], 16), int(tp[36:52], 16), True, trace.TraceFlags(1))
        parents.append(trace.set_span_in_context(trace.NonRecordingSpan(remote)))
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
                "messaging.message.id": "0123456789abcdef",
                "delayq.attempt": 1,
                "delayq.lateness_ms": 1.5 + i,
            },
        )
        span.set_attribute("delayq.outcome", "done")
        span.end()
    provider.force_flush()
    cpu = time.process_time() - cpu0
    provider.shutdown()
    return cpu / n * 1e6, exporter.spans


def run(rep: Report) -> None:
    n = rep.n(N)
    cpu: dict[str, list[float]] = {"plain": [], "unsampled": [], "sampled": [], "floor": []}
    with fresh_server(appendonly=False) as srv:
        for i in range(ROUNDS):
            for mode in cpu:
                cpu_us, spans = floor(n) if mode == "floor" else drain(srv.url, n, mode)
                cpu[mode].append(cpu_us)
                rep.line(
                    f"round {i + 1} {mode:9}: {cpu_us:6.1f} us CPU/"
                    f"{'span' if mode == 'floor' else 'task'}, {spans:,} spans exported"
                )
                want = 0 if mode in ("plain", "unsampled") else n
                if spans != want:
                    raise AssertionError(f"{mode}: {spans} spans exported, expected {want}")
    rep.figure("cpu_us_per_task", cpu)
    plain, unsampled, sampled, sdk = (median(v) for v in cpu.values())
    rep.line(
        f"median CPU: plain {plain:.1f} us/task, unsampled {unsampled:.1f} us/task, sampled"
        f" {sampled:.1f} us/task; the SDK's span alone {sdk:.1f} us"
    )
    rep.bar("unsampled / plain CPU per task", unsampled / plain, "<=", UNSAMPLED_BAR, "x")
    rep.line(f"sampled: plain + {(sampled - plain):.1f} us; bar plain + {SAMPLED_BAR * sdk:.1f} us")
    rep.bar(
        "(sampled - plain) / the SDK's span, CPU", (sampled - plain) / sdk, "<=", SAMPLED_BAR, "x"
    )
