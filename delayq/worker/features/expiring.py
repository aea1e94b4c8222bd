"""The worker's side of expiring keys: firing callbacks, the bell, and the server config.

Three ways an expiry reaches a callback, one gate:

- **timer** — the engine runs the key's task at its recorded deadline. The handler reads
  the key's TTL: gone means expired (reading it makes Redis expire it, however lazy its
  own deletion), so the callback runs; still there with a longer TTL (other code extended
  it) means the task is re-armed for the new deadline without counting an attempt.
- **notification** — Redis's ``__keyevent@<db>__:expired`` message. For a watched key
  that expired before its recorded deadline, it moves the task to now; for a key another
  program set that matches a pattern, it creates one task (a gate key lets one of all the
  listening workers do it). Delivered best-effort, flagged ``guaranteed=False``.
- **scan** — tasks whose deadline passed while no worker ran (or Redis was restarting) are
  claimed when a worker (re)connects: the engine's claim over the recorded deadlines is the
  compensation scan. A callback that starts over a second late says ``via="scan"``.

All three lead to the same task, and a task runs once per claim: that is the gate.

On a single server the bell shares the wake-up subscription's connection (waker.py); on
Redis Cluster, where each node publishes only its own expiries, it is one subscription per
primary that follows failovers and resharding (bells.py).
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayq.connection import describe
from delayq.errors import (
    ConfigurationError,
    ConnectionFailed,
    Defer,
    DelayqError,
    Fail,
    raise_for,
)
from delayq.expiring import ops as expiring
from delayq.expiring.facade import Expired, ExpireFn, Via
from delayq.expiring.ops import EXPIRE_KIND
from delayq.runner import is_cluster
from delayq.task import Task
from delayq.timing import ms_to_datetime
from delayq.worker.context import WorkerContext
from delayq.worker.features.bells import ClusterBells
from delayq.worker.lane import Lane
from delayq.worker.registry import make_handler

log = logging.getLogger("delayq.expiry")

LATE_IS_SCAN_S = 1.0  # a callback starting this late was caught up, not on time
PERSISTED_RECHECK_MS = 3_600_000  # a key made persistent by other code: look again hourly
NOTICE_BATCH = 200
SHORT_WAIT_MS = 5
CONFIRM_TRIES = 3  # an early check waits for the deadline at most this often
CONFIRM_RETRY_MS = 250  # the confirm could not reach the server: look again this soon


@dataclass(frozen=True)
class _Callback:
    """An expiry callback as :meth:`WorkerContext.invoke` calls it (no timeout)."""

    fn: ExpireFn
    is_async: bool
    timeout: float | None = None


def refuse_other_lane(lanes: Sequence[Lane], lane: Lane) -> None:
    """``on_expire`` on ``lane``: refused (ConfigurationError) when another of the worker's
    ``lanes`` has callbacks already (a worker watches the keys of one queue)."""
    for other in lanes:
        if other is not lane and other.extension(ExpiryWatcher) is not None:
            raise ConfigurationError(
                f"on_expire callbacks of this worker already watch queue {other.name!r}: a "
                "worker watches the keys of one queue (run another worker for the other "
                "queue's keys)"
            )


def watcher_on(lane: Lane, configure: bool) -> ExpiryWatcher:
    """The lane's watcher: the one already there, else a new one added to it."""
    return lane.extension(ExpiryWatcher) or lane.add(ExpiryWatcher(configure=configure))


def watcher_of(lanes: Sequence[Lane], configure: bool) -> ExpiryWatcher:
    """The worker's watcher (``Worker.expiry``): the one a lane has, else an empty one."""
    found = (lane.extension(ExpiryWatcher) for lane in lanes)
    return next((w for w in found if w is not None), None) or ExpiryWatcher(configure=configure)


class ExpiryWatcher:
    """The expiry callbacks declared on one worker (``on_expire``), and, once it serves
    (:meth:`attach`), their bell: an extension (:class:`~delayq.worker.lane.Extension`) on
    the lane whose queue's keys it watches."""

    def __init__(self, *, configure: bool = True) -> None:
        self._lane: Lane | None = None  # (register)
        self._ctx: WorkerContext | None = None  # the serving worker's, from attach()
        self.configure = configure
        self.patterns: list[tuple[str, ExpireFn]] = []
        self.mode: str | None = None
        self._warned = False
        self._pending: list[str] = []
        self._notifier: asyncio.Task[None] | None = None
        self.bells: ClusterBells | None = None  # on Redis Cluster: the per-primary bell

    def register(self, lane: Lane) -> None:
        self._lane = lane

    def watch(self, pattern: str, fn: ExpireFn, max_attempts: int) -> None:
        """``on_expire(pattern)``'s callback: the lane runs the keys' tasks (their handler
        added with the first callback, with its ``max_attempts``)."""
        if self._lane is None:
            raise RuntimeError("this expiry watcher is on no worker: use Worker.on_expire")
        registry = self._lane.registry
        if registry.get(EXPIRE_KIND) is None:
            registry.add(
                make_handler(EXPIRE_KIND, self.handle, max_attempts=max_attempts, internal=True)
            )
        self.add(pattern, fn)

    async def startup(self, ctx: WorkerContext) -> None:
        """Nothing to start (the bell follows the waker's subscription): never registered."""

    def add(self, pattern: str, fn: ExpireFn) -> None:
        if not isinstance(pattern, str) or not pattern:
            raise ConfigurationError(
                f"on_expire needs a key pattern such as 'upload_session:*', got {pattern!r}"
            )
        if any(p == pattern for p, _ in self.patterns):
            raise ConfigurationError(f"a callback for pattern {pattern!r} is already registered")
        self.patterns.append((pattern, fn))

    @property
    def ctx(self) -> WorkerContext:
        """The serving worker's context (set by :meth:`attach`)."""
        if self._ctx is None:
            raise RuntimeError("the expiry watcher's worker is not serving")
        return self._ctx

    def match(self, key: str) -> ExpireFn | None:
        for pattern, fn in self.patterns:
            if fnmatch.fnmatchcase(key, pattern):
                return fn
        return None

    # -- the timer path: the task fired ----------------------------------------------------

    async def handle(self, task: Task) -> None:
        payload = task.payload
        key = payload["k"]
        foreign = bool(payload.get("foreign"))
        if not foreign:
            await self._check(key, task)
        fn = self.match(key)
        if fn is None:
            raise Fail(f"no on_expire pattern on this worker matches key {key!r}")
        due_ms = task.due_at.timestamp() * 1000
        recorded = float(payload.get("d", due_ms))
        if foreign or due_ms < recorded - 1:
            via: Via = "notification"
        elif self.ctx.now_ms() - due_ms > LATE_IS_SCAN_S * 1000:
            via = "scan"
        else:
            via = "timer"
        expired = Expired(
            key=key,
            value=payload.get("v"),
            # Tasks are due 1 ms after the key's deadline (see expire/set.lua).
            deadline=ms_to_datetime(max(recorded, due_ms - 1) if not foreign else due_ms),
            via=via,
            guaranteed=not foreign,
            task=task,
        )
        ctx = self.ctx
        await ctx.invoke(_Callback(fn, asyncio.iscoroutinefunction(fn)), task, expired)
        if not foreign:
            await ctx.runner.run(expiring.delivered_op(ctx.core, key))

    async def _check(self, key: str, task: Task) -> None:
        """Return if the key's expiry is this task's to deliver now; else raise: ``Discard``
        when a set, touch or delete before the deadline revoked the claim (or the lease is
        gone), ``Defer`` when other code extended the key (or the deadline is not yet past
        on the server's clock). The key is read before asking the server, so a set made
        after the expiry cannot make it look extended."""
        ctx = self.ctx
        wait_ms = 0
        for _ in range(CONFIRM_TRIES):
            try:
                # The key read first, then the server asked; one round trip on one server.
                pttl, (status, wait_ms) = await ctx.runner.run_after(
                    ("PTTL", key), expiring.confirm_op(ctx.core, key, task.id, task.token)
                )
            except ConnectionFailed as e:
                # A failover or a reconnect: look again shortly, without using an attempt
                # (the callback has not run).
                log.info("could not confirm the expiry of %r (%s); looking again", key, e)
                raise Defer(CONFIRM_RETRY_MS) from e
            raise_for("expire_confirm", status, key=key)
            if status == expiring.MOVED:
                return  # set again after this expiry: a live key holds the newer value
            if 0 <= pttl <= SHORT_WAIT_MS:  # a hair early (clock granularity): look again
                await asyncio.sleep((pttl + 1) / 1000)
                continue
            if pttl >= 0:
                raise Defer(int(pttl) + 1)  # other code extended it: re-arm, no attempt used
            if pttl == -1:
                raise Defer(PERSISTED_RECHECK_MS)  # made persistent: it cannot expire now
            if status == expiring.CURRENT:
                return
            await asyncio.sleep(wait_ms / 1000)  # EARLY: gone before its deadline
        raise Defer(max(wait_ms, 1))

    # -- the bell ---------------------------------------------------------------------------

    def attach(self, ctx: WorkerContext) -> None:
        """Take the serving worker's context, and wire the bell (if any pattern is
        registered): on a single server, a channel on the waker's connection; on Redis
        Cluster, :meth:`loops` runs one per primary."""
        self._ctx = ctx
        if not self.patterns:
            return
        client = ctx.runner.client
        if is_cluster(client):
            self.bells = ClusterBells(
                client,
                self.channel_for(client),
                self.on_message,
                self._check_config,
                self._cluster_mode,
                on_refused=self._warn,
            )
            return
        ctx.waker.extra[self.channel_for(client)] = self.on_message
        ctx.waker.on_subscribed.append(self.on_subscribed)

    def loops(self) -> list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]]:
        """The bell's own loops (Redis Cluster only), by name; the worker runs them under
        supervision and cancels them on exit."""
        if self.bells is None:
            return []
        return [("bells", self.bells.run)]

    @staticmethod
    def channel_for(client: Any) -> str:
        pool = getattr(client, "connection_pool", None)  # a RedisCluster has none: db 0
        db = pool.connection_kwargs.get("db", 0) if pool is not None else 0
        return f"__keyevent@{db}__:expired"

    def on_message(self, data: Any) -> None:
        key = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
        if key.startswith(self.ctx.core.keys.prefix + ":") or self.match(key) is None:
            # delayq's own keys and keys no callback wants: a watched key always matches a
            # pattern (one that did not would go to the dead set), so nothing is missed.
            return
        self._pending.append(key)
        if self._notifier is None or self._notifier.done():
            self._notifier = asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        """One consumer per worker: bells that arrive together go in one round trip, so a
        burst of expiries costs a few pipelined calls, not a connection each."""
        while self._pending:
            keys, self._pending = self._pending[:NOTICE_BATCH], self._pending[NOTICE_BATCH:]
            ctx = self.ctx
            ops = [expiring.notice_op(ctx.core, k, foreign=True) for k in keys]
            try:
                await ctx.runner.run_many(ops)
            except DelayqError as e:
                log.warning(
                    "could not act on %d expiry notifications (%s); their timers still fire "
                    "watched keys",
                    len(keys),
                    e,
                )

    # -- the server's configuration ------------------------------------------------------

    def on_subscribed(self) -> None:
        if not self._subscribed():
            self.mode = "timer+scan"  # the bell's channel was refused: no notifications
            self._warn("the server refused SUBSCRIBE to the expired-event channel")
            return
        asyncio.get_running_loop().create_task(self.ensure_notifications())

    async def ensure_notifications(self) -> str:
        """Make sure Redis publishes expired events (E and x); run without the bell if it
        refuses. A connection error is not a refusal: it is tried again."""
        delay = 0.2
        while True:
            try:
                mode = await self._check_config()
                break
            except (RedisConnectionError, RedisTimeoutError) as e:
                log.info("could not check notify-keyspace-events yet (%s); retrying", e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        if not self._subscribed():
            mode = "timer+scan"  # the subscription was refused meanwhile
        await self._record(mode)
        return mode

    def _subscribed(self) -> bool:
        """Whether the bell's channel is (still) on the waker's connection: dropped there
        when the server refuses it."""
        ctx = self.ctx
        return self.channel_for(ctx.runner.client) in ctx.waker.extra

    async def _cluster_mode(self, mode: str) -> None:
        assert self.bells is not None
        if mode == "notifications":
            log.info("expiry bell on all %d primaries", len(self.bells.primaries))
        await self._record(mode)

    async def _record(self, mode: str) -> None:
        self.mode = mode
        ctx = self.ctx
        try:
            await ctx.runner.client.hset(
                ctx.core.keys.expiry,
                mapping={
                    "mode": mode,
                    "checked_at": int(time.time() * 1000),
                    "worker": ctx.worker_id,
                },
            )
        except RedisError as e:
            log.debug("could not record the expiry mode: %s", e)

    async def _check_config(self, client: Any = None) -> str:
        """Check (and if allowed set) ``notify-keyspace-events`` on ``client``'s server (the
        worker's, or one cluster node's)."""
        if client is None:
            client = self.ctx.runner.client
        try:
            reply = await client.config_get("notify-keyspace-events")
        except ResponseError as e:
            self._warn(f"Redis refused CONFIG ({e})")
            return "timer+scan"
        flags = next(iter(reply.values()), b"")
        flags = flags.decode() if isinstance(flags, bytes) else str(flags)
        missing = ("" if "E" in flags else "E") + ("" if "x" in flags or "A" in flags else "x")
        if missing and self.configure:
            try:
                await client.config_set("notify-keyspace-events", flags + missing)
            except ResponseError as e:
                self._warn(f"Redis refused CONFIG SET ({e})")
                return "timer+scan"
            log.info(
                "notify-keyspace-events on %s was %r; added %r for the expiry bell",
                describe(client),
                flags,
                missing,
            )
            return "notifications"
        if missing:
            self._warn(f"notify-keyspace-events is {flags!r}, without {missing!r}")
            return "timer+scan"
        return "notifications"

    def _warn(self, why: str) -> None:
        if not self._warned:
            log.warning(
                "%s: expiring keys fire on delayq's timer and catch-up scan alone; keys "
                "shortened or set by other programs are not noticed early. Set "
                "'notify-keyspace-events Ex' on the server to add the bell.",
                why,
            )
            self._warned = True
