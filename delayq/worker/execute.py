"""Running one attempt of a task and deciding its outcome. No Redis here: the outcome goes
to the Finisher, which writes it.

Outcomes: return -> done; ``Discard`` -> done, not retried; ``Fail`` -> dead now; ``Retry``
-> again after its delay; any other exception -> again after the handler's backoff, or dead
with the traceback once the attempts are spent. Every attempt is counted. A task of a kind
with no handler here is handed back, its attempt not counted, until ``unknown_kind_grace``
has passed (``unknown.py``).

The handler runs through the worker's middleware (``WorkerContext.invoke``); with none, an
async handler without a timeout is awaited directly. Logs: a finished attempt is one DEBUG
record (``FINISHED``, with its ``duration`` and ``lateness``), a failed attempt that will be
retried one WARNING record, the attempt that leaves a task dead one ERROR record, each with
the exception (``exc_info``: its traceback from the handler's frame on, as the stored
``last_error``) and the ``task_id``, ``kind``, ``attempt`` and ``queue`` as extra fields
(:func:`log_fields`). While the handler runs, ``delayq.logs.CURRENT`` holds its task, so
whatever it logs names the task too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import traceback
from collections.abc import Callable
from types import TracebackType
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
from delayq.logs import CURRENT
from delayq.task import Task
from delayq.timing import seconds
from delayq.worker.context import ATTEMPT, ThreadOwner, WorkerContext
from delayq.worker.events import EventName, TaskEvent
from delayq.worker.outcome import Outcome
from delayq.worker.registry import Handler
from delayq.worker.unknown import DEFAULT_GRACE_S, UnknownKinds

log = logging.getLogger("delayq.worker")

# A finished attempt's line. DEBUG, not INFO: ``delayq worker`` logs at INFO by default, and
# a line per task there costs the worker more than the rest of a short task's run does
# (docs/observability.md has the figures); a failure is logged at WARNING or ERROR anyway.
FINISHED = logging.DEBUG

# Where the frames a traceback starts with are the worker's, not the handler's: the executor,
# the context's invoke and call, the middleware's layers, the handler threads, the features'
# internal handlers, delayq's own middleware (contrib/: OpenTelemetry's), and asyncio's waits
# between them.
_WORKER_DIR = os.path.dirname(os.path.abspath(__file__))
_INTERNAL = (
    _WORKER_DIR + os.sep,
    os.path.join(os.path.dirname(_WORKER_DIR), "contrib") + os.sep,
    os.path.dirname(os.path.abspath(asyncio.__file__)) + os.sep,
)
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def from_handler(e: BaseException) -> ExcInfo:
    """``e`` as ``exc_info`` whose traceback starts at the first frame that is not the
    worker's (the handler's, or a middleware's of the user's): the frames before it say
    nothing about the failure. None for an exception the worker raised itself (a timeout)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_INTERNAL):
        tb = tb.tb_next
    return type(e), e, tb


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
    def __init__(self, ctx: WorkerContext, unknown_kind_grace_s: float = DEFAULT_GRACE_S) -> None:
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
        self.virtual = ctx.core.clock  # a test's virtual clock, else None: this machine's
        # Told of every exception a handler raised, before it is classified (drain()'s
        # raise_errors); None in a serving worker.
        self.on_failure: Callable[[Task, BaseException], None] | None = None
        self._hooks: set[asyncio.Task[None]] = set()  # on_dead hooks of buried_unread
        # Tasks of kinds with no handler here: handed back, then buried (unknown.py).
        self.unknown = UnknownKinds(unknown_kind_grace_s, self.buried_unread)

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
        exc: ExcInfo | None = None,
        late: float = -1.0,
    ) -> Outcome:
        """Bury the task, with one ERROR record: ``summary`` (else the reason's first line)
        and ``exc``, the exception that killed it, with its traceback."""
        self._dead(claimed, reason, duration, summary, exc)
        await self._fire_on_dead(task, claimed.id, reason)
        return Outcome("bury", claimed.id, claimed.token, "", reason, claimed.shard, late)

    def _dead(
        self,
        claimed: Claimed,
        reason: str,
        duration: float | None = None,
        summary: str | None = None,
        exc: ExcInfo | None = None,
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

    def prepare(self, claimed: Claimed) -> tuple[Task, Handler] | str | None:
        """The task and its handler, the reason it can never run (it will be buried), or
        None: its kind has no handler here (it will be handed back)."""
        handler = self.registry.get(claimed.header.kind)
        if handler is None:
            return None
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
        if prepared is None:
            return self._hand_back(claimed)
        if isinstance(prepared, str):
            return await self._bury(None, claimed, prepared)
        task, handler = prepared
        started(task)
        if owner is not None and (handler.internal or not handler.is_async):
            # It may call a thread (a sync handler; an internal one calling the user's
            # function): set in this attempt's own context (a copy per run), no other's.
            ATTEMPT.set(owner)
        reset = CURRENT.set(task)  # what the handler logs names its task (delayq/logs.py)
        try:
            t0 = time.perf_counter()
            late = self._lateness(claimed)
            if self.events.listeners:
                self.emit("started", claimed, lateness=late)
            try:
                if handler.is_async and handler.timeout is None and (self.bare or handler.internal):
                    value = await handler.fn(task)  # the usual case, one coroutine frame fewer
                else:
                    # cron, expiry: they invoke the user's function themselves
                    call = self.call if handler.internal else self.invoke
                    value = await call(handler, task)  # (a coroutine frame fewer than a helper)
            except asyncio.CancelledError as e:
                if _cancelled_by_us():
                    self._stopped(claimed, task, time.perf_counter() - t0)
                    raise
                # The handler raised it itself (nobody cancelled the task it runs in): a failed
                # attempt like any other, or it would be handed back and run again forever.
                took = time.perf_counter() - t0
                return await self._failed(handler, task, claimed, e, took, late)
            except (Exception, SystemExit) as e:  # sys.exit() fails the task, not the worker
                if task.aborted:  # (TaskAborted, say): not a failure; nothing is written
                    self.emit("aborted", claimed, duration=time.perf_counter() - t0)
                    raise asyncio.CancelledError(f"task {task.id} was aborted") from None
                took = time.perf_counter() - t0
                return await self._failed(handler, task, claimed, e, took, late)
            value = None if handler.internal else value
            return await self._succeeded(task, claimed, value, time.perf_counter() - t0, late)
        finally:
            CURRENT.reset(reset)  # (drain() runs attempts one after another in one context)

    async def _succeeded(
        self, task: Task, claimed: Claimed, value: Any, took: float, late: float
    ) -> Outcome:
        """A handler returned ``value``: kept as its result, or dead when it cannot be (not
        JSON, or over the queue's max_result)."""
        result = ""
        if value is not None:
            try:
                result = encode_result(value, self.max_result)
            except InvalidTaskError as e:
                return await self._bury(task, claimed, str(e), took, late=late)
        if self.events.listeners:
            self.emit("succeeded", claimed, duration=took)
        if log.isEnabledFor(FINISHED):
            self._finished(claimed, task, took)
        tomb = self._tomb(claimed)
        return Outcome(
            "ack", task.id, task.token, "", "", claimed.shard, late, task.kind, result, tomb
        )

    def _tomb(self, claimed: Claimed) -> str:
        """A finished task's tombstone but its kind's code: "<attempt> <ms from its due time
        to now> " (lib/tombstone.lua), made here so the server's one thread does no string
        work for it."""
        h = claimed.header
        return tombstone_prefix(h.attempts, h.due_ms, self.now_ms())

    def _lateness(self, claimed: Claimed) -> float:
        """Its start's lateness (s), on the clock its due time is on (for the dashboard's
        history, and the metric); -1 for a task claimed with no due time."""
        due_ms = claimed.header.due_ms
        if due_ms is None:
            return -1.0
        virtual = self.virtual
        return (time.time() if virtual is None else virtual.now_ms() / 1000) - due_ms / 1000

    def _hand_back(self, claimed: Claimed) -> Outcome:
        """A kind with no handler here: handed back (or, its grace over, buried: the write
        says which, and ``unknown`` tells ``buried_unread`` of it)."""
        reason = self.unknown.met(claimed, self.queue, self.registry.kinds())
        self.emit("unknown_kind", claimed)
        return Outcome("handback", claimed.id, claimed.token, "", reason, claimed.shard)

    def _finished(self, claimed: Claimed, task: Task, took: float) -> None:
        """The finished attempt's line (``FINISHED``): how long its handler ran and how late
        it started after its due time (on this machine's clock)."""
        due_ms = claimed.header.due_ms
        late = None if not due_ms else round(time.time() - took - due_ms / 1000, 6)
        fields = log_fields(task.id, task.kind, task.attempt, self.queue)
        fields["duration"], fields["lateness"] = round(took, 6), late
        log.log(
            FINISHED,
            "task %s (%s) attempt %d succeeded in %.3f s%s",
            task.id,
            task.kind,
            task.attempt,
            took,
            "" if late is None else f", started {late:.3f} s after its due time",
            extra=fields,
        )

    def _stopped(self, claimed: Claimed, task: Task, duration: float) -> None:
        """The attempt was cancelled by the worker: aborted, its lease lost, or shutdown."""
        if task.aborted:
            self.emit("aborted", claimed, duration=duration)
        elif task.lease_lost.is_set():
            self.emit("lease_lost", claimed, duration=duration)

    async def _failed(
        self,
        handler: Handler,
        task: Task,
        claimed: Claimed,
        e: BaseException,
        duration: float,
        late: float,
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
                "discard", task.id, task.token, "", "", claimed.shard, late, task.kind, "", tomb
            )
        unexpected = v.failed and v.reason is None  # not Fail: the traceback is the text
        exc = from_handler(e)
        text = "".join(traceback.format_exception(*exc)) if unexpected else v.error
        if v.failed:
            self.emit("failed", claimed, duration=duration, error=v.error)
        if v.outcome == "dead":
            attempts = f"attempt {task.attempt} of {task.max_attempts}"
            reason = v.reason
            if reason is None:
                reason = f"{attempts} failed:\n{text}"
            summary = f"{attempts} failed: {v.error}" if unexpected else reason
            return await self._bury(
                task, claimed, reason, duration, summary=summary, exc=exc, late=late
            )
        if unexpected:
            log.warning(
                "task %s (%s) attempt %d of %d failed, will retry: %s",
                task.id,
                task.kind,
                task.attempt,
                task.max_attempts,
                v.error,
                exc_info=exc,
                extra=fields,
            )
        self.emit("retried", claimed, duration=duration)
        due = _retry_after(handler, task.attempt, v.after)
        return Outcome("retry", task.id, task.token, due, text, claimed.shard, late)
