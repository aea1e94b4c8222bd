"""``queue.wait(id, timeout=...)``: the task's :class:`~delayq.task.TaskInfo` once it is done,
dead or aborted, without polling.

A wait looks at the task once with ``wait.lua``, which also enters its id in the queue's
``waits`` set for the time the caller waits; a script that finishes a task in that set (ack,
bury, abort; cancel too) publishes it on the shard's *finished* channel, which workers do not
listen to, and takes it out of the set. So a queue nobody waits on pays one ``ZCARD`` per
ack call, and a wait costs one script call, its message, and one more ``get`` only when its
time runs out (or the message came without the task: a death, an abort, a cancel).

The subscription is made before the look, so a task that finishes in between is announced
to a listener already there. One subscription (one connection) serves every wait of a queue
object, opened by its first wait and kept until ``close()``; the waiting threads (or
coroutines) take turns reading it. A message lost with the connection is made up for by a
look (``get``) of every wait then in progress, once the subscription is back: redis-py
connects and subscribes again by itself, and the server's new confirmation tells.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeGuard

from delayq.core import Op, QueueCore
from delayq.errors import TaskNotFound
from delayq.info import as_bytes
from delayq.scripts import Arg
from delayq.spec import validate_task_id
from delayq.task import TaskInfo
from delayq.timing import Duration, seconds

FINISHED = frozenset(("done", "dead", "aborted"))
# A cancelled task (get answers "cancelled" for the dedupe window since protocol 1.1) is
# waited for no more: TaskNotFound, as for an id never scheduled.
# A turn at reading the subscription lasts at most this long, so a thread waiting for another
# id hands it on soon after the message it waited for was read.
TURN_S = 0.25
MAX_WAIT_S = 86_400.0 * 366
# Script calls of one async queue's waits at once: a thousand waits gathered take turns
# rather than ask the client's pool for a thousand connections (it has 100 by default).
CALLS_AT_ONCE = 16
# How long a subscription's confirmation is waited for.
SUBSCRIBE_S = 10.0


def wait_ms(timeout: float) -> int:
    """How long the waits set keeps the entry: the timeout, and a second to spare."""
    return round(min(timeout, MAX_WAIT_S) * 1000) + 1000


def wait_op(core: QueueCore, task_id: str, for_ms: int) -> Op[TaskInfo | None]:
    """Look at a task once, and enter it in the waits set for ``for_ms`` if it has not
    finished: the script that finishes it then publishes it (wait.lua)."""
    tid = validate_task_id(task_id)
    args: dict[str, Arg] = {"now": core.now_arg(), "for_ms": max(1, for_ms), "id": tid}
    return core.op("wait", args, [], core.lookup_parser(tid))


def unknown(task_id: str, queue: str) -> TaskNotFound:
    return TaskNotFound(
        f"queue {queue!r} holds no task {task_id!r}: never scheduled, cancelled, or forgotten "
        "after its dedupe window"
    )


def read_message(data: Any, core_of: Callable[[str], QueueCore]) -> tuple[str, TaskInfo | None]:
    """A finished channel's message: (id, the task as get reads it, or None when the message
    holds the id alone). Raises ValueError for a message no delayq script wrote."""
    row = json.loads(data)
    if not isinstance(row, list) or not row or not isinstance(row[0], str):
        raise ValueError("not a finished message")
    tid = row[0]
    if len(row) < 7:
        return tid, None
    state, score, record, error, attempt, result = row[1:7]
    core = core_of(tid)
    return tid, core.task_info(
        tid,
        str(state),
        float(score),
        as_bytes(record),
        error or None,
        attempt or None,
        result or None,
    )


class Board:
    """What the waits of one queue object share: the messages read for ids waited on, and
    the count of subscriptions lost (a wait that sees it change looks at its task again)."""

    def __init__(self, core_of: Callable[[str], QueueCore]) -> None:
        self.core_of = core_of
        self.waiting: dict[str, int] = {}
        # id -> (its messages so far, the last one's task): kept until its last wait ends,
        # so that every wait of the id in this process sees it
        self.arrived: dict[str, tuple[int, TaskInfo | None]] = {}
        self.lost = 0
        self.channels: set[str] = set()

    def enter(self, tid: str) -> None:
        self.waiting[tid] = self.waiting.get(tid, 0) + 1

    def leave(self, tid: str) -> None:
        n = self.waiting.get(tid, 0) - 1
        if n > 0:
            self.waiting[tid] = n
        else:
            self.waiting.pop(tid, None)
            self.arrived.pop(tid, None)

    def quiet(self, step: Turn) -> bool:
        """Whether nothing came for the turn's id, and no subscription was lost, since the
        wait last looked: then its turn reads (or subscribes again)."""
        return self.arrived.get(step.tid, (0, None))[0] == step.seen and self.lost == step.lost

    def news(self, tid: str) -> tuple[int, TaskInfo | None, int]:
        """(messages for the id so far, the last one's task, subscriptions lost so far)."""
        count, info = self.arrived.get(tid, (0, None))
        return count, info, self.lost

    def confirms(self, message: Any, channel: str) -> bool:
        """Whether the message confirms the subscription to the channel (then it is noted);
        any other is posted."""
        if (
            message
            and message.get("type") == "subscribe"
            and _text(message.get("channel")) == channel
        ):
            self.channels.add(channel)
            return True
        self.post(message)
        return False

    def drop(self) -> None:
        """The subscription's connection went: every wait looks at its task again."""
        self.channels.clear()
        self.lost += 1

    def post(self, message: Any) -> None:
        if not message:
            return
        if message.get("type") == "subscribe" and _text(message.get("channel")) in self.channels:
            # redis-py's PubSub connected again and subscribed again by itself: what was
            # published in between is lost, so every wait looks at its task again
            self.lost += 1
            return
        if message.get("type") != "message":
            return
        try:
            tid, info = read_message(message["data"], self.core_of)
        except (ValueError, TypeError, KeyError):
            return  # not ours: written by another program
        if tid in self.waiting:
            self.arrived[tid] = (self.arrived.get(tid, (0, None))[0] + 1, info)


@dataclass(frozen=True)
class Look:
    """A step of the plan: run this op (wait.lua or get.lua) and send back its TaskInfo."""

    op: Op[TaskInfo | None]


@dataclass(frozen=True)
class Subscribe:
    """A step of the plan: be subscribed to the channel, under the waits' lock."""

    channel: str


@dataclass(frozen=True)
class Turn:
    """A step of the plan: take the waits' lock within ``timeout`` (else send back None); if
    nothing came for ``tid`` since its ``seen``-th message and no subscription was lost
    since ``lost``, read the subscription for up to ``timeout`` (or subscribe again); then
    send back ``board.news(tid)``."""

    channel: str
    tid: str
    seen: int
    lost: int
    timeout: float


Step = Look | Subscribe | Turn


def wait_plan(
    board: Board, core: QueueCore, tid: str, wait_for: Duration, clock: Callable[[], float]
) -> Generator[Step, Any, TaskInfo]:
    """One wait, sync or async alike: the steps it takes, the drivers (SyncWaits,
    AsyncWaits) doing the I/O. Returns the finished task, or raises TaskNotFound (unknown or
    cancelled) or TimeoutError."""
    timeout = seconds(wait_for, "timeout")
    channel = core.keys.finished_channel
    end = clock() + timeout
    yield Subscribe(channel)  # before the look: a finish in between is heard
    lost, seen = board.lost, 0
    info = yield Look(wait_op(core, tid, wait_ms(timeout)))
    while not finished(info, tid, core):
        left = end - clock()
        if left <= 0:
            info = yield Look(core.get(tid))  # the capped look for a lost message
            if finished(info, tid, core):
                break
            raise TimeoutError(
                f"task {tid!r} of queue {core.name!r} is still {info.state} after {timeout} s"
            )
        news = yield Turn(channel, tid, seen, lost, min(left, TURN_S))
        if news is None:
            continue  # another wait's turn
        count, message, now_lost = news
        got, seen = count != seen, count
        relook, lost = now_lost != lost, now_lost
        if got and message is not None:
            info = message
        elif got or relook:
            info = yield Look(core.get(tid))
    return info


def finished(info: TaskInfo | None, tid: str, core: QueueCore) -> TypeGuard[TaskInfo]:
    """Whether the wait is over with ``info``; raises TaskNotFound for an unknown or
    cancelled (a cancel's tombstone) id."""
    if info is None or info.state == "cancelled":
        raise unknown(tid, core.name)
    return info.state in FINISHED


class SyncWaits:
    """Waits of a :class:`~delayq.Queue`: one subscription, read in turns by the threads."""

    def __init__(self, client: Any, core_of: Callable[[str], QueueCore]) -> None:
        self._client = client
        self._board = Board(core_of)
        self._lock = threading.Lock()
        self._pubsub: Any = None

    def close(self) -> None:
        with self._lock:
            if self._pubsub is not None:
                self._pubsub.close()
                self._pubsub = None
                self._board.channels.clear()

    def _subscribe(self, channel: str) -> None:
        """Subscribed, the server's confirmation read (under the lock)."""
        if channel in self._board.channels:
            return
        if self._pubsub is None:
            self._pubsub = self._client.pubsub()
        self._pubsub.subscribe(channel)
        end = time.monotonic() + SUBSCRIBE_S
        while time.monotonic() < end:
            if self._board.confirms(self._pubsub.get_message(timeout=1.0), channel):
                return
        raise unconfirmed(channel)

    def _read(self, timeout: float) -> None:
        try:
            self._board.post(self._pubsub.get_message(timeout=timeout))
        except Exception:  # the connection went: subscribe again, and every wait looks again
            with contextlib.suppress(Exception):
                self._pubsub.close()
            self._pubsub = None
            self._board.drop()

    def _turn(self, step: Turn) -> tuple[int, TaskInfo | None, int] | None:
        if not self._lock.acquire(timeout=step.timeout):
            return None
        try:
            if self._board.quiet(step):
                if step.channel not in self._board.channels:
                    self._subscribe(step.channel)
                else:
                    self._read(step.timeout)
            return self._board.news(step.tid)
        finally:
            self._lock.release()

    def wait(
        self,
        core: QueueCore,
        tid: str,
        wait_for: Duration,
        run: Callable[[Any], TaskInfo | None],
    ) -> TaskInfo:
        plan = wait_plan(self._board, core, tid, wait_for, time.monotonic)
        with self._lock:
            self._board.enter(tid)
        try:
            reply: Any = None
            while True:
                step = plan.send(reply)
                if isinstance(step, Look):
                    reply = run(step.op)
                elif isinstance(step, Turn):
                    reply = self._turn(step)
                else:
                    with self._lock:
                        self._subscribe(step.channel)
                    reply = None
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            with self._lock:
                self._board.leave(tid)


class AsyncWaits:
    """Waits of an :class:`~delayq.AsyncQueue`: one subscription, read in turns."""

    def __init__(self, client: Any, core_of: Callable[[str], QueueCore]) -> None:
        self._client = client
        self._board = Board(core_of)
        self._lock = asyncio.Lock()
        self._calls = asyncio.Semaphore(CALLS_AT_ONCE)
        self._pubsub: Any = None

    async def close(self) -> None:
        async with self._lock:
            if self._pubsub is not None:
                await self._pubsub.aclose()
                self._pubsub = None
                self._board.channels.clear()

    async def _subscribe(self, channel: str) -> None:
        if channel in self._board.channels:
            return
        if self._pubsub is None:
            self._pubsub = self._client.pubsub()
        await self._pubsub.subscribe(channel)
        end = time.monotonic() + SUBSCRIBE_S
        while time.monotonic() < end:
            if self._board.confirms(await self._pubsub.get_message(timeout=1.0), channel):
                return
        raise unconfirmed(channel)

    async def _read(self, timeout: float) -> None:
        try:
            self._board.post(await self._pubsub.get_message(timeout=timeout))
        except Exception:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
            self._pubsub = None
            self._board.drop()

    async def _turn(self, step: Turn) -> tuple[int, TaskInfo | None, int] | None:
        try:
            await asyncio.wait_for(self._lock.acquire(), step.timeout)
        except TimeoutError:
            return None
        try:
            if self._board.quiet(step):
                if step.channel not in self._board.channels:
                    await self._subscribe(step.channel)
                else:
                    await self._read(step.timeout)
            return self._board.news(step.tid)
        finally:
            self._lock.release()

    async def wait(
        self,
        core: QueueCore,
        tid: str,
        wait_for: Duration,
        run: Callable[[Any], Any],
    ) -> TaskInfo:
        plan = wait_plan(self._board, core, tid, wait_for, asyncio.get_running_loop().time)
        self._board.enter(tid)
        try:
            reply: Any = None
            while True:
                step = plan.send(reply)
                if isinstance(step, Look):
                    async with self._calls:
                        reply = await run(step.op)
                elif isinstance(step, Turn):
                    reply = await self._turn(step)
                else:
                    async with self._lock:
                        await self._subscribe(step.channel)
                    reply = None
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            self._board.leave(tid)


def unconfirmed(channel: str) -> TimeoutError:
    return TimeoutError(f"no confirmation of the subscription to {channel!r}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
