"""Prometheus metrics: what a worker saw happen, and how each queue looks right now.

Two sources, never mixed under one name:

- :class:`WorkerMetrics` counts the events of the worker process it is attached to
  (``Worker.add_listener``): attempts started and their outcomes, lateness and run time,
  per ``queue`` and ``kind``. Per process, so they restart from zero with the process;
  Prometheus' ``rate()`` and ``increase()`` handle that.
- :class:`QueueCollector` reads each queue's state from Redis *when scraped* (one round trip
  for all queues), so an idle worker that nobody scrapes sends no extra command. Both the
  worker's exporter and the dashboard's ``/metrics`` serve it.

Labels are ``queue`` and ``kind`` only: never a task id (unbounded cardinality).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from delayq.admin import probes
from delayq.admin.inspect import Admin
from delayq.errors import DelayqError
from delayq.queue import AsyncQueue, Queue

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from delayq.worker import Worker
    from delayq.worker.events import TaskEvent

log = logging.getLogger("delayq.metrics")

# Lateness of a healthy worker is a few milliseconds; a backlog shows as seconds to hours.
LATENESS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip

LABELS = ("queue", "kind")

# Stats-hash counters with a metric of their own; the rest go to delayq_queue_events_total.
_OWN_NAME = {
    "scheduled": ("delayq_tasks_scheduled", "Tasks added to the queue (all producers)."),
    "leases_expired": (
        "delayq_leases_expired",
        "Leases that expired: the worker died or stalled, and the task was run again or buried.",
    ),
}


class QueueCollector(Collector):
    """Gauges and all-time counters of queues, read from Redis at scrape time.

    Args:
        admin: the inspector to read with.
        names: returns the queues to report (called on every scrape).
    """

    def __init__(self, admin: Admin, names: Callable[[], list[str]]) -> None:
        self.admin = admin
        self.names = names

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: Redis is only read when scraped

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("delayq_redis_up", "1 if Redis answered this scrape, else 0.")
        try:
            overviews = self.admin.overviews(self.names())
        except DelayqError as e:
            log.warning("metrics: cannot read queues from %s: %s", self.admin.where, e)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        gauges = {
            "scheduled": GaugeMetricFamily(
                "delayq_queue_scheduled", "Waiting tasks, due or not.", labels=["queue"]
            ),
            "due": GaugeMetricFamily(
                "delayq_queue_due", "Waiting tasks whose due time has passed.", labels=["queue"]
            ),
            "active": GaugeMetricFamily(
                "delayq_queue_active", "Tasks held by a worker (leased).", labels=["queue"]
            ),
            "dead": GaugeMetricFamily(
                "delayq_queue_dead", "Tasks in the dead set.", labels=["queue"]
            ),
            "aborted": GaugeMetricFamily(
                "delayq_queue_aborted",
                "Aborted tasks still remembered for the dedupe window.",
                labels=["queue"],
            ),
            "done": GaugeMetricFamily(
                "delayq_queue_done",
                "Finished tasks still remembered for the dedupe window.",
                labels=["queue"],
            ),
        }
        oldest = GaugeMetricFamily(
            "delayq_oldest_due_age_seconds",
            "How long the most overdue waiting task has been due (0 if none is due).",
            labels=["queue"],
        )
        workers = GaugeMetricFamily(
            "delayq_workers_alive",
            "Workers that claimed or heartbeat within three of their beats.",
            labels=["queue"],
        )
        own = {
            field: CounterMetricFamily(name, doc, labels=["queue"])
            for field, (name, doc) in _OWN_NAME.items()
        }
        events = CounterMetricFamily(
            "delayq_queue_events",
            "All-time transitions of the queue's tasks by any worker (succeeded, retried, "
            "dead, discarded, released, cancelled, aborted, replayed ...), from the queue's "
            "counters.",
            labels=["queue", "event"],
        )
        for ov in overviews:
            s, q = ov.stats, [ov.name]
            for field, family in gauges.items():
                family.add_metric(q, getattr(s, field))
            oldest.add_metric(q, s.oldest_due_age)
            workers.add_metric(q, len(ov.live_workers))
            for field, counter in own.items():
                counter.add_metric(q, s.counters.get(field, 0))
            for name, value in sorted(s.counters.items()):
                if name not in own:
                    events.add_metric([ov.name, name], value)
        yield from gauges.values()
        yield oldest
        yield workers
        yield from own.values()
        yield events


class WorkerMetrics:
    """Counters, histograms and a gauge fed by one worker's task events.

    ``delayq_consecutive_failures{queue, kind}`` is the number of attempts of that kind that
    failed in a row on this worker process (the handler raised, or the task was buried
    without running); a success or a discard resets it to 0. A value that keeps growing
    means every attempt fails: a broken dependency or a bad deploy, long before the
    retries run out and the dead set grows.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=registry)

        self.started = counter("delayq_tasks_started", "Attempts whose handler started.")
        self.succeeded = counter("delayq_tasks_succeeded", "Attempts whose handler returned.")
        self.discarded = counter(
            "delayq_tasks_discarded", "Attempts that raised Discard: done, not retried."
        )
        self.failed = counter(
            "delayq_tasks_failed", "Attempts whose handler raised (besides Retry and Discard)."
        )
        self.retried = counter("delayq_tasks_retried", "Attempts followed by another attempt.")
        self.dead = counter("delayq_tasks_dead", "Tasks this worker sent to the dead set.")
        self.lease_lost = counter(
            "delayq_leases_lost", "Attempts during which this worker lost the task's lease."
        )
        self.aborted = counter(
            "delayq_tasks_aborted",
            "Attempts stopped because their task was aborted (queue.abort); not failures.",
        )
        self.unknown_kind = counter(
            "delayq_tasks_unknown_kind",
            "Claims of tasks whose kind this worker has no handler for: handed back, the "
            "attempt not counted (buried once unknown_kind_grace has passed).",
        )
        self.lateness = Histogram(
            "delayq_task_lateness_seconds",
            "Start of the handler minus the task's due time.",
            LABELS,
            buckets=LATENESS_BUCKETS,
            registry=registry,
        )
        self.duration = Histogram(
            "delayq_task_duration_seconds",
            "How long the handler ran, whatever its outcome.",
            LABELS,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.consecutive = Gauge(
            "delayq_consecutive_failures",
            "Attempts of this kind that failed in a row on this worker (reset by a success).",
            LABELS,
            registry=registry,
            multiprocess_mode="livemax",  # worker processes of a supervisor: the worst live one
        )
        self.overrunning = Gauge(
            "delayq_sync_handlers_overrunning",
            "Sync handlers whose thread runs on past its attempt (its timeout passed, its "
            "lease was lost, it was aborted); each holds a slot until it returns.",
            LABELS,
            registry=registry,
            multiprocess_mode="livesum",  # worker processes of a supervisor: all live ones
        )
        # An attempt that fails sends "failed" then "retried" or "dead" at once: count its
        # duration and its failure once. Entries live for one event; the dict stays tiny.
        self._failed: set[tuple[str, int]] = set()

    def __call__(self, ev: TaskEvent) -> None:
        labels = (ev.queue, ev.kind)
        attempt = (ev.task_id, ev.attempt)
        if ev.event in _NO_OUTCOME:
            self._no_outcome(ev, labels)
            return
        followup = attempt in self._failed
        self._failed.discard(attempt)
        if ev.duration is not None and not followup:
            self.duration.labels(*labels).observe(ev.duration)
        if ev.event == "succeeded":
            self.succeeded.labels(*labels).inc()
            self.consecutive.labels(*labels).set(0)
        elif ev.event == "discarded":
            self.discarded.labels(*labels).inc()
            self.consecutive.labels(*labels).set(0)
        elif ev.event == "failed":
            self.failed.labels(*labels).inc()
            self.consecutive.labels(*labels).inc()
            self._failed.add(attempt)
        elif ev.event == "retried":
            self.retried.labels(*labels).inc()
        elif ev.event == "dead":
            self.dead.labels(*labels).inc()
            if not followup:
                self.consecutive.labels(*labels).inc()
        elif ev.event == "lease_lost":
            self.lease_lost.labels(*labels).inc()
        elif ev.event == "aborted":
            self.aborted.labels(*labels).inc()
        elif ev.event == "unknown_kind":
            self.unknown_kind.labels(*labels).inc()

    def _no_outcome(self, ev: TaskEvent, labels: tuple[str, str]) -> None:
        """The events that are no attempt's outcome: its start, a thread that outlives it."""
        if ev.event == "started":
            self.started.labels(*labels).inc()
            # Clock skew between worker and server can make it slightly negative.
            self.lateness.labels(*labels).observe(max(0.0, ev.lateness or 0.0))
        elif ev.event == "overrunning":  # (its attempt's outcome was counted already)
            self.overrunning.labels(*labels).inc()
        else:  # overrun_ended
            self.overrunning.labels(*labels).dec()


_NO_OUTCOME = frozenset({"started", "overrunning", "overrun_ended"})


def queue_admin(queue: Queue | AsyncQueue) -> Admin:
    """An inspector for a worker's queue, on its client when that is a blocking one."""
    return queues_admin([queue])


def queues_admin(queues: list[Queue | AsyncQueue]) -> Admin:
    """An inspector for a worker's queues (on one server, as a worker's are), on the first
    one's client when that is a blocking one."""
    first, names = queues[0], [q.name for q in queues]
    if isinstance(first, Queue):
        return Admin(first.url, queues=names, client=first.client, prefix=first.core.keys.prefix)
    # The worker's asyncio client belongs to its event loop; scrapes run in another thread.
    return Admin(first.url, queues=names, prefix=first.core.keys.prefix)


class MetricsServer:
    """A worker's ``/metrics`` HTTP endpoint, with ``/livez`` and ``/readyz``
    (``admin/probes.py``), in a thread; :meth:`stop` closes it."""

    def __init__(self, worker: Worker, port: int, host: str = "127.0.0.1") -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.events = WorkerMetrics(self.registry)
        self.admin = queues_admin(list(worker.queues))
        self.registry.register(QueueCollector(self.admin, lambda: list(self.admin.explicit)))
        worker.add_listener(self.events)
        self.server, self.thread = probes.start_server(
            port, host, self.registry, worker.health.verdict
        )
        self.port = int(self.server.server_address[1])
        self.host = host

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
        self.admin.close()


def serve_worker_metrics(worker: Worker, port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Count ``worker``'s events and serve them, with its queue's state, on ``host:port``."""
    return MetricsServer(worker, port, host)
