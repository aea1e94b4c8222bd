"""A nightly report from a cron schedule, once per night however many workers run.

At 02:00 on Shanghai's clock the worker counts the previous day's orders by status (from a
SQLite ``orders`` table: it reads ``status``, ``qty`` and ``created_at``, so it can point at
the database of ``examples/fastapi_orders``) and writes them to a JSON file. An hourly
sweep deletes reports older than 30 days.

    @worker.cron("0 2 * * *", tz="Asia/Shanghai", name="daily-report")
    @worker.every(3600, name="report-sweep")

Every worker process declares both schedules; there is no leader and no scheduler process.
Each occurrence is an ordinary task with the id ``cron:daily-report:<time in ms>``, the same
in every process, so it runs once (docs/cron.md). "Once" is at least once, like any task: a
run whose worker died runs again. The report is therefore written to a temporary file and
renamed to a name derived from the occurrence, so a second run replaces it with the same
report instead of adding another.

Run it (an embedded server unless ``--url``, ``DELAYQ_REDIS_URL`` or ``REDIS_URL`` names one;
two workers, the report every second instead of every night):

    python examples/nightly_report.py

In production, run as many workers as you like with

    REPORTS_DATABASE=orders.db REPORTS_DIR=reports delayq worker examples.nightly_report:make_worker

and ``delayq cron list -q reports`` shows the next and the last run of each schedule.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, closing
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from delayq import Queue, Task, Worker
from delayq.embedded import EmbeddedServer
from delayq.timing import Clock

log = logging.getLogger("nightly_report")

REPORT = "daily-report"  # the schedules' names are their identity in Redis: keep them fixed
SWEEP = "report-sweep"
CRON = "0 2 * * *"
TZ = "Asia/Shanghai"


def make_worker(
    database: str | Path | None = None,
    reports: str | Path | None = None,
    *,
    queue: str = "reports",
    redis_url: str | None = None,
    cron: str = CRON,
    tz: str = TZ,
    every: float | None = None,
    sweep_every: float = 3600,
    keep_days: float = 30,
    on_report: Callable[[Task, Path], None] | None = None,
    clock: Clock | None = None,
) -> Worker:
    """The report worker (``delayq worker`` calls it with no arguments).

    Args:
        database: the SQLite file with the ``orders`` table (default: ``REPORTS_DATABASE``,
            else ``orders.db``).
        reports: the directory reports go to (default: ``REPORTS_DIR``, else ``reports``).
        cron, tz: when the report runs: a five-field cron expression on the wall clock of an
            IANA zone. A bad one raises ``ConfigurationError`` here, before anything runs.
        every: run the report every this many seconds instead (the tests and the demo).
        sweep_every: seconds between sweeps; keep_days: the age a report is swept at.
        on_report: called with the task and the file after each report is written.
        clock: for tests, a ``delayq.testing.VirtualClock`` (docs/testing.md).
    """
    database = str(database or os.environ.get("REPORTS_DATABASE", "orders.db"))
    out = Path(reports or os.environ.get("REPORTS_DIR", "reports"))
    worker = Worker(Queue(queue, url=redis_url, clock=clock), concurrency=4)
    # Checked here, when the decorator is made: an expression that cannot fire (or a zone
    # that does not exist) fails at start-up, not at 02:00.
    if every is None:
        schedule = worker.cron(cron, tz=tz, name=REPORT)
    else:
        schedule = worker.every(every, name=REPORT)
    zone = ZoneInfo(tz)
    out.mkdir(parents=True, exist_ok=True)

    @schedule
    def daily_report(task: Task) -> None:
        # task.payload: {"schedule": "daily-report", "at": <occurrence, ms>, "time": "..."}.
        # The occurrence's time, not the clock: a run that starts late (after an outage, or
        # again after a crash) still reports on the day it was meant for.
        at = datetime.fromtimestamp(task.payload["at"] / 1000, zone)
        day = at.date() - timedelta(days=1)
        report: dict[str, Any] = {"occurrence": at.isoformat(), "day": day.isoformat(), "tz": tz}
        report |= count_orders(database, day, zone)
        path = out / f"{REPORT}-{at:%Y-%m-%dT%H%M%S%z}.json"
        write_atomically(path, json.dumps(report, indent=2, sort_keys=True) + "\n")
        log.info("wrote %s: %d orders on %s", path, report["total"]["orders"], day)
        if on_report is not None:
            on_report(task, path)

    @worker.every(sweep_every, name=SWEEP)
    def sweep_old_reports(task: Task) -> None:
        # Idempotent: a file another run deleted first is simply not there any more.
        cutoff = time.time() - keep_days * 86400
        for path in out.glob(f"{REPORT}-*"):  # reports, and temporary files a crash left
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    log.info("swept %s", path)

    return worker


def count_orders(database: str, day: date, zone: ZoneInfo) -> dict[str, Any]:
    """Orders created on ``day`` (midnight to midnight in ``zone``): count and units per
    status, and in total."""
    start = datetime.combine(day, datetime.min.time(), zone)
    end = datetime.combine(day + timedelta(days=1), datetime.min.time(), zone)
    with closing(sqlite3.connect(database, timeout=30)) as conn:
        rows = conn.execute(
            "SELECT status, COUNT(*), COALESCE(SUM(qty), 0) FROM orders"
            " WHERE created_at >= ? AND created_at < ? GROUP BY status ORDER BY status",
            (start.timestamp(), end.timestamp()),
        ).fetchall()
    by_status = {status: {"orders": n, "units": units} for status, n, units in rows}
    total = {"orders": sum(n for _, n, _ in rows), "units": sum(u for _, _, u in rows)}
    return {"by_status": by_status, "total": total}


def write_atomically(path: Path, text: str) -> None:
    """Readers see the old report or the new one, never half of one."""
    temp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
    temp.write_text(text)
    os.replace(temp, path)


# -- running this file: two workers, a report every second --------------------------------------

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS orders ("
    " id TEXT PRIMARY KEY, status TEXT NOT NULL, qty INTEGER NOT NULL, created_at REAL NOT NULL)"
)


def create_orders(database: str | Path, orders: list[tuple[str, str, int, float]]) -> None:
    """A minimal ``orders`` table (the columns the report reads) with (id, status, qty,
    created_at) rows."""
    with closing(sqlite3.connect(database)) as conn, conn:
        conn.execute(SCHEMA)
        conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", orders)


def sample_orders(now: float) -> list[tuple[str, str, int, float]]:
    """Orders from yesterday (reported), today and last week (not)."""
    day = 86400.0
    statuses = ["paid", "paid", "paid", "closed", "pending"]
    yesterday = [(f"y{i}", s, i + 1, now - day - i) for i, s in enumerate(statuses)]
    return [*yesterday, ("t0", "paid", 9, now), ("w0", "paid", 9, now - 7 * day)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Two workers, a report every second.")
    parser.add_argument(
        "--url",
        default=os.environ.get("DELAYQ_REDIS_URL") or os.environ.get("REDIS_URL"),
        help="Redis URL (default: $DELAYQ_REDIS_URL, $REDIS_URL, else an embedded server)",
    )
    parser.add_argument("--reports", type=int, default=3, help="occurrences to wait for")
    args = parser.parse_args(argv)
    logging.getLogger("delayq").setLevel(logging.CRITICAL)  # the table below says it all

    with ExitStack() as stack:
        url = args.url or stack.enter_context(EmbeddedServer(appendonly=False)).url
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="reports-")))
        database, reports = tmp / "orders.db", tmp / "reports"
        create_orders(database, sample_orders(time.time()))
        queue = stack.enter_context(Queue(f"nightly-report-{os.getpid()}", url=url))
        runs: list[tuple[int, str, Path]] = []  # (occurrence ms, worker, file) per run
        lock = threading.Lock()
        threads = []
        for n in (1, 2):

            def record(task: Task, path: Path, n: int = n) -> None:
                with lock:
                    runs.append((task.payload["at"], f"worker {n}", path))

            worker = make_worker(
                database, reports, queue=queue.name, redis_url=url, every=1, on_report=record
            )
            runner = threading.Thread(target=lambda w=worker: asyncio.run(w.serve()), daemon=True)
            runner.start()
            threads.append((worker, runner))
        deadline = time.monotonic() + 10 + args.reports
        while len(runs) < args.reports and time.monotonic() < deadline:
            time.sleep(0.05)
        for worker, runner in threads:
            worker.stop()
            runner.join(30)

        print(f"{'occurrence':<26} {'ran on':<9} {'orders':>6} {'units':>5}  by status")
        for _, who, path in sorted(runs):
            report = json.loads(path.read_text())
            statuses = ", ".join(f"{s} {c['orders']}" for s, c in report["by_status"].items())
            total = report["total"]
            print(
                f"{report['occurrence']:<26} {who:<9} {total['orders']:>6} {total['units']:>5}"
                f"  {statuses}"
            )
        occurrences = [at for at, _, _ in runs]
        files = sorted(reports.glob(f"{REPORT}-*.json"))
        infos = [queue.get(f"cron:{REPORT}:{at}") for at in occurrences]
        ok = (
            len(occurrences) >= args.reports
            and len(set(occurrences)) == len(occurrences) == len(files)
            and all(i is not None and i.state == "done" and i.attempts == 1 for i in infos)
        )
        print(f"{len(occurrences)} occurrences, {len(files)} report files, across 2 workers")
        print(f"in production: {CRON!r} on {TZ}'s clock, by as many workers as you run")
        print("each occurrence reported once" if ok else "AN OCCURRENCE WAS MISSED OR REPEATED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
