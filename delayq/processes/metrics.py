"""The Prometheus metrics of a ``--processes`` supervisor and its worker processes.

Each worker process records its task counters and histograms in prometheus-client's
multiprocess mode: files in a private directory the supervisor creates
(``PROMETHEUS_MULTIPROC_DIR``, set for the children only) and removes. The supervisor serves
them on the one ``--metrics-port``, added up over the children (``MultiProcessCollector``;
a child that exits is marked dead, so its live gauges go while its counts stay), beside the
queues' state read from Redis once per scrape by the supervisor itself, not per child. The
same port answers ``/livez`` and ``/readyz`` for all the children (``processes/health.py``).
"""

from __future__ import annotations

import shutil
import tempfile
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from delayq.admin import probes
from delayq.admin.metrics import QueueCollector, WorkerMetrics, queues_admin
from delayq.processes.health import HEALTH_ENV, ChildrenHealth, forget

if TYPE_CHECKING:
    from delayq.worker import Worker

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def record(worker: Worker) -> None:
    """Count ``worker``'s task events (in a worker process: into the multiprocess files)."""
    worker.add_listener(WorkerMetrics(CollectorRegistry()))


class SupervisorMetrics:
    """The supervisor's ``/metrics``: every child's counters added up, and the queues'
    gauges once. :meth:`env` is what a child needs; :meth:`stop` removes the directory."""

    def __init__(self, worker: Worker, port: int, host: str = "127.0.0.1") -> None:
        self.dir = tempfile.mkdtemp(prefix="delayq-metrics-")
        try:
            self.registry = CollectorRegistry()
            MultiProcessCollector(self.registry, path=self.dir)  # type: ignore[no-untyped-call]
            self.admin = queues_admin(list(worker.queues))
            self.registry.register(QueueCollector(self.admin, lambda: list(self.admin.explicit)))
            # /livez and /readyz: every child's (processes/health.py).
            self.health = ChildrenHealth(self.dir)
            self.server, self.thread = probes.start_server(
                port, host, self.registry, self.health.verdict
            )
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.port = int(self.server.server_address[1])
        self.host = host

    def env(self) -> dict[str, str]:
        return {MULTIPROC_ENV: self.dir, HEALTH_ENV: self.dir}

    def process_dead(self, pid: int) -> None:
        mark_process_dead(pid, self.dir)  # type: ignore[no-untyped-call]
        forget(self.dir, pid)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
        self.admin.close()
        shutil.rmtree(self.dir, ignore_errors=True)
