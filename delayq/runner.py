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
from .errors import ConnectionFailed, ScriptError

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

    def run_many(self, ops: Sequence[Op[Any]]) -> list[Any]:
        """Several calls in one round trip; a call that met NOSCRIPT (it did not run) reruns."""
        try:
            pipe = self.client.pipeline(transaction=False)
            for op in ops:
                pipe.evalsha(*_argv(op))
            replies = pipe.execute(raise_on_error=False)
            for i, (op, reply) in enumerate(zip(ops, replies, strict=True)):
                if isinstance(reply, NoScriptError):
                    self.client.script_load(op.script.source)
                    replies[i] = self.client.evalsha(*_argv(op))
                elif isinstance(reply, Exception):
                    raise reply
        except (RedisConnectionError, RedisTimeoutError, ResponseError) as e:
            raise translate(e, self.client) from None
        return [op.parse(r) for op, r in zip(ops, replies, strict=True)]


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

    async def run_many(self, ops: Sequence[Op[Any]]) -> list[Any]:
        try:
            pipe = self.client.pipeline(transaction=False)
            for op in ops:
                pipe.evalsha(*_argv(op))
            replies = await pipe.execute(raise_on_error=False)
            for i, (op, reply) in enumerate(zip(ops, replies, strict=True)):
                if isinstance(reply, NoScriptError):
                    await self.client.script_load(op.script.source)
                    replies[i] = await self.client.evalsha(*_argv(op))
                elif isinstance(reply, Exception):
                    raise reply
        except (RedisConnectionError, RedisTimeoutError, ResponseError) as e:
            raise translate(e, self.client) from None
        return [op.parse(r) for op, r in zip(ops, replies, strict=True)]
