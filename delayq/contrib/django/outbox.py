"""The outbox: ``schedule_on_commit(..., outbox=True)`` writes the task as a row of the
``delayq_outbox`` table in the caller's transaction, so the task commits, or rolls back,
with the rows it is about; then relays it to Redis.

- At the commit, a callback schedules the task and deletes its row (the fast path: the task
  is in Redis a round trip after the commit, as without the outbox).
- If that does not happen (the process died between the commit and the callback, Redis
  was down, the delete failed), the row stays, and the worker's relay (``manage.py
  delayq_worker`` runs :func:`relay` every ``DELAYQ["OUTBOX_EVERY"]`` seconds, once across
  all workers) schedules it and deletes it, in one transaction: the schedule first, the
  delete after, so a relay that dies between the two leaves the row, and the next one
  schedules it again.
- Every schedule of a row uses the row's task id: a task sent twice (by the callback and the
  relay, or by two relays) is scheduled once; the second call finds it and changes nothing.
  So is its row written: a second call with the same ``task_id`` while the first row waits
  (in the same transaction, or left for the relay) writes nothing (insert-or-ignore, which
  does not abort the caller's transaction), and the first row is what is sent.
- The relay reads every database of ``settings.DATABASES`` that has the ``delayq_outbox``
  table (and that the routers let ``delayq`` migrate to), each in its own transaction: a task
  written with ``using="other"`` is relayed from ``other``.

The due time is fixed at the call: ``at``, or the queue's clock plus ``delay`` (this host's
clock, or a test's ``VirtualClock``), so a task relayed late keeps it (and runs at once if it
has passed). It is stored as a naive UTC datetime when ``USE_TZ`` is False (SQLite refuses
aware ones then), and read back as UTC.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections, router, transaction
from django.db.models import QuerySet
from django.utils import timezone

from delayq.contrib.django import conf
from delayq.contrib.django.models import OutboxTask
from delayq.contrib.django.queues import registry
from delayq.errors import ConfigurationError
from delayq.queue import Queue
from delayq.spec import TaskSpec
from delayq.task import Task
from delayq.timing import config_seconds

log = logging.getLogger("delayq.contrib.django")

OPTIONS = frozenset({"delay", "at", "task_id", "max_attempts", "headers"})
RELAY_SCHEDULE = "delayq-outbox"
# A row younger than this is left to its commit's callback, which is a round trip from
# sending it: the relay would only send it twice.
MIN_AGE_S = 2.0
BATCH = 500


def _due(queue: Queue, options: dict[str, Any]) -> datetime | None:
    at = options.get("at")
    if at is not None:
        return at if isinstance(at, datetime) else datetime.fromtimestamp(at, UTC)
    delay = options.get("delay")
    if delay is None:
        return None
    clock = queue.core.clock
    now_s = clock.now_ms() / 1000 if clock is not None else time.time()
    return datetime.fromtimestamp(now_s, UTC) + timedelta(seconds=config_seconds(delay, "delay"))


def write(
    queue: Queue,
    kind: str,
    payload: Any,
    task_id: str,
    options: dict[str, Any],
    using: str | None,
) -> None:
    """Write the task's row in the current transaction of ``using``, and send it when that
    commits (failing quietly: the row is there for the relay)."""
    if not conf.read().outbox:
        raise ConfigurationError(
            "schedule_on_commit(..., outbox=True) needs settings.DELAYQ['OUTBOX'] = True "
            "(and manage.py migrate, for the delayq_outbox table): the worker relays it"
        )
    unknown = sorted(set(options) - OPTIONS - {"task_id"})
    if unknown:
        raise ConfigurationError(
            f"schedule_on_commit(..., outbox=True) takes {', '.join(sorted(OPTIONS))}; "
            f"not {', '.join(unknown)}"
        )
    if not isinstance(kind, str):
        raise ConfigurationError("schedule_on_commit(..., outbox=True) takes a kind by name")
    due = _due(queue, options)
    if due is not None and not settings.USE_TZ:
        due = timezone.make_naive(due, UTC)  # naive UTC: read back as UTC (_spec)
    alias = using or "default"
    rows = OutboxTask.objects.using(alias)
    # Insert-or-ignore: a row of this id already waiting is kept, as Queue.schedule keeps a
    # task of this id, without an IntegrityError (which would abort the transaction).
    rows.bulk_create(
        [
            OutboxTask(
                task_id=task_id,
                queue=queue.name,
                kind=kind,
                payload=payload,
                due_at=due,
                max_attempts=options.get("max_attempts", 0),
                headers=options.get("headers"),
            )
        ],
        ignore_conflicts=True,
    )
    row = rows.get(pk=task_id)  # ours, or the first one's

    def send() -> None:
        try:
            _send(queue, [row], alias)
        except Exception:
            log.warning(
                "task %s (%s) was not scheduled at the commit: the outbox relay will",
                task_id,
                kind,
                exc_info=True,
            )

    transaction.on_commit(send, using=alias)


def _spec(row: OutboxTask) -> TaskSpec:
    at = row.due_at
    if at is not None and timezone.is_naive(at):  # USE_TZ = False: stored as naive UTC
        at = at.replace(tzinfo=UTC)
    return TaskSpec(
        row.kind,
        row.payload,
        at=at,
        task_id=row.task_id,
        max_attempts=row.max_attempts,
        headers=row.headers or None,
    )


def _send(queue: Queue, rows: Sequence[OutboxTask], alias: str) -> None:
    """Schedule the rows' tasks by their ids (a task already there is left unchanged), then
    delete the rows."""
    queue.schedule_many([_spec(r) for r in rows])
    OutboxTask.objects.using(alias).filter(pk__in=[r.task_id for r in rows]).delete()


def _pending(alias: str, older_than: datetime, limit: int) -> QuerySet[OutboxTask]:
    rows = OutboxTask.objects.using(alias).filter(created_at__lt=older_than)
    if connections[alias].features.has_select_for_update_skip_locked:
        rows = rows.select_for_update(skip_locked=True)  # two relays take different rows
    return rows.order_by("created_at")[:limit]


def databases() -> list[str]:
    """The aliases of ``settings.DATABASES`` the routers let ``delayq`` migrate to that have
    the ``delayq_outbox`` table, in their order (one that cannot be reached is logged and
    left out), each database once.
    """
    out, seen = [], set()
    for alias in connections:
        db = connections[alias].settings_dict
        where = (db["ENGINE"], db.get("HOST"), db.get("PORT"), db["NAME"])
        if where in seen or not router.allow_migrate_model(alias, OutboxTask):
            continue  # (two aliases of one database: relayed once)
        seen.add(where)
        try:
            with connections[alias].cursor() as cursor:
                tables = connections[alias].introspection.table_names(cursor)
        except DatabaseError:
            log.warning("outbox: database %r cannot be read", alias, exc_info=True)
            continue
        if OutboxTask._meta.db_table in tables:
            out.append(alias)
    return out


def relay(*, using: str | None = None, min_age: float = MIN_AGE_S, limit: int = BATCH) -> int:
    """Schedule the tasks left in the outbox of the database ``using`` (None: of each of
    :func:`databases`), rows older than ``min_age`` seconds, at most ``limit`` a database,
    then delete their rows, in one transaction a database. Returns how many were relayed.
    A row of a queue no longer configured is left, and logged."""
    if using is not None:
        return _relay(using, min_age, limit)
    relayed = 0
    for alias in databases():
        try:
            relayed += _relay(alias, min_age, limit)
        except Exception:  # one database down does not stop the others' relays
            log.error("outbox: the relay of database %r failed", alias, exc_info=True)
    return relayed


def _relay(using: str, min_age: float, limit: int) -> int:
    # timezone.now(): aware UTC, or naive local time when USE_TZ is False, as created_at is
    older_than = timezone.now() - timedelta(seconds=min_age)
    relayed = 0
    with transaction.atomic(using=using):
        by_queue: dict[str, list[OutboxTask]] = {}
        for row in _pending(using, older_than, limit):
            by_queue.setdefault(row.queue, []).append(row)
        configured = conf.read().queues
        for name, rows in by_queue.items():
            if name not in configured:
                log.error(
                    "%d outbox task(s) of queue %r left: it is not in settings.DELAYQ['QUEUES']",
                    len(rows),
                    name,
                )
                continue
            _send(registry.queue(name), rows, using)
            relayed += len(rows)
    if relayed:
        log.info("outbox: relayed %d task(s) left after their commit (%s)", relayed, using)
    return relayed


def relay_occurrence(task: Task) -> None:
    """The worker's periodic relay (``DELAYQ["OUTBOX"]``)."""
    relay()
