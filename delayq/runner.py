"""Executing script calls: EVALSHA with a NOSCRIPT fallback, sync and asyncio.

This is all the I/O the queue API does; everything it runs is built by the pure core.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
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


# Multi-step operations are written once, as plans: generators that yield what to do next
# and receive the result. Both runners drive them; only the waiting differs.
#   ("run", op)                one script call, its parsed reply
#   ("trip", ops, durable_ms)  one round trip of EVALSHAs (+ WAITAOF when durable): raw replies
#   ("load", ops)              load the scripts (after NOSCRIPT)
Step = tuple[Any, ...]
Plan = Generator[Step, Any, T]


def batch_plan(ops: Sequence[Op[Any]], durable_ms: int | None = None) -> Plan[list[Any]]:
    """Several calls in one round trip; a call that met NOSCRIPT (it did not run) reruns.
    ``durable_ms``: end the round trip with WAITAOF on the same connection, so it returns
    only once the server's AOF is fsynced (DurabilityError otherwise)."""
    n = len(ops)
    replies: list[Any] = yield ("trip", ops, durable_ms)
    missed = [i for i, r in enumerate(replies[:n]) if isinstance(r, NoScriptError)]
    if missed:
        # The server forgot its scripts (restart, failover): load them and redo the misses.
        yield ("load", ops)
        redo: list[Any] = yield ("trip", [ops[i] for i in missed], durable_ms)
        for j, i in enumerate(missed):
            replies[i] = redo[j]
        if durable_ms is not None:
            replies[-1] = redo[-1]
    for reply in replies[:n]:
        if isinstance(reply, Exception):
            raise reply
    if durable_ms is not None:
        check_durable(replies[-1], durable_ms)
    return [op.parse(r) for op, r in zip(ops, replies[:n], strict=True)]


def _pipeline(client: Any, ops: Sequence[Op[Any]], durable_ms: int | None) -> Any:
    pipe = client.pipeline(transaction=False)
    for op in ops:
        pipe.evalsha(*_argv(op))
    if durable_ms is not None:
        pipe.execute_command(*WAITAOF, durable_ms)
    return pipe


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
        return self.drive(batch_plan(ops, durable_ms))

    def drive(self, plan: Plan[T]) -> T:
        try:
            step = next(plan)
            while True:
                step = plan.send(self._do(step))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        except (RedisConnectionError, RedisTimeoutError, ResponseError) as e:
            raise translate(e, self.client) from None

    def _do(self, step: Step) -> Any:
        if step[0] == "run":
            return self.run(step[1])
        if step[0] == "load":
            for op in step[1]:
                self.client.script_load(op.script.source)
            return None
        return list(_pipeline(self.client, step[1], step[2]).execute(False))


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
        return await self.drive(batch_plan(ops, durable_ms))

    async def drive(self, plan: Plan[T]) -> T:
        try:
            step = next(plan)
            while True:
                step = plan.send(await self._do(step))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        except (RedisConnectionError, RedisTimeoutError, ResponseError) as e:
            raise translate(e, self.client) from None

    async def _do(self, step: Step) -> Any:
        if step[0] == "run":
            return await self.run(step[1])
        if step[0] == "load":
            for op in step[1]:
                await self.client.script_load(op.script.source)
            return None
        return list(await _pipeline(self.client, step[1], step[2]).execute(False))
