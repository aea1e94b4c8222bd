"""Executing script calls: EVALSHA with a NOSCRIPT fallback, sync and asyncio.

This is all the I/O the queue API does; everything it runs is built by the pure core.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import redis
import redis.asyncio as aredis
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayq.connection import URL_ENV, describe, pool_exhausted, pool_fix, tls_fix
from delayq.core import Op
from delayq.errors import ConfigurationError, ConnectionFailed, DurabilityError, ScriptError
from delayq.held import MISSED, AsyncHeldConnection, HeldConnection

T = TypeVar("T")
# A cluster failing over or moving a slot: the call did not run; trying again later is safe.
_RECONFIGURING = (
    RedisClusterException,
    ClusterError,
    MovedError,
    AskError,
    TryAgainError,
    ClusterDownError,
)
_REDIS_ERRORS = (
    RedisConnectionError,
    RedisTimeoutError,
    ResponseError,
    RedisClusterException,
    ClusterError,
)


def translate(exc: Exception, client: Any) -> Exception:
    """Redis errors become delayq errors that say where we tried and what to do."""
    if isinstance(exc, _RECONFIGURING):
        return ConnectionFailed(
            f"the Redis Cluster at {describe(client)} refused the call ({exc}); a failover or "
            "a slot move in progress is the usual cause, and the call did not take effect: "
            "try again in a moment (if it persists, check the cluster's state)"
        )
    if pool_exhausted(exc):
        return ConnectionFailed(f"no connection for the call ({exc}): {pool_fix(client)}")
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        fix = tls_fix(exc, client) or (
            f"check the server is running, or point delayq elsewhere with url= or {URL_ENV[0]}"
        )
        return ConnectionFailed(f"cannot reach Redis at {describe(client)} ({exc}); {fix}")
    if isinstance(exc, ResponseError):
        return ScriptError(f"Redis refused delayq's call: {exc}")  # names its script, if any
    return exc


def _thrown(exc: Exception, client: Any) -> Exception:
    """A Redis error as the delayq error thrown into a plan, which may add what it knows
    (which tasks were already written) before it propagates."""
    err = exc if isinstance(exc, ConnectionFailed | ScriptError) else translate(exc, client)
    err.__suppress_context__ = True
    return err


def _argv(op: Op[Any]) -> tuple[Any, ...]:
    return (op.script.sha, len(op.keys), *op.keys, *op.args)


@dataclass(frozen=True)
class Durable:
    """What ``durable=True`` waits for, on the connection that wrote: the primary's AOF fsync
    and, with ``replicas``, that many replicas' (WAITAOF 1 N); on a server without WAITAOF
    but with ``replicas``, that many replicas' acknowledgement (WAIT N)."""

    timeout_ms: int
    replicas: int = 0

    def commands(self) -> list[tuple[Any, ...]]:
        waits: list[tuple[Any, ...]] = [("WAITAOF", 1, self.replicas, self.timeout_ms)]
        if self.replicas:
            waits.append(("WAIT", self.replicas, self.timeout_ms))
        return waits


def check_durable(replies: Sequence[Any], durable: Durable) -> None:
    """WAITAOF's (and WAIT's) replies on one connection -> nothing, or DurabilityError."""
    reply = replies[0]
    fallback = replies[1] if len(replies) > 1 else None
    if isinstance(reply, ResponseError):
        text = str(reply)
        if "unknown command" in text.lower() and durable.replicas:
            return _check_wait(fallback, durable)  # Redis < 7.2: replicas' acknowledgement
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
            f"durable=True: the AOF fsync was not confirmed within {durable.timeout_ms} ms; the "
            "task was written and is likely, but not certainly, to survive a crash"
        )
    copies = int(reply[1]) if len(reply) > 1 else 0
    if copies < durable.replicas:
        raise DurabilityError(
            f"durable=True: {copies} of {durable.replicas} replica(s) confirmed the fsync within "
            f"{durable.timeout_ms} ms; the task was written on the primary, which may lose it "
            "in a failover"
        )


def _check_wait(reply: Any, durable: Durable) -> None:
    if isinstance(reply, Exception):
        raise reply
    if int(reply) < durable.replicas:
        raise DurabilityError(
            f"durable=True: {int(reply)} of {durable.replicas} replica(s) acknowledged the write "
            f"within {durable.timeout_ms} ms; the task was written on the primary, which may "
            "lose it in a failover"
        )


# -- plans --------------------------------------------------------------------------------------
# Multi-step operations are written once, as plans: generators that yield a step (what to do
# next) and receive its result. Every runner drives them with `advance`; they differ only in
# how a step is executed. Plans use the helpers below, typed by what they return:
# ``n = yield from call(op)``.


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One script call: its parsed reply (a NOSCRIPT is reloaded and redone by the runner)."""

    op: Op[T]


@dataclass(frozen=True, slots=True)
class Trip:
    """One round trip of EVALSHAs (+ WAITAOF/WAIT when ``durable``): the raw replies, errors
    in place, then (when durable) a list of each connection's WAITAOF/WAIT replies. ``first``:
    a plain command sent before the calls (in the same round trip on one server; before
    their round trips on a cluster, where its key may live on another node), its raw reply
    before theirs."""

    ops: Sequence[Op[Any]]
    durable: Durable | None = None
    first: tuple[Any, ...] | None = None


@dataclass(frozen=True, slots=True)
class Load:
    """Load the ops' scripts (after NOSCRIPT): None."""

    ops: Sequence[Op[Any]]


@dataclass(frozen=True, slots=True)
class Command:
    """One plain Redis command (``("SET", key, value)``): its reply."""

    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Refresh:
    """A cluster round trip's pause, then a fresh slot map: None."""

    pause: float


@dataclass(frozen=True, slots=True)
class Nodes:
    """Commands for each cluster node, each node's on one connection of its own: each node's
    replies (errors in place), or the connection error it met."""

    sends: Sequence[tuple[Any, list[tuple[Any, ...]]]]


Step = Call[Any] | Trip | Load | Command | Refresh | Nodes
Plan = Generator[Step, Any, T]


def check_plan(plan: Plan[T]) -> Plan[T]:
    """A plan as ``drive`` takes it (a generator of steps), else ConfigurationError."""
    if isinstance(plan, Generator):
        return plan
    raise ConfigurationError(
        f"plan must be a plan (a generator of steps: queue.checked(op), delayq.expiring's "
        f"set_plan, ...), got {plan!r:.200}"
    )


def call(op: Op[T]) -> Plan[T]:
    reply: T = yield Call(op)
    return reply


def trip(
    ops: Sequence[Op[Any]], durable: Durable | None = None, first: tuple[Any, ...] | None = None
) -> Plan[list[Any]]:
    replies: list[Any] = yield Trip(ops, durable, first)
    return replies


def load(ops: Sequence[Op[Any]]) -> Plan[None]:
    yield Load(ops)


def command(*args: Any) -> Plan[Any]:
    return (yield Command(args))


def refresh(pause: float) -> Plan[None]:
    yield Refresh(pause)


def on_nodes(sends: Sequence[tuple[Any, list[tuple[Any, ...]]]]) -> Plan[list[Any]]:
    replies: list[Any] = yield Nodes(sends)
    return replies


_CAUGHT = (*_REDIS_ERRORS, ConnectionFailed, ScriptError)


def advance(
    plan: Plan[Any], client: Any, reply: Any = None, error: Exception | None = None
) -> Step | StopIteration:
    """The plan's next step, given what the last one replied, or the error it met (a Redis
    error thrown in as a delayq error, see ``_thrown``); once the plan returns, the
    StopIteration that carries its ``value``. Start a plan with ``advance(plan, client)``.
    An error reply the plan raises leaves as a delayq error (``translate``)."""
    try:
        if error is not None:
            return plan.throw(_thrown(error, client))
        return plan.send(reply)
    except StopIteration as done:
        return done  # no object of our own per call: the hot path is one Call
    except _REDIS_ERRORS as e:
        raise translate(e, client) from None


def batch_plan(ops: Sequence[Op[Any]], durable: Durable | None = None) -> Plan[list[Any]]:
    """Several calls in one round trip; a call that met NOSCRIPT (it did not run) reruns.
    ``durable``: end the round trip with WAITAOF on the same connection, so it returns
    only once the write is fsynced (DurabilityError otherwise)."""
    n = len(ops)
    replies = yield from trip(ops, durable)
    waits: list[Any] = replies[n] if durable is not None else []
    missed = [i for i, r in enumerate(replies[:n]) if isinstance(r, NoScriptError)]
    if missed:
        # The server forgot its scripts (restart, failover): load them and redo the misses.
        yield from load(ops)
        redo = yield from trip([ops[i] for i in missed], durable)
        for j, i in enumerate(missed):
            replies[i] = redo[j]
        if durable is not None:
            waits = waits + redo[len(missed)]
    for reply in replies[:n]:
        if isinstance(reply, Exception):
            raise reply
    if durable is not None:
        for connection_waits in waits:
            check_durable(connection_waits, durable)
    return [op.parse(r) for op, r in zip(ops, replies[:n], strict=True)]


def after_plan(command: tuple[Any, ...], op: Op[T]) -> Plan[tuple[Any, T]]:
    """A plain command's raw reply, then ``op``'s, the command run first (see Trip's
    ``first``). A call that met NOSCRIPT is sent again with the command, so the command
    still comes first."""
    for _ in range(2):
        first, reply = yield from trip([op], first=command)
        if isinstance(reply, NoScriptError):
            yield from load([op])
            continue
        for r in (first, reply):
            if isinstance(r, Exception):
                raise r
        return first, op.parse(reply)
    raise ScriptError(f"the server forgot script {op.script.name!r} twice in a row")


def _pipeline(
    client: Any, ops: Sequence[Op[Any]], durable: Durable | None, first: tuple[Any, ...] | None
) -> Any:
    pipe = client.pipeline(transaction=False)
    if first is not None:
        pipe.execute_command(*first)
    for op in ops:
        pipe.evalsha(*_argv(op))
    for waits in durable.commands() if durable is not None else []:
        pipe.execute_command(*waits)
    return pipe


def _trip_replies(replies: list[Any], step: Trip) -> list[Any]:
    """A plain round trip's replies in the Trip step's form: the waits as one connection's."""
    if step.durable is None:
        return replies
    n = len(step.ops) + (step.first is not None)
    return [*replies[:n], [replies[n:]]]


def is_cluster(client: Any) -> bool:
    return hasattr(client, "nodes_manager")


_UNSENT = object()
CLUSTER_TRIP_ATTEMPTS = 8  # ~4.5 s of backoff: a failover's promotion or a slot's move fits


def _resend(reply: Any) -> bool:
    """A call that did not run on that node: never sent, or answered MOVED, ASK (its slot is
    moving: tried again once the move is done), TRYAGAIN or CLUSTERDOWN."""
    return reply is _UNSENT or isinstance(
        reply, MovedError | AskError | TryAgainError | ClusterDownError
    )


def _by_primary(client: Any, ops: Sequence[Op[Any]], todo: list[int]) -> dict[Any, list[int]]:
    by: dict[Any, list[int]] = {}
    for i in todo:
        by.setdefault(client.get_node_from_key(ops[i].keys[0]), []).append(i)
    return by


def cluster_trip_plan(
    client: Any,
    ops: Sequence[Op[Any]],
    durable: Durable | None,
    first: tuple[Any, ...] | None = None,
) -> Plan[list[Any]]:
    """A Trip on a Redis Cluster (whose pipelines refuse EVALSHA): each primary gets its
    calls, and WAITAOF when durable, on one connection of its own — WAITAOF counts the
    writes of its own connection. Calls a node did not run (moved, failing over) are sent
    again once the slot map is fresh (Refresh). Replies in the Trip step's form, the waits
    one list per connection. ``client``: for ``get_node_from_key``. ``first``: a plain
    command sent before them, on the client's own routing."""
    head = [(yield from command(*first))] if first is not None else []
    replies: list[Any] = [_UNSENT] * len(ops)
    waits: list[Any] = []
    for attempt in range(CLUSTER_TRIP_ATTEMPTS):
        todo = [i for i, r in enumerate(replies) if _resend(r)]
        if not todo:
            break
        if attempt:
            yield from refresh(min(0.05 * 2**attempt, 1.0))
        groups = list(_by_primary(client, ops, todo).items())
        results = yield from on_nodes(
            [(node, _commands(ops, idx, durable)) for node, idx in groups]
        )
        for (_node, idx), got in zip(groups, results, strict=True):
            if isinstance(got, RedisConnectionError | RedisTimeoutError | OSError):
                continue  # left unsent: retried against the new map
            if isinstance(got, BaseException):
                raise got
            for j, i in enumerate(idx):
                replies[i] = got[j]
            waits.append(got[len(idx) :])
    done = [*head, *(_unsent_error(r) for r in replies)]
    return done if durable is None else [*done, waits]


def _on_node(node: Any, commands: list[tuple[Any, ...]]) -> Any:
    """Commands in one pipeline on the node's own client: replies (errors in place), or the
    connection error met."""
    pipe = node.redis_connection.pipeline(transaction=False)
    for args in commands:
        pipe.execute_command(*args)
    try:
        return list(pipe.execute(False))
    except (RedisConnectionError, RedisTimeoutError) as e:
        return e


def _commands(
    ops: Sequence[Op[Any]], idx: list[int], durable: Durable | None
) -> list[tuple[Any, ...]]:
    commands: list[tuple[Any, ...]] = [("EVALSHA", *_argv(ops[i])) for i in idx]
    return commands + (durable.commands() if durable is not None else [])


async def _one_connection(node: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Send commands in one write on one connection of a cluster node; error replies are
    returned in place, as a pipeline's ``execute(False)`` does."""
    conn = node.acquire_connection()
    try:
        await conn.send_packed_command(conn.pack_commands(commands))
        out: list[Any] = []
        for _ in commands:
            try:
                out.append(await conn.read_response())
            except ResponseError as e:
                out.append(e)
        return out
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        node.release(conn)


def _unsent_error(reply: Any) -> Any:
    if reply is _UNSENT:
        return RedisConnectionError("the cluster node for this call stayed unreachable")
    return reply


# -- the runners: how each step is executed ---------------------------------------------------


class SyncRunner:
    """Runs ops and plans on ``client``. ``hold``: keep one connection of the client's pool
    for single calls (``held.py``; never on a cluster), for a client of the runner's own
    owner alone."""

    def __init__(self, client: redis.Redis, *, hold: bool = False) -> None:
        self.client = client
        self.held = HeldConnection(client) if hold and not is_cluster(client) else None

    def run(self, op: Op[T]) -> T:
        held = self.held
        if held is not None:
            try:
                reply = held.call(op)
            except ResponseError as e:
                raise translate(e, self.client) from None
            if reply is not MISSED:
                return op.parse(reply)
        try:
            try:
                reply = self.client.evalsha(*_argv(op))
            except NoScriptError:
                self.client.script_load(op.script.source)
                reply = self.client.evalsha(*_argv(op))
        except _REDIS_ERRORS as e:
            raise translate(e, self.client) from None
        return op.parse(reply)

    def run_many(self, ops: Sequence[Op[Any]], *, durable: Durable | None = None) -> list[Any]:
        return self.drive(batch_plan(ops, durable))

    def run_after(self, command: tuple[Any, ...], op: Op[T]) -> tuple[Any, T]:
        """As :meth:`AsyncRunner.run_after`."""
        return self.drive(after_plan(command, op))

    def drive(self, plan: Plan[T]) -> T:
        step = advance(plan, self.client)
        while not isinstance(step, StopIteration):
            try:
                reply = self.execute(step)
            except _CAUGHT as e:
                step = advance(plan, self.client, error=e)
            else:
                step = advance(plan, self.client, reply)
        return step.value  # type: ignore[no-any-return]

    def execute(self, step: Step) -> Any:
        """One step of a plan, done: its reply (or a Redis error raised)."""
        if isinstance(step, Call):
            return self.run(step.op)
        if isinstance(step, Trip):
            if is_cluster(self.client):
                plan = cluster_trip_plan(self.client, step.ops, step.durable, step.first)
                return self.drive(plan)
            pipe = _pipeline(self.client, step.ops, step.durable, step.first)
            return _trip_replies(list(pipe.execute(False)), step)
        if isinstance(step, Command):
            return self.client.execute_command(*step.args)  # type: ignore[no-untyped-call]
        if isinstance(step, Load):
            for op in step.ops:
                self.client.script_load(op.script.source)
            return None
        if isinstance(step, Refresh):
            time.sleep(step.pause)
            self.client.nodes_manager.initialize()  # type: ignore[attr-defined]
            return None
        # Nodes: the primaries one after another
        return [_on_node(node, commands) for node, commands in step.sends]


class AsyncRunner:
    """As :class:`SyncRunner`, for an asyncio client."""

    def __init__(self, client: aredis.Redis, *, hold: bool = False) -> None:
        self.client = client
        self.held = AsyncHeldConnection(client) if hold and not is_cluster(client) else None

    async def run(self, op: Op[T]) -> T:
        held = self.held
        if held is not None:
            try:
                reply = await held.call(op)
            except ResponseError as e:
                raise translate(e, self.client) from None
            if reply is not MISSED:
                return op.parse(reply)
        try:
            try:
                reply = await self.client.evalsha(*_argv(op))
            except NoScriptError:
                await self.client.script_load(op.script.source)
                reply = await self.client.evalsha(*_argv(op))
        except _REDIS_ERRORS as e:
            raise translate(e, self.client) from None
        return op.parse(reply)

    async def run_many(
        self, ops: Sequence[Op[Any]], *, durable: Durable | None = None
    ) -> list[Any]:
        return await self.drive(batch_plan(ops, durable))

    async def run_after(self, command: tuple[Any, ...], op: Op[T]) -> tuple[Any, T]:
        """A plain command's reply, then ``op``'s, the command run first: in one round trip
        on one server, one after the other on a cluster (``after_plan``)."""
        return await self.drive(after_plan(command, op))

    async def drive(self, plan: Plan[T]) -> T:
        step = advance(plan, self.client)
        while not isinstance(step, StopIteration):
            try:
                reply = await self.execute(step)
            except _CAUGHT as e:
                step = advance(plan, self.client, error=e)
            else:
                step = advance(plan, self.client, reply)
        return step.value  # type: ignore[no-any-return]

    async def execute(self, step: Step) -> Any:
        """One step of a plan, done: its reply (or a Redis error raised)."""
        if isinstance(step, Call):
            return await self.run(step.op)
        if isinstance(step, Trip):
            if is_cluster(self.client):
                plan = cluster_trip_plan(self.client, step.ops, step.durable, step.first)
                return await self.drive(plan)
            pipe = _pipeline(self.client, step.ops, step.durable, step.first)
            return _trip_replies(list(await pipe.execute(False)), step)
        if isinstance(step, Command):
            return await self.client.execute_command(*step.args)  # type: ignore[no-untyped-call]
        if isinstance(step, Load):
            for op in step.ops:
                await self.client.script_load(op.script.source)
            return None
        if isinstance(step, Refresh):
            await asyncio.sleep(step.pause)
            await self.client.nodes_manager.initialize()  # type: ignore[attr-defined]
            return None
        # Nodes: the primaries are independent, all of them at once
        return await asyncio.gather(
            *(_one_connection(node, commands) for node, commands in step.sends),
            return_exceptions=True,
        )
