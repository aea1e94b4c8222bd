"""Running one attempt of a task and deciding its outcome. No Redis here: the outcome goes
to the Finisher, which writes it.

Outcomes: return -> done; ``Discard`` -> done, not retried; ``Fail`` -> dead now; ``Retry``
-> again after its delay; any other exception -> again after the handler's backoff, or dead
with the traceback once the attempts are spent. Every attempt is counted.

The handler runs through the worker's middleware (``WorkerContext.invoke``); with none, an
async handler without a timeout is awaited directly. Logs: a failed attempt that will be
retried is one WARNING record, the attempt that leaves a task dead one ERROR record, each
with the exception (``exc_info``: its traceback) and the ``task_id``, ``kind``, ``attempt``
and ``queue`` as extra fields (:func:`log_fields`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable
from typing import Any

from delayq.backoff import delay_for
from delayq.codec import (
    Codec,
    RecordError,
    decode_headers,
    decode_payload,
    encode_result,
    tombstone_prefix,
)
from delayq.errors import InvalidTaskError
from delayq.leasing import Claimed
from delayq.task import Task
from delayq.timing import seconds
from delayq.worker.context import ATTEMPT, ThreadOwner, WorkerContext
from delayq.worker.events import EventName, TaskEvent
from delayq.worker.outcome import Outcome
from delayq.worker.registry import Handler

log = logging.getLogger("delayq.worker")


def _retry_after(h: Handler, attempt: int, requested: float | None) -> str:
    try:
        delay = delay_for(attempt, h.backoff, h.jitter)
    except Exception as e:  # the handler's backoff function is broken: not the task's fault
        delay = delay_for(attempt)
        log.warning("%s: backoff of %r failed (%r); using the default", h.kind, h.fn, e)
    if requested is not None:
        try:
            delay = seconds(requested, "Retry(after=...)")
        except InvalidTaskError as e:  # the handler's mistake must not wedge the task
            log.warning("%s; using the handler's backoff (%.1f s) instead", e, delay)
    return "+" + str(round(delay * 1000))


def log_fields(task_id: str, kind: str, attempt: int, queue: str) -> dict[str, Any]:
    """The ``extra`` of the records about one attempt: fields of the LogRecord, which a
    JSON formatter (``delayq worker --log-format json``) or Sentry shows."""
    return {"task_id": task_id, "kind": kind, "attempt": attempt, "queue": queue}


def _cancelled_by_us() -> bool:
    """Whether the task running this attempt was cancelled (shutdown, a lost lease, a
    timeout), as opposed to a handler raising CancelledError of its own accord."""
    current = asyncio.current_task()
    return current is not None and current.cancelling() > 0


def build_task(claimed: Claimed, queue: str, codecs: dict[str, Codec]) -> Task:
    """Decode the payload and headers; raises RecordError for either, unreadable."""
    h = claimed.header
    return Task.claimed(
        claimed.id,
        h.kind,
        decode_payload(h, claimed.payload, codecs),
        h.attempts,
        h.max_attempts,
        h.due_ms if h.due_ms is not None else 0,
        queue,
        h.token,
        decode_headers(h.headers) if h.headers else None,  # None: {} on first read
    )


class Executor:
    def __init__(self, ctx: WorkerContext) -> None:
        self.registry = ctx.registry
        self.queue = ctx.core.name
        self.codecs = ctx.core.codecs
        self.max_result = ctx.core.max_result
        self.now_ms = ctx.now_ms
        self.events = ctx.events
        self.invoke = ctx.invoke
        self.call = ctx.call  # without the middleware: for the internal handlers
        self.bare = ctx.chain is None  # no middleware: the fast path below is allowed
        self.classify = ctx.classify
        # Told of every exception a handler raised, before it is classified (drain()'s
        # raise_errors); None in a serving worker.
        self.on_failure: Callable[[Task, BaseException], None] | None = None
        self._hooks: set[asyncio.Task[None]] = set()  # on_dead hooks of buried_unread

    def emit(self, name: EventName, claimed: Claimed, **fields: Any) -> None:
        """Tell the listeners (metrics, logs) what became of an attempt of ``claimed``."""
        if not self.events.listeners:
            return  # nobody listens: skip building the event
        h = claimed.header
        self.events.emit(TaskEvent(name, self.queue, h.kind, claimed.id, h.attempts, **fields))

    async def _bury(
        self,
        task: Task | None,
        claimed: Claimed,
        reason: str,
        duration: float | None = None,
        *,
        summary: str | None = None,
        exc: BaseException | None = None,
    ) -> Outcome:
        """Bury the task, with one ERROR record: ``summary`` (else the reason's first line)
        and ``exc``, the exception that killed it, with its traceback."""
        self._dead(claimed, reason, duration, summary, exc)
        await self._fire_on_dead(task, claimed.id, reason)
        return Outcome("bury", claimed.id, claimed.token, "", reason, claimed.shard)

    def _dead(
        self,
        claimed: Claimed,
        reason: str,
        duration: float | None = None,
        summary: str | None = None,
        exc: BaseException | None = None,
    ) -> None:
        first = reason.splitlines()[0] if reason else ""
        self.emit("dead", claimed, duration=duration, error=first)
        h = claimed.header
        log.error(
            "task %s (%s) is dead: %s",
            claimed.id,
            h.kind,
            summary or first,
            exc_info=exc,
            extra=log_fields(claimed.id, h.kind, h.attempts, self.queue),
        )

    def buried_unread(self, claimed: Claimed, reason: str) -> None:
        """A claimed row that could not become a task was buried (worker/unreadable.py;
        ``claimed`` as text): the ERROR record, event and on_dead hooks of any task buried
        here. The hooks run in a task of their own: they are called from the claim loop,
        which a slow hook must not hold up."""
        self._dead(claimed, reason)
        if self.registry.on_dead:
            hooks = asyncio.get_running_loop().create_task(
                self._fire_on_dead(None, claimed.id, reason)
            )
            self._hooks.add(hooks)  # (a task the loop alone refers to may be collected)
            hooks.add_done_callback(self._hooks.discard)

    async def _fire_on_dead(self, task: Task | None, task_id: str, reason: str) -> None:
        for hook in self.registry.on_dead:
            try:
                result = hook(task_id, reason, task)
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("on_dead hook %r failed", hook)

    def prepare(self, claimed: Claimed) -> tuple[Task, Handler] | str:
        """The task and its handler, or the reason it can never run here (it will be buried)."""
        handler = self.registry.get(claimed.header.kind)
        if handler is None:
            return (
                f"no handler for kind {claimed.header.kind!r} on this worker "
                f"(registered: {', '.join(self.registry.kinds()) or 'none'})"
            )
        try:
            task = build_task(claimed, self.queue, self.codecs)
        except RecordError as e:
            return str(e)
        if handler.load is not None:  # a TaskType's: its payload type, or dead
            try:
                task.payload = handler.load(task.payload)
            except Exception as e:  # (its own __post_init__ may raise anything)
                return handler.refused(e) if handler.refused is not None else str(e)
        task.max_attempts = handler.attempts_allowed(claimed.header.max_attempts)
        if task.attempt < 1:  # an attempts entry past 2**63, as Redis gives a Lua number
            return (
                f"attempt number {task.attempt} is out of range: its attempts entry holds a "
                "number delayq never writes, so another program wrote it"
            )
        if task.attempt > task.max_attempts:
            return (
                f"attempt {task.attempt} of at most {task.max_attempts}: no attempts left "
                "(earlier attempts lost their lease)"
            )
        return task, handler

    async def run(
        self,
        claimed: Claimed,
        started: Callable[[Task], object],
        owner: ThreadOwner | None = None,
    ) -> Outcome:
        """One attempt of ``claimed``: ``started(task)`` just before its handler is called;
        ``owner`` is told of a handler thread that outlives its call (see
        :data:`~delayq.worker.context.ATTEMPT`), the run that holds its slot."""
        prepared = self.prepare(claimed)
        if isinstance(prepared, str):
            return await self._bury(None, claimed, prepared)
        task, handler = prepared
        started(task)
        if owner is not None and (handler.internal or not handler.is_async):
            # It may call a thread (a sync handler; an internal one calling the user's
            # function): set in this attempt's own context (a copy per run), no other's.
            ATTEMPT.set(owner)
        t0 = time.perf_counter()
        if self.events.listeners:
            self.emit("started", claimed, lateness=time.time() - task.due_at.timestamp())
        try:
            if handler.is_async and handler.timeout is None and (self.bare or handler.internal):
                value = await handler.fn(task)  # the usual case, one coroutine frame fewer
            elif handler.internal:  # cron, expiry: they invoke the user's function themselves
                value = await self.call(handler, task)
            else:
                value = await self.invoke(handler, task)
        except asyncio.CancelledError as e:
            if _cancelled_by_us():
                self._stopped(claimed, task, time.perf_counter() - t0)
                raise
            # The handler raised it itself (nobody cancelled the task it runs in): a failed
            # attempt like any other, or it would be handed back and run again forever.
            return await self._failed(handler, task, claimed, e, time.perf_counter() - t0)
        except (Exception, SystemExit) as e:  # sys.exit() fails the task, not the worker
            if task.aborted:  # (TaskAborted, say): not a failure; nothing is written
                self.emit("aborted", claimed, duration=time.perf_counter() - t0)
                raise asyncio.CancelledError(f"task {task.id} was aborted") from None
            return await self._failed(handler, task, claimed, e, time.perf_counter() - t0)
        if value is not None and not handler.internal:
            return await self._returned(task, claimed, value, time.perf_counter() - t0)
        if self.events.listeners:
            self.emit("succeeded", claimed, duration=time.perf_counter() - t0)
        return Outcome(
            "ack", task.id, task.token, "", "", claimed.shard, task.kind, "", self._tomb(claimed)
        )

    def _tomb(self, claimed: Claimed) -> str:
        """A finished task's tombstone but its kind's code: "<attempt> <ms from its due time
        to now> " (lib/tombstone.lua), made here so the server's one thread does no string
        work for it."""
        h = claimed.header
        return tombstone_prefix(h.attempts, h.due_ms, self.now_ms())

    async def _returned(self, task: Task, claimed: Claimed, value: Any, took: float) -> Outcome:
        """A handler returned ``value``: kept as its result, or dead when it cannot be (not
        JSON, or over the queue's max_result)."""
        try:
            result = encode_result(value, self.max_result)
        except InvalidTaskError as e:
            return await self._bury(task, claimed, str(e), took)
        if self.events.listeners:
            self.emit("succeeded", claimed, duration=took)
        tomb = self._tomb(claimed)
        return Outcome("ack", task.id, task.token, "", "", claimed.shard, task.kind, result, tomb)

    def _stopped(self, claimed: Claimed, task: Task, duration: float) -> None:
        """The attempt was cancelled by the worker: aborted, its lease lost, or shutdown."""
        if task.aborted:
            self.emit("aborted", claimed, duration=duration)
        elif task.lease_lost.is_set():
            self.emit("lease_lost", claimed, duration=duration)

    async def _failed(
        self, handler: Handler, task: Task, claimed: Claimed, e: BaseException, duration: float
    ) -> Outcome:
        """Act on what an exception from the handler means (see the module docstring)."""
        if self.on_failure is not None:
            self.on_failure(task, e)
        v = self.classify(e, task)
        if v.outcome == "deferred":
            return Outcome("release", task.id, task.token, f"+{v.due_ms}", "", claimed.shard)
        fields = log_fields(task.id, task.kind, task.attempt, self.queue)
        if v.outcome == "discarded":
            log.info("task %s (%s) discarded: %s", task.id, task.kind, v.error, extra=fields)
            self.emit("discarded", claimed, duration=duration)
            tomb = self._tomb(claimed)
            return Outcome(
                "discard", task.id, task.token, "", "", claimed.shard, task.kind, "", tomb
            )
        unexpected = v.failed and v.reason is None  # not Fail: the traceback is the text
        text = "".join(traceback.format_exception(e)) if unexpected else v.error
        if v.failed:
            self.emit("failed", claimed, duration=duration, error=v.error)
        if v.outcome == "dead":
            attempts = f"attempt {task.attempt} of {task.max_attempts}"
            reason = v.reason
            if reason is None:
                reason = f"{attempts} failed:\n{text}"
            summary = f"{attempts} failed: {v.error}" if unexpected else reason
            return await self._bury(task, claimed, reason, duration, summary=summary, exc=e)
        if unexpected:
            log.warning(
                "task %s (%s) attempt %d of %d failed, will retry: %s",
                task.id,
                task.kind,
                task.attempt,
                task.max_attempts,
                v.error,
                exc_info=e,
                extra=fields,
            )
        self.emit("retried", claimed, duration=duration)
        due = _retry_after(handler, task.attempt, v.after)
        return Outcome("retry", task.id, task.token, due, text, claimed.shard)
