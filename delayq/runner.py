"""Executing script calls: EVALSHA with a NOSCRIPT fallback, sync and asyncio.

This is all the I/O the queue API does; everything it runs is built by the pure core.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio as aredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .connection import URL_ENV, describe
from .core import Op
from .errors import ConnectionFailed, DurabilityError, ScriptError

T = TypeVar("T")


def translate(exc: Exception, client: Any) -> Exception:
    """Redis errors become delayq errors that say where we tried and what to do."""
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return ConnectionFailed(
            f"cannot reach Redis at {describe(client)} ({exc}); check the server is running, "
            f"or point delayq elsewhere with url= or {URL_ENV[0]}"
        )
    if isinstance(exc, ResponseError):
        return ScriptError(f"Redis refused a delayq script: {exc}")
    return exc


def _argv(op: Op[Any]) -> tuple[Any, ...]:
    return (op.script.sha, len(op.keys), *op.keys, *op.args)


WAITAOF = ("WAITAOF", 1, 0)  # this server's own AOF; replicas come with Cluster/Sentinel


def check_durable(reply: Any, timeout_ms: int) -> None:
    """WAITAOF's reply (or error) -> nothing, or DurabilityError saying what happened."""
    if isinstance(reply, ResponseError):
        text = str(reply)
        if "unknown command" in text.lower():
            why = "the server has no WAITAOF (it needs Redis or Valkey 7.2 or later)"
        elif "appendonly" in text.lower():
            why = "the server runs without an append-only file (set appendonly yes)"
        else:
            why = f"WAITAOF failed: {text}"
        raise DurabilityError(
            f"durable=True: {why}; the task was written but not confirmed on disk"
        )
    if isinstance(reply, Exception):
        raise reply
    local = int(reply[0]) if reply else 0
    if local < 1:
        raise DurabilityError(
            f"durable=True: the AOF fsync was not confirmed within {timeout_ms} ms; the task "
            "was written and is likely, but not certainly, to survive a crash"
        )


class SyncRunner:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def run(self, op: Op[T]) -> T:
        try:
            try:
                reply = self.client.evalsha(*_argv(op))
            except NoScriptError:
                self.client.script_load(op.script.source)
                reply = self.client.evalsha(*_argv(op))
        except (RedisConnectionError, RedisTimeoutError, ResponseError) as e:
            raise translate(e, self.client) from None
        return op.parse(reply)

    def run_many(self, ops: Sequence[Op[Any]], *, durable_ms: int | None = None) -> list[Any]:
        """Several calls in one round trip; a call that met NOSCRIPT (it did not run) reruns.

        ``durable_ms``: end the round trip with WAITAOF on the same connection, so the calls
        return only once the server's AOF is fsynced (DurabilityError otherwise)."""
        try:
            replies = self._round_trip(ops, durable_ms)
            if any(isinstance(r, NoScriptError) for r in replies[: len(ops)]):
                for op in ops:  # scripts were flushed (restart, failover): load, redo the misses
                    self.client.script_load(op.script.source)
                missed = [
                    i for i, r in enumerate(replies[: len(ops)]) if isinstance(r, NoScriptError)
                ]
                redo = self._round_trip([ops[i] for i in missed], durable_ms)
                for j, i in enumerate(missed):
                    replies[i] = redo[j]
                if durable_ms is not None:
                    replies[-1] = redo[-1]
            for reply in replies[: len(ops)]:
                if isinstance(reply, Exception):
                    raise reply
        except (RedisConnectionError, RedisTimeoutError, ResponseError) as e:
            raise translate(e, self.client) from None
        if durable_ms is not None:
            check_durable(replies[-1], durable_ms)
        return [op.parse(r) for op, r in zip(ops, replies, strict=False)]

    def _round_trip(self, ops: Sequence[Op[Any]], durable_ms: int | None) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for op in ops:
            pipe.evalsha(*_argv(op))
        if durable_ms is not None:
            pipe.execute_command(*WAITAOF, durable_ms)  # type: ignore[no-untyped-call]
        return list(pipe.execute(raise_on_error=False))


class AsyncRunner:
    def __init__(self, client: aredis.Redis) -> None:
        self.client = client

    async def run(self, op: Op[T]) -> T:
        try:
            try:
                reply = await self.client.evalsha(*_argv(op))
            except NoScriptError:
                await self.client.script_load(op.script.source)
                reply = await self.client.evalsha(*_argv(op))
        except (RedisConnectionError, RedisTimeoutError, ResponseError) as e:
            raise translate(e, self.client) from None
        return op.parse(reply)

    async def run_many(self, ops: Sequence[Op[Any]], *, durable_ms: int | None = None) -> list[Any]:
        """As :meth:`SyncRunner.run_many`."""
        try:
            replies = await self._round_trip(ops, durable_ms)
            if any(isinstance(r, NoScriptError) for r in replies[: len(ops)]):
                for op in ops:
                    await self.client.script_load(op.script.source)
                missed = [
                    i for i, r in enumerate(replies[: len(ops)]) if isinstance(r, NoScriptError)
                ]
                redo = await self._round_trip([ops[i] for i in missed], durable_ms)
                for j, i in enumerate(missed):
                    replies[i] = redo[j]
                if durable_ms is not None:
                    replies[-1] = redo[-1]
            for reply in replies[: len(ops)]:
                if isinstance(reply, Exception):
                    raise reply
        except (RedisConnectionError, RedisTimeoutError, ResponseError) as e:
            raise translate(e, self.client) from None
        if durable_ms is not None:
            check_durable(replies[-1], durable_ms)
        return [op.parse(r) for op, r in zip(ops, replies, strict=False)]

    async def _round_trip(self, ops: Sequence[Op[Any]], durable_ms: int | None) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for op in ops:
            pipe.evalsha(*_argv(op))
        if durable_ms is not None:
            pipe.execute_command(*WAITAOF, durable_ms)
        return list(await pipe.execute(raise_on_error=False))
