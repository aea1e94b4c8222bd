"""OpenTelemetry's cost: a drain with ``instrument()`` against the same drain without.

20,000 no-op tasks (async handler) due at once on a fresh server (AOF off), drained by one
in-process ``Worker`` (concurrency 64) until ``stats().done`` reaches the count; this
process's CPU time per task, and the wall time. Instrumented, every attempt is a CONSUMER
span made by the OpenTelemetry SDK (``TracerProvider``, ``BatchSpanProcessor``) and handed to
an exporter that drops it, so the figure is what tracing costs the worker, not what a
collector costs. Runs alternate plain / instrumented / instrumented with 10% of traces
sampled (parent-based: a task follows its producer's decision), 3 each; the bar: always-on
instrumented costs at most 2x the plain CPU per task (medians). The sampled figure is
reported beside it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from common import Report, fresh_server, median
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from delayq import AsyncQueue, Task, TaskSpec, Worker
from delayq.contrib.opentelemetry import instrument, uninstrument

NAME = "otel"
TITLE = "OpenTelemetry: a drain's worker CPU per task with instrument() and without"
N = 20_000
ROUNDS = 3
BAR = 2.0


class Dropping(SpanExporter):
    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


async def _drain(url: str, n: int) -> tuple[float, float]:
    queue = AsyncQueue(f"otel-{time.monotonic_ns()}", url=url)
    await queue.schedule_many([TaskSpec("noop", i) for i in range(n)])
    worker = Worker(queue, concurrency=64)

    @worker.handler("noop")
    async def noop(task: Task) -> None:
        return None

    serving = asyncio.create_task(worker.serve())
    cpu0, t0 = time.process_time(), time.perf_counter()
    while (await queue.stats()).done < n:
        await asyncio.sleep(0.02)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    worker.stop()
    await serving
    await queue.close()
    return cpu / n * 1e6, wall


def one(url: str, n: int, traced: bool, ratio: float = 1.0) -> tuple[float, float, int]:
    exporter = Dropping()
    provider: Any = None
    if traced:
        provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
        provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=n * 2))
        instrument(tracer_provider=provider)
    try:
        cpu_us, wall = asyncio.run(_drain(url, n))
    finally:
        if traced:
            uninstrument()
            provider.shutdown()  # flushes: the exporter has seen every span
    return cpu_us, wall, exporter.spans


def run(rep: Report) -> None:
    n = rep.n(N)
    plain: list[float] = []
    traced: list[float] = []
    sampled: list[float] = []
    with fresh_server(appendonly=False) as srv:
        for i in range(ROUNDS):
            for label, on, ratio, into in (
                ("plain       ", False, 1.0, plain),
                ("instrumented", True, 1.0, traced),
                ("sampled 10% ", True, 0.1, sampled),
            ):
                cpu_us, wall, spans = one(srv.url, n, on, ratio)
                into.append(cpu_us)
                rep.line(
                    f"round {i + 1} {label}: {cpu_us:.1f} us CPU/task, {n / wall:,.0f} tasks/s"
                    + (f", {spans:,} spans exported" if on else "")
                )
    rep.figure("cpu_us_per_task", {"plain": plain, "instrumented": traced, "sampled": sampled})
    rep.line(
        f"median CPU per task: plain {median(plain):.1f} us, instrumented {median(traced):.1f}"
        f" us, sampled 10% (ParentBased(TraceIdRatioBased(0.1))) {median(sampled):.1f} us"
    )
    rep.bar("instrumented / plain CPU per task", median(traced) / median(plain), "<=", BAR, "x")
    rep.line(f"sampled 10% / plain: {median(sampled) / median(plain):.2f} x (no bar)")
