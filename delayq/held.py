"""A connection a queue keeps for its one-call operations (a single ``schedule``, ``get``,
``cancel`` ...), sync and asyncio.

redis-py's ``execute_command`` is most of what a single script call costs the client: a
connection taken from the pool and given back (behind locks, with a poll of the socket for
stray data), the retry wrapper, command packing in Python, response callbacks and, in
redis-py 8, metrics; its asyncio flavour adds a task per write (``asyncio.wait_for``) and a
timeout context per read. A queue that made its own client keeps one connection of that
client's pool out of the pool and sends each call on it with the public ``Connection``
methods: ``send_packed_command`` the EVALSHA (packed by hiredis) and ``read_response``.
What the connection does on connect (AUTH with an ACL user, TLS, Sentinel's discovery of
the primary, CLIENT SETNAME) is redis-py's, unchanged.

Only the plain case is done here: the reply, or an error reply of the script. Whenever this
path cannot answer — the connection is in use by another call (a thread, or a task on the
loop), the server does not know the script (NOSCRIPT), the connection failed or timed out,
the process forked, the loop changed — ``call`` returns :data:`MISSED` and the caller runs
the call on its client as before, which loads the script, retries on connection errors
with the client's policy and maps errors. A connection that failed is disconnected here
first, so the next call reconnects it. The call is sent at most once more than on the
client's own path, as redis-py's retries do: every script call of the queue's API can be
sent again (ids are made by the client), and a schedule sent twice is reported
``unchanged`` the second time, on either path.

The held connection is lent back: a pool with a limit (``?max_connections=N``) that runs out
while the held connection sits idle takes it back for the call that asked (a pipeline, the
client's path, a command of the caller's on ``queue.client``), and the next single call
takes one again. So a pool of one connection still serves every call, one at a time, as it
did before any was held. Only when every connection is in use at that moment, by calls of
the process's own, does a call meet the pool's "Too many connections" (``runner.translate``
says so, and which limit to raise).

A Redis Cluster client (whose calls are routed by key) has no such connection, nor does a
client the caller passed in (``client=``): it may be shared, limited or closed by its owner.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import redis
import redis.asyncio as aredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayq.connection import pack_command, pool_exhausted
from delayq.core import Op

MISSED: Any = object()  # call() could not answer: run the call on the client
# A call that met these did not get its reply: the client's path sends it again.
_DROPPED = (RedisConnectionError, RedisTimeoutError, OSError)


def _args(op: Op[Any]) -> tuple[Any, ...]:
    return ("EVALSHA", op.script.sha, len(op.keys), *op.keys, *op.args)


def _take(pool: Any) -> Any:
    try:
        return pool.get_connection()
    except TypeError:  # redis-py before 5.3 wants the command's name
        return pool.get_connection("EVALSHA")


async def _atake(pool: Any) -> Any:
    try:
        return await pool.get_connection()
    except TypeError:
        return await pool.get_connection("EVALSHA")


class HeldConnection:
    """One connection of a sync client's pool, for one call at a time (threads that find it
    busy take the client's path)."""

    def __init__(self, client: redis.Redis) -> None:
        self.pool = client.connection_pool
        self.health = bool(self.pool.connection_kwargs.get("health_check_interval"))
        self.lock = threading.Lock()
        self.conn: Any = None
        self.pid = os.getpid()
        self.closed = False
        take = self.pool.get_connection

        def get_connection(*args: Any, **kwargs: Any) -> Any:
            # The pool's own, lending the held connection back when the pool has run out.
            try:
                return take(*args, **kwargs)
            except RedisConnectionError as e:
                if not (pool_exhausted(e) and self.give_back()):
                    raise
            return take(*args, **kwargs)

        self.pool.get_connection = get_connection  # type: ignore[method-assign]

    def give_back(self) -> bool:
        """Return the connection to the pool, unless a call is using it (or it is the
        parent's, after a fork); True if it was returned. The next call takes one again."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            conn = self.conn
            if conn is None or self.pid != os.getpid():
                return False
            self.conn = None
            self.pool.release(conn)
            return True
        finally:
            self.lock.release()

    def call(self, op: Op[Any]) -> Any:
        """The reply of ``op``'s EVALSHA, or MISSED. An error reply of the script is raised
        (a ``ResponseError``: the caller maps it)."""
        if not self.lock.acquire(blocking=False):
            return MISSED
        try:
            if self.closed:
                return MISSED
            conn = self.conn
            try:
                if conn is None or self.pid != os.getpid():
                    # (after a fork the parent's connection is left alone: the pool makes
                    # new ones)
                    conn = self.conn = None
                    conn = self.conn = _take(self.pool)
                    self.pid = os.getpid()
                args = _args(op)
                # (the health check is a no-op without an interval: not called then)
                packed = pack_command(args) or conn.pack_command(*args)
                conn.send_packed_command(packed, check_health=self.health)
                return conn.read_response()
            except ResponseError as e:  # read in full: the connection is fine
                if isinstance(e, NoScriptError):
                    return MISSED  # the client's path loads it and calls again
                raise
            except BaseException as e:
                # Dropped, timed out or interrupted mid-call: whatever is left unread must
                # not be taken for the next call's reply.
                if conn is not None:
                    conn.disconnect()
                if isinstance(e, _DROPPED):
                    return MISSED  # the client's path retries, with its policy
                raise
        finally:
            self.lock.release()

    def close(self) -> None:
        """Disconnect the connection (the queue's client is being closed with its pool)."""
        with self.lock:
            self.closed = True
            if self.conn is not None and self.pid == os.getpid():
                self.conn.disconnect()
            self.conn = None


class AsyncHeldConnection:
    """One connection of an asyncio client's pool, for one call at a time on one event loop
    (tasks that find it busy, or another loop, take the client's path).

    The connection's own ``socket_timeout`` is cleared while it is held and a watch of this
    object's enforces it instead: redis-py's asyncio connection wraps each write in
    ``asyncio.wait_for`` (a task of its own) and each read in a timeout context, and a timer
    per call that is cancelled long before it is due stays in the loop's heap until then (at
    thousands of calls a second, a heap of a hundred thousand timers, rebuilt every so
    often): together they cost more than the rest of the call. The watch is one timer,
    every quarter of the timeout while calls are made; it cancels a call that has run for
    the whole timeout, so a call is abandoned between one and one and a quarter timeouts
    after it started (redis-py's own limits are per write and per read), and the client's
    path retries it as it retries a timed-out read."""

    def __init__(self, client: aredis.Redis) -> None:
        self.pool = client.connection_pool
        self.timeout: float | None = self.pool.connection_kwargs.get("socket_timeout")
        self.health = bool(self.pool.connection_kwargs.get("health_check_interval"))
        self.busy = False
        self.conn: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self.task: asyncio.Task[Any] | None = None  # the call in flight
        self.started = 0.0  # when it started (the loop's clock)
        self.expired = False  # the watch cancelled it
        self.watch: asyncio.TimerHandle | None = None
        take: Any = self.pool.get_connection

        async def get_connection(*args: Any, **kwargs: Any) -> Any:
            # As the sync one's: the pool's own, lending the held connection back.
            try:
                return await take(*args, **kwargs)
            except RedisConnectionError as e:
                if not (pool_exhausted(e) and await self.give_back()):
                    raise
            return await take(*args, **kwargs)

        self.pool.get_connection = get_connection  # type: ignore[method-assign]

    async def give_back(self) -> bool:
        """As :meth:`HeldConnection.give_back`: unless a call is using it, or it is of
        another loop. Its ``socket_timeout`` is the pool's again."""
        conn = self.conn
        if conn is None or self.busy or self.loop is not asyncio.get_running_loop():
            return False
        self.conn = None
        conn.socket_timeout = self.timeout
        await self.pool.release(conn)
        return True

    async def call(self, op: Op[Any]) -> Any:
        """As :meth:`HeldConnection.call`."""
        if self.busy or self.closed:
            return MISSED
        loop = asyncio.get_running_loop()
        if self.loop is not loop:
            if self.loop is not None:
                return MISSED  # connected on another loop: its streams are that loop's
            self.loop = loop
        self.busy = True
        if self.timeout is not None:
            self.task, self.started, self.expired = asyncio.current_task(), loop.time(), False
            if self.watch is None:
                self.watch = loop.call_later(self.timeout / 4, self._look)
        try:
            conn = self.conn
            try:
                if conn is None:
                    conn = await _atake(self.pool)
                    conn.socket_timeout = None  # (see the class's docstring)
                    self.conn = conn
                args = _args(op)
                packed = pack_command(args) or conn.pack_command(*args)
                await conn.send_packed_command(packed, check_health=self.health)
                return await conn.read_response()
            except ResponseError as e:
                if isinstance(e, NoScriptError):
                    return MISSED
                raise
            except BaseException as e:
                if conn is not None:
                    await conn.disconnect(nowait=True)
                if isinstance(e, _DROPPED) or self._timed_out(e):
                    return MISSED
                raise
        finally:
            self.busy = False
            self.task = None

    def _timed_out(self, e: BaseException) -> bool:
        """Whether ``e`` is the watch's cancel alone (then the task is uncancelled)."""
        task = self.task
        return (
            isinstance(e, asyncio.CancelledError)
            and self.expired
            and task is not None
            and not task.uncancel()
        )

    def _look(self) -> None:
        """The watch: cancel a call in flight for the whole timeout; look again while
        calls are made."""
        self.watch = None
        if not self.busy or self.loop is None or self.timeout is None:
            return
        if self.task is not None and self.loop.time() - self.started >= self.timeout:
            self.expired = True
            self.task.cancel()
        self.watch = self.loop.call_later(self.timeout / 4, self._look)

    async def close(self) -> None:
        """Disconnect the connection (the queue's client is being closed with its pool); one
        in use, or of another loop, is left to the pool's own disconnect."""
        self.closed = True
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None
        conn, self.conn = self.conn, None
        if conn is not None and not self.busy and self.loop is asyncio.get_running_loop():
            await conn.disconnect()
