"""``schedule_on_commit``: schedule a task when the transaction commits, never if it rolls
back.

The id is made (or checked) at the call, with every other argument but the server's
answer: kind, delay or ``at``, attempts, headers, and the payload, encoded by the queue's
codec under its size limit. A bad task therefore fails the view inside its transaction,
which rolls back, rather than after the commit. The payload is scheduled as it was at the
call (its encoding, decoded again), whatever the caller changes later.

What can still fail after the commit is the schedule itself (Redis down, a timeout): the
row is committed and the task is not. The error is logged (``delayq.contrib.django``, with
the task's id and kind) and raised from the commit (``robust=False``, Django's default), or
only logged (``robust=True``: Django logs it too and runs the other callbacks). docs/django.md
says which order of writes loses nothing when that happens.
"""

from __future__ import annotations

import inspect
import logging
from datetime import UTC, datetime
from typing import Any, TypeVar, overload

from asgiref.sync import async_to_sync
from django.db import transaction

from delayq import check
from delayq.codec import encode_payload
from delayq.contrib.django import conf, declare
from delayq.contrib.django.queues import registry
from delayq.errors import ConfigurationError, Discard, InvalidTaskError
from delayq.queue import AsyncQueue, Queue
from delayq.spec import CheckedSpec, TaskType, new_task_id
from delayq.task import Task

log = logging.getLogger("delayq.contrib.django")
X = TypeVar("X")  # a typed task's payload type

OPTIONS = frozenset({"delay", "at", "task_id", "replace", "max_attempts", "durable", "headers"})


@overload
def schedule_on_commit(
    queue: Queue | str | None,
    kind: TaskType[X, Any],
    payload: X,
    *,
    using: str | None = None,
    robust: bool = False,
    outbox: bool = False,
    **options: Any,
) -> str: ...


@overload
def schedule_on_commit(
    queue: Queue | str | None,
    kind: str,
    payload: Any = None,
    *,
    using: str | None = None,
    robust: bool = False,
    outbox: bool = False,
    **options: Any,
) -> str: ...


def schedule_on_commit(
    queue: Queue | str | None,
    kind: Any,
    payload: Any = None,
    *,
    using: str | None = None,
    robust: bool = False,
    outbox: bool = False,
    **options: Any,
) -> str:
    """Schedule ``kind`` with ``payload`` on ``queue`` once the current transaction of the
    database ``using`` commits (at once outside a transaction), through
    ``transaction.on_commit``; nothing is scheduled if it rolls back.

    Args:
        queue: a ``Queue``, or the name of a queue of ``settings.DELAYQ["QUEUES"]`` (None:
            the only one configured).
        kind: the task's kind, or a :class:`~delayq.TaskType`, as ``Queue.schedule``
            takes it.
        payload: the handler's ``task.payload``, checked and copied now (for a TaskType,
            a value of its payload type, encoded now).
        using: the database alias whose transaction decides (as ``on_commit``'s).
        robust: as ``on_commit``'s: a failing schedule is logged and the commit's other
            callbacks still run, instead of raising from the commit.
        outbox: write the task in the transaction, as a row of ``delayq_outbox``, sent at
            the commit or, if that fails, by the worker's relay: nothing is lost when the
            process dies between the commit and the schedule (``DELAYQ["OUTBOX"]``;
            ``delay``, ``at``, ``task_id``, ``max_attempts`` and ``headers`` only).
        **options: those of ``Queue.schedule``: ``delay``, ``at``, ``task_id``,
            ``replace``, ``max_attempts``, ``durable``, ``headers``.

    Returns:
        The task's id, made now (or ``task_id``): store it with the row if you like.

    Raises:
        InvalidTaskError, PayloadTooLarge, ConfigurationError: at the call, for a task that
            could never be scheduled.
    """
    target = _queue(queue)
    robust = check.flag(robust, "schedule_on_commit(robust=)")
    outbox = check.flag(outbox, "schedule_on_commit(outbox=)")
    for name in ("replace", "durable"):  # as Queue.schedule checks them, before the commit
        check.flag(options.get(name, False), name, InvalidTaskError)
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise ConfigurationError(
            f"schedule_on_commit() got unknown option(s) {', '.join(unknown)} "
            f"(it takes {', '.join(sorted(OPTIONS))}, using, robust and outbox)"
        )
    task_id = options.get("task_id")
    if task_id is None:  # "", 0, False: refused below, as Queue.schedule refuses them
        task_id = new_task_id()
    if isinstance(kind, TaskType):  # from here on, its plain kind and JSON value
        kind, payload = kind.kind, kind.dump(payload)
    CheckedSpec(
        kind,
        None,
        options.get("delay"),
        options.get("at"),
        task_id,
        options.get("max_attempts", 0),
        options.get("headers"),
    )
    codec = target.core.codec
    payload = codec.decode(encode_payload(codec, payload, target.core.max_payload))
    scheduled = {**options, "task_id": task_id}
    config = conf.read()
    if outbox and not config.eager:
        from delayq.contrib.django import outbox as box  # its model needs the apps loaded

        box.write(target, kind, payload, task_id, scheduled, using)
        return task_id
    if config.eager:

        def run() -> None:
            run_eagerly(target, kind, payload, scheduled)

    else:

        def run() -> None:
            try:
                target.schedule(kind, payload, **scheduled)
            except Exception:
                log.error(
                    "task %s (%s) on queue %r was not scheduled after the commit",
                    task_id,
                    kind,
                    target.name,
                    exc_info=True,
                )
                raise

    transaction.on_commit(run, using=using, robust=robust)
    return task_id


def _queue(queue: Queue | str | None) -> Queue:
    if isinstance(queue, Queue):
        return queue
    if queue is None or isinstance(queue, str):
        return registry.queue(queue)
    hint = (
        " (an AsyncQueue cannot be awaited from a commit)" if isinstance(queue, AsyncQueue) else ""
    )
    raise ConfigurationError(
        f"schedule_on_commit() takes a Queue or a configured queue's name, got {queue!r}{hint}"
    )


def run_eagerly(queue: Queue, kind: Any, payload: Any, options: dict[str, Any]) -> None:
    """``DELAYQ["EAGER"]``: call the discovered handler of ``kind`` now, in this thread,
    whatever the delay (``Discard`` ends it quietly; any other exception propagates, as
    does the error of a payload that does not match a TaskType's payload type)."""
    name = getattr(kind, "kind", kind)
    found = declare.find_handler(queue.name, name)
    if found is None:
        raise ConfigurationError(
            f"DELAYQ['EAGER'] is on and no @delayq.contrib.django.handler({name!r}) was "
            f"found for queue {queue.name!r} in the apps' tasks modules"
        )
    declared = found.args[0]
    if isinstance(declared, TaskType):  # its handler gets the payload as its type
        payload = declared.load(payload)
    task = Task(
        options["task_id"],
        name,
        payload,
        1,
        options.get("max_attempts") or 1,
        datetime.now(UTC),
        queue.name,
        0,
        options.get("headers") or {},
    )
    try:
        if inspect.iscoroutinefunction(found.fn):
            async_to_sync(found.fn)(task)
        else:
            found.fn(task)
    except Discard:
        pass
