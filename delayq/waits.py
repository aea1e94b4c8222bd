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
look (``get``) of every wait then in progress, once the subscription is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

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


class _Board:
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

    def post(self, message: Any) -> None:
        if not message or message.get("type") != "message":
            return
        try:
            tid, info = read_message(message["data"], self.core_of)
        except (ValueError, TypeError, KeyError):
            return  # not ours: written by another program
        if tid in self.waiting:
            self.arrived[tid] = (self.arrived.get(tid, (0, None))[0] + 1, info)


class SyncWaits:
    """Waits of a :class:`~delayq.Queue`: one subscription, read in turns by the threads."""

    def __init__(self, client: Any, core_of: Callable[[str], QueueCore]) -> None:
        self._client = client
        self._board = _Board(core_of)
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
        end = time.monotonic() + 10
        while time.monotonic() < end:
            m = self._pubsub.get_message(timeout=1.0)
            if m and m.get("type") == "subscribe" and _text(m.get("channel")) == channel:
                self._board.channels.add(channel)
                return
            self._board.post(m)
        raise TimeoutError(f"no confirmation of the subscription to {channel!r}")

    def _read(self, timeout: float) -> None:
        try:
            self._board.post(self._pubsub.get_message(timeout=timeout))
        except Exception:  # the connection went: subscribe again, and every wait looks again
            with contextlib.suppress(Exception):
                self._pubsub.close()
            self._pubsub = None
            self._board.channels.clear()
            self._board.lost += 1

    def wait(
        self,
        core: QueueCore,
        tid: str,
        wait_for: Duration,
        run: Callable[[Any], TaskInfo | None],
    ) -> TaskInfo:
        timeout = seconds(wait_for, "timeout")
        for_ms = wait_ms(timeout)
        channel = core.keys.finished_channel
        board = self._board
        end = time.monotonic() + timeout
        with self._lock:
            board.enter(tid)
        try:
            with self._lock:
                self._subscribe(channel)
                lost, seen = board.lost, 0
            info = run(wait_op(core, tid, for_ms))
            while True:
                if info is None or info.state == "cancelled":  # (a cancel's tombstone)
                    raise unknown(tid, core.name)
                if info.state in FINISHED:
                    return info
                left = end - time.monotonic()
                if left <= 0:
                    break
                if not self._lock.acquire(timeout=min(left, TURN_S)):
                    continue
                try:
                    if board.arrived.get(tid, (0, None))[0] == seen and board.lost == lost:
                        if channel not in board.channels:
                            self._subscribe(channel)
                        else:
                            self._read(min(left, TURN_S))
                    count, message = board.arrived.get(tid, (0, None))
                    got, seen = count != seen, count
                    relook = board.lost != lost
                    lost = board.lost
                finally:
                    self._lock.release()
                if got and message is not None:
                    info = message
                elif got or relook:
                    info = run(core.get(tid))
            info = run(core.get(tid))  # the capped look for a lost message
            if info is None or info.state == "cancelled":  # (a cancel's tombstone)
                raise unknown(tid, core.name)
            if info.state in FINISHED:
                return info
            raise TimeoutError(
                f"task {tid!r} of queue {core.name!r} is still {info.state} after {timeout} s"
            )
        finally:
            with self._lock:
                board.leave(tid)


class AsyncWaits:
    """Waits of an :class:`~delayq.AsyncQueue`: one subscription, read in turns."""

    def __init__(self, client: Any, core_of: Callable[[str], QueueCore]) -> None:
        self._client = client
        self._board = _Board(core_of)
        self._lock = asyncio.Lock()
        self._calls = asyncio.Semaphore(CALLS_AT_ONCE)
        self._pubsub: Any = None

    async def _run(self, run: Callable[[Any], Any], op: Op[TaskInfo | None]) -> TaskInfo | None:
        async with self._calls:
            return await run(op)  # type: ignore[no-any-return]

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
        end = time.monotonic() + 10
        while time.monotonic() < end:
            m = await self._pubsub.get_message(timeout=1.0)
            if m and m.get("type") == "subscribe" and _text(m.get("channel")) == channel:
                self._board.channels.add(channel)
                return
            self._board.post(m)
        raise TimeoutError(f"no confirmation of the subscription to {channel!r}")

    async def _read(self, timeout: float) -> None:
        try:
            self._board.post(await self._pubsub.get_message(timeout=timeout))
        except Exception:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
            self._pubsub = None
            self._board.channels.clear()
            self._board.lost += 1

    async def wait(
        self,
        core: QueueCore,
        tid: str,
        wait_for: Duration,
        run: Callable[[Any], Any],
    ) -> TaskInfo:
        timeout = seconds(wait_for, "timeout")
        for_ms = wait_ms(timeout)
        channel = core.keys.finished_channel
        board = self._board
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        board.enter(tid)
        try:
            async with self._lock:
                await self._subscribe(channel)
                lost, seen = board.lost, 0
            info = await self._run(run, wait_op(core, tid, for_ms))
            while True:
                if info is None or info.state == "cancelled":  # (a cancel's tombstone)
                    raise unknown(tid, core.name)
                if info.state in FINISHED:
                    return info
                left = end - loop.time()
                if left <= 0:
                    break
                try:
                    await asyncio.wait_for(self._lock.acquire(), min(left, TURN_S))
                except TimeoutError:
                    continue
                try:
                    if board.arrived.get(tid, (0, None))[0] == seen and board.lost == lost:
                        if channel not in board.channels:
                            await self._subscribe(channel)
                        else:
                            await self._read(min(left, TURN_S))
                    count, message = board.arrived.get(tid, (0, None))
                    got, seen = count != seen, count
                    relook = board.lost != lost
                    lost = board.lost
                finally:
                    self._lock.release()
                if got and message is not None:
                    info = message
                elif got or relook:
                    info = await self._run(run, core.get(tid))
            info = await self._run(run, core.get(tid))
            if info is None or info.state == "cancelled":  # (a cancel's tombstone)
                raise unknown(tid, core.name)
            if info.state in FINISHED:
                return info
            raise TimeoutError(
                f"task {tid!r} of queue {core.name!r} is still {info.state} after {timeout} s"
            )
        finally:
            board.leave(tid)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
