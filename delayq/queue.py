"""The producer and admin API: ``Queue`` (blocking) and ``AsyncQueue`` (asyncio).

Both are thin: each method asks the pure :class:`~delayq.core.QueueCore` for a script call
and runs it, so the two differ only in how they wait.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from itertools import islice
from typing import Any, Generic, Literal, TypeVar, Unpack, cast

import redis
import redis.asyncio as aredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayq import check, controls, hooks
from delayq.codec import DEFAULT_MAX_PAYLOAD
from delayq.connection import RETRIES, async_client, check_client, resolve_url, sync_client
from delayq.controls import Controls, RateLimit
from delayq.core import (
    DEFAULT_DEDUPE_WINDOW,
    MAX_DEAD_PAGE,
    REPLY_BATCH,
    CheckedSpec,
    Op,
    QueueCore,
    ScheduleOptions,
    TaskSpec,
    check_page,
    new_task_id,
    task_ids,
    validate_task_id,
)
from delayq.cron import facade as cron
from delayq.errors import ConfigurationError, ConnectionFailed, InvalidTaskError
from delayq.expiring.facade import AsyncExpiring, Expiring
from delayq.hooks import BeforeSchedule
from delayq.keys import DEFAULT_PREFIX
from delayq.runner import (
    AsyncRunner,
    Call,
    Durable,
    Plan,
    SyncRunner,
    batch_plan,
    call,
    check_plan,
)
from delayq.shards import (
    STORED,
    Shards,
    add_stats,
    decode_cursor,
    merge_dead,
    merge_page,
    stored_count,
)
from delayq.task import QueueStats, Scheduled, TaskInfo, TaskPage, WorkerInfo
from delayq.timing import Clock, Duration, seconds

T = TypeVar("T")
C = TypeVar("C", redis.Redis, aredis.Redis)
R = TypeVar("R", SyncRunner, AsyncRunner)
L = TypeVar("L", RateLimit, None)

SCHEDULE_BATCH = 1000  # tasks per script call in schedule_many
CALLS_PER_ROUND_TRIP = 8


_OPTIONS = frozenset(("delay", "at", "task_id", "replace", "max_attempts", "durable", "headers"))


def _spec(kind: str, payload: Any, options: ScheduleOptions) -> TaskSpec:
    if not _OPTIONS.issuperset(options):
        unknown = options.keys() - _OPTIONS
        raise InvalidTaskError(f"unknown schedule option(s): {', '.join(sorted(unknown))}")
    return TaskSpec(  # (by position: keywords cost more, once per call)
        kind,
        payload,
        options.get("delay"),
        options.get("at"),
        options.get("task_id"),
        options.get("max_attempts", 0),
        options.get("headers"),
    )


def _as_spec(item: TaskSpec | Mapping[str, Any]) -> TaskSpec:
    if isinstance(item, TaskSpec):
        return item
    try:
        return TaskSpec(**item)
    except TypeError as e:
        raise InvalidTaskError(
            f"schedule_many's tasks hold {check.shown(item)}, which is not a task (a TaskSpec "
            f"or a dict of its fields): {e}"
        ) from None


_AN_OP = "an Op made by delayq's builders (queue.core.stats(), delayq.expiring's ops, ...)"
_FN = " (called with how many tasks each batch handled)"


def _run_hooks(hooks: Sequence[BeforeSchedule], spec: TaskSpec) -> TaskSpec:
    """``spec`` as the hooks leave it. Each is given a spec whose ``headers`` is a dict of
    its own (a copy of the caller's, or a new one), to add to in place; one may instead
    return a new spec (None keeps the one given). The caller's spec and dict never change."""
    spec = _with_headers(spec, {} if spec.headers is None else dict(spec.headers))
    for hook in hooks:
        new = hook(spec)
        if new is None:
            continue
        if not isinstance(new, TaskSpec):
            raise ConfigurationError(
                f"the before_schedule hook {hook!r} returned {new!r:.200}: return a TaskSpec "
                "(dataclasses.replace(spec, ...)) or None (the spec given, headers added "
                "in place)"
            )
        spec = new if new.headers is not None else _with_headers(new, {})
    if isinstance(spec, CheckedSpec):
        # One a hook returned: its headers were encoded when it was made, and a later hook
        # may have added to them in place. A plain one is checked and encoded as it is now.
        spec = _with_headers(spec, spec.headers or {})
    return spec


def _first(op: Op[list[str]]) -> Op[Scheduled]:
    """A schedule_many call of one task, parsed to its one Scheduled."""
    parse = op.parse
    return Op(op.script, op.keys, op.args, lambda reply: cast(Scheduled, parse(reply)[0]))


def _with_headers(spec: TaskSpec, headers: dict[str, str]) -> TaskSpec:
    return TaskSpec(
        spec.kind, spec.payload, spec.delay, spec.at, spec.task_id, spec.max_attempts, headers
    )


Progress = Callable[[int], None]  # hears how many tasks each batch handled


def _each(ops: list[Op[int]], progress: Progress | None) -> Plan[int]:
    total = 0
    for op in ops:
        n = yield from call(op)
        total += n
        if progress:
            progress(n)
    return total


def _until_none(batches: Sequence[Callable[[], Op[int]]], progress: Progress | None) -> Plan[int]:
    """Run each shard's next batch until it handles nothing more."""
    total = 0
    for make in batches:
        while n := (yield from call(make())):
            total += n
            if progress:
                progress(n)
    return total


def _ids_and_progress(
    ids: Iterable[str] | None, progress: Progress | None
) -> tuple[list[str] | None, Progress | None]:
    """replay's and purge_dead's ``ids`` (a list of ids, never a str) and ``progress``."""
    if ids is not None:
        ids = check.many(ids, "ids", error=InvalidTaskError, what="task ids")
    return ids, check.optional(check.function, progress, "progress", hint=_FN)


def _chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


class _Base(Generic[C]):
    """A named queue of delayed tasks: the configuration and plans shared by :class:`Queue`
    and :class:`AsyncQueue` (their arguments are documented on :class:`Queue`)."""

    def __init__(
        self,
        name: str,
        url: str | None = None,
        *,
        client: C | None = None,
        prefix: str = DEFAULT_PREFIX,
        codec: str = "json",
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        dedupe_window: Duration = DEFAULT_DEDUPE_WINDOW,
        durable_timeout: Duration | None = None,
        shards: int | Literal["stored"] = 1,
        durable_replicas: int = 0,
        clock: Clock | None = None,
        before_schedule: Iterable[BeforeSchedule] = (),
    ) -> None:
        what = "functions (spec) -> TaskSpec | None"
        self.before_schedule: list[BeforeSchedule] = check.many(
            before_schedule, "before_schedule", what=what
        )
        for hook in self.before_schedule:
            if not callable(hook):
                raise ConfigurationError(
                    f"before_schedule takes functions (spec) -> TaskSpec | None, got {hook!r}"
                )
        if clock is not None and not callable(getattr(clock, "now_ms", None)):
            raise ConfigurationError(
                f"clock must be a delayq.testing.VirtualClock (anything with now_ms()), got "
                f"{clock!r}"
            )
        check.whole(durable_replicas, "durable_replicas", 0)
        # The AOF fsync takes up to ~1 s under appendfsync everysec; a replica's confirmation
        # arrives with its next acknowledgement after its own fsync, about a second later.
        if durable_timeout is None:
            durable_timeout = 3.0 if durable_replicas else 1.0
        self.durable_ms = max(1, round(seconds(durable_timeout, "durable_timeout") * 1000))
        self.durable = Durable(self.durable_ms, durable_replicas)
        options: dict[str, Any] = dict(
            prefix=prefix,
            codec=codec,
            max_payload=max_payload,
            dedupe_window=dedupe_window,
            clock=clock,
        )
        self.shards = Shards(name, 1 if shards == STORED else shards, **options)
        self.core: QueueCore = self.shards.home
        self.url = resolve_url(url)
        if client is not None:
            check_client(client, self._client_kinds)
        self._owns_client = client is None
        self.client: C = client if client is not None else self._new_client(self.url)
        if shards == STORED:
            try:
                n = self._read_stored(stored_count(self.shards.root)).n
            except BaseException:
                self._drop_client()
                raise
            if n != 1:
                self.shards = Shards(name, n, **options)
                self.core = self.shards.home

    _client_kinds: tuple[type[Any], ...] = ()  # what client= takes

    def _read_stored(self, op: Op[T]) -> T:
        raise NotImplementedError

    def _drop_client(self) -> None:
        raise NotImplementedError

    def _new_client(self, url: str) -> C:
        raise NotImplementedError

    @property
    def name(self) -> str:
        """The queue's name."""
        return self.core.name

    def _schedule_ops(
        self, tasks: Iterable[TaskSpec | Mapping[str, Any]], replace: bool, durable: bool = False
    ) -> tuple[list[str], list[Op[list[str]]]]:
        """(ids in the order given, script calls per shard). Everything is validated and
        encoded first: a bad task refuses the whole call unwritten. The before_schedule
        hooks, the process-wide ones (delayq.hooks) first, see each spec before that."""
        check.flag(replace, "replace", InvalidTaskError)
        check.flag(durable, "durable", InvalidTaskError)
        items = check.many(tasks, "tasks", error=InvalidTaskError, what="TaskSpecs or dicts")
        return self._ops_of(self._hooked([_as_spec(t) for t in items]), replace, durable)

    def _ops_of(
        self, specs: list[TaskSpec], replace: bool, durable: bool
    ) -> tuple[list[str], list[Op[list[str]]]]:
        """:meth:`_schedule_ops` of specs the hooks have seen."""
        ids = task_ids(specs)  # each id checked once (a new one: not at all)
        if self.shards.n == 1:
            core = self.core
            ops = [
                core.schedule(
                    specs[i : i + SCHEDULE_BATCH],
                    ids=ids[i : i + SCHEDULE_BATCH],
                    replace=replace,
                    durable=durable,
                )
                for i in range(0, len(specs), SCHEDULE_BATCH)
            ]
            return ids, ops
        ops = []
        for core, group in self.shards.group(zip(specs, ids, strict=True), lambda p: p[1]):
            for chunk in _chunks(group, SCHEDULE_BATCH):
                part, part_ids = [s for s, _ in chunk], [i for _, i in chunk]
                ops.append(core.schedule(part, ids=part_ids, replace=replace, durable=durable))
        return ids, ops

    def _hooked(self, specs: list[TaskSpec]) -> list[TaskSpec]:
        """The specs as the before_schedule hooks leave them, the process-wide ones
        (delayq.hooks) first."""
        if hooks.before_schedule or self.before_schedule:  # (nothing more when none)
            chain = [*hooks.before_schedule, *self.before_schedule]
            return [_run_hooks(chain, s) for s in specs]
        return specs

    def _schedule_op(self, kind: str, payload: Any, options: ScheduleOptions) -> Op[Scheduled]:
        """The script call of one ``schedule``, validated and encoded. A task given no id,
        and neither ``replace`` nor ``durable``, is new to the queue: ``schedule_new.lua``
        (what ``schedule.lua`` does for a new task, in fewer commands) on its id's shard.
        Any other is a ``schedule_many`` of one task."""
        spec = _spec(kind, payload, options)
        replace, durable = options.get("replace", False), options.get("durable", False)
        if replace is not False or durable is not False:  # (the common case: neither given)
            check.flag(replace, "replace", InvalidTaskError)
            check.flag(durable, "durable", InvalidTaskError)
        if hooks.before_schedule or self.before_schedule:
            (spec,) = self._hooked([spec])
        if spec.task_id is None and not (replace or durable):
            task_id = new_task_id()
            return self.shards.of(task_id).schedule_new(spec, task_id)
        if self.shards.n == 1:  # (encode_tasks checks the id: no lists of a batch)
            return _first(self.core.schedule([spec], replace=replace, durable=durable))
        _, ops = self._ops_of([spec], replace, durable)
        return _first(ops[0])

    # Multi-step operations, written once as plans (see runner.py); each flavour drives them.

    def _check_shards_plan(self, store: bool = True) -> Plan[None]:
        """Once per queue object, before its first write or read of a task: refuse a
        different shard count (a read stores none; see Shards.verify)."""
        if not (self.shards.write_checked if store else self.shards.checked):
            self.shards.verify((yield from call(self.shards.check_op(store=store))))

    def _protocol_plan(self) -> Plan[str]:
        """Read the queue's protocol version, every call (a readiness probe sees a change),
        with the checks of a first call: a queue of another protocol major, or opened with
        the wrong shard count, is refused."""
        stored = yield from call(self.shards.check_op(store=False))
        self.shards.verify(stored)
        return stored.protocol

    def checked(self, op: Op[T], *, write: bool = False) -> Plan[T]:
        """The plan of :meth:`execute`, to compose plans with (run them with ``drive``): one
        call, after the shard count check: opened with the wrong count, a task's shard (get,
        cancel, reschedule), the home shard (workers, watched keys) would be the wrong one.
        ``write``: the call writes, which stores the count when none is."""
        check.instance(op, "op", Op, _AN_OP)
        return self._checked(op, check.flag(write, "write"))

    def _checked(self, op: Op[T], write: bool = False) -> Plan[T]:
        """:meth:`checked` of an op the queue made itself."""
        if not (self.shards.write_checked if write else self.shards.checked):
            yield from self._check_shards_plan(store=write)  # (a generator less once checked)
        reply: T = yield Call(op)  # the hot path: the step itself, no call() generator
        return reply

    def _schedule_many_plan(
        self, tasks: Iterable[TaskSpec | Mapping[str, Any]], replace: bool, durable: bool
    ) -> Plan[list[Scheduled]]:
        ids, ops = self._schedule_ops(tasks, replace, durable)
        yield from self._check_shards_plan()
        done: list[str] = []
        wait = self.durable if durable else None
        for group in _chunks(ops, CALLS_PER_ROUND_TRIP):
            try:
                replies = yield from batch_plan(group, wait)
            except (ConnectionFailed, RedisConnectionError, RedisTimeoutError) as e:
                # A cluster node that stayed unreachable comes back as its calls' reply.
                err = e if isinstance(e, ConnectionFailed) else ConnectionFailed(str(e))
                raise err.partial(done, [i for op in group for i in op.parse(None)]) from None
            for reply in replies:
                done.extend(reply)
        by_id = {str(s): s for s in done if isinstance(s, Scheduled)}
        return [by_id[i] for i in ids]

    def _schedule_plan(self, op: Op[Scheduled], durable: bool) -> Plan[Scheduled]:
        """One ``schedule``'s call after the first call's shard count check; with
        ``durable``, WAITAOF after it. (Once the count is checked, a call that is not
        durable is run without a plan: ``Queue.schedule``.)"""
        if not self.shards.write_checked:
            yield from self._check_shards_plan()
        if not durable:
            reply: Scheduled = yield Call(op)  # the step itself: a generator less than call()
            return reply
        (reply,) = yield from batch_plan([op], self.durable)
        return reply

    def _schedules_plan(self) -> Plan[list[cron.ScheduleInfo]]:
        state = yield from self._checked(cron.read(self.core))
        return cron.schedules(state)

    def _of(self, task_id: str) -> QueueCore:
        return self.shards.of(validate_task_id(task_id))

    def _stats_plan(self) -> Plan[QueueStats]:
        yield from self._check_shards_plan(store=False)
        if self.shards.n == 1:
            return (yield from call(self.core.stats()))
        parts = yield from batch_plan([c.stats() for c in self.shards.cores])
        return add_stats(parts)

    def _dead_plan(self, offset: int, limit: int) -> Plan[list[TaskInfo]]:
        yield from self._check_shards_plan(store=False)
        if self.shards.n == 1:
            return (yield from call(self.core.dead(offset, limit)))
        check_page(offset, limit, MAX_DEAD_PAGE)
        parts = yield from batch_plan([c.dead(0, offset + limit) for c in self.shards.cores])
        return merge_dead(parts, offset, limit)

    def _page_plan(self, state: str, limit: int, after: str | None) -> Plan[TaskPage]:
        """Keyset paging: one page after the cursor from each shard, merged."""
        ops = [
            c.seek(state, decode_cursor(after) if after else None, limit) for c in self.shards.cores
        ]
        yield from self._check_shards_plan(store=False)
        parts = yield from batch_plan(ops)
        return merge_page(parts, state, limit, functools.partial(self.core.seek_info, state))

    def _replay_plan(
        self, ids: Iterable[str] | None, progress: Progress | None = None
    ) -> Plan[int]:
        """Replay in bounded batches, one script call each (``progress`` hears each count)."""
        ids, progress = _ids_and_progress(ids, progress)
        yield from self._check_shards_plan(store=False)
        if ids is not None:
            ops = [
                core.replay(chunk)
                for core, group in self.shards.group(ids, validate_task_id)
                for chunk in _chunks(group, REPLY_BATCH)
            ]
            return (yield from _each(ops, progress))
        batches = [functools.partial(c.replay, None) for c in self.shards.cores]
        return (yield from _until_none(batches, progress))

    def _purge_plan(
        self,
        ids: Iterable[str] | None,
        older_than: Duration | None,
        progress: Progress | None = None,
    ) -> Plan[int]:
        ids, progress = _ids_and_progress(ids, progress)
        if older_than is not None:
            seconds(older_than, "older_than")  # (refused even beside ids, which it is not for)
        yield from self._check_shards_plan(store=False)
        if ids is not None:
            ops = [
                core.purge_dead(chunk)
                for core, group in self.shards.group(ids, validate_task_id)
                for chunk in _chunks(group, REPLY_BATCH)
            ]
            return (yield from _each(ops, progress))
        before = None
        if older_than is not None:
            stats = yield from call(self.core.stats())
            before = int(stats.now.timestamp() * 1000 - seconds(older_than, "older_than") * 1000)
        purges = [
            functools.partial(c.purge_dead, None, before_ms=before) for c in self.shards.cores
        ]
        return (yield from _until_none(purges, progress))

    # Admission controls (controls.py): one script call per shard, in one round trip.

    def _controls_plan(self, ops: list[Op[T]]) -> Plan[list[T]]:
        yield from self._check_shards_plan(store=False)
        return (yield from batch_plan(ops))

    def _set_limit_plan(self, limit: L) -> Plan[L]:
        n = self.shards.n
        yield from self._controls_plan([controls.set_limit(c, limit, n) for c in self.shards.cores])
        return limit

    def _read_controls_plan(self) -> Plan[Controls]:
        parts = yield from self._controls_plan([controls.read(c) for c in self.shards.cores])
        return controls.merged(parts)

    def _pause_plan(self, paused: bool) -> Plan[bool]:
        ops = [controls.pause(c, paused) for c in self.shards.cores]
        return any((yield from self._controls_plan(ops)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    _runner: Any = None  # made once per client

    def _runner_of(self, make: Callable[..., R]) -> R:
        runner = self._runner
        if runner is None or runner.client is not self.client:
            # A client of the queue's own keeps a connection for single calls (held.py); one
            # passed in may be shared, limited or closed by its owner, so it is left alone.
            runner = self._runner = make(self.client, hold=self._owns_client)
        return runner  # type: ignore[no-any-return]


class Queue(_Base[redis.Redis]):
    """A named queue of delayed tasks, used from blocking code.

    Args:
        name: the queue's name; all its keys live under the hash tag ``{name}``.
        url: Redis URL; default ``DELAYQ_REDIS_URL``, else ``REDIS_URL``, else localhost.
        client: an existing client (made with ``decode_responses=False``) instead of ``url``.
        prefix: the first part of every key of the queue (default ``"dq"``: keys
            ``dq:{name}:...``); every process must use the same one.
        dedupe_window: how long a finished task id is remembered (default 24 h): scheduling
            the id again within it changes nothing.
        max_payload: largest encoded payload accepted, in bytes (default 64 KiB).
        codec: ``"json"`` (default) or ``"msgpack"``.
        durable_timeout: with ``schedule(..., durable=True)``, how long to wait for the
            server to confirm the write is fsynced to its append-only file (default 1 s; 3 s
            with ``durable_replicas``).
        durable_replicas: with ``durable=True``, also wait for this many replicas to fsync
            it (WAITAOF; on servers without WAITAOF, WAIT for their acknowledgement).
        shards: split the queue over this many hash tags (Redis Cluster spreads them over
            its primaries); every process must open the queue with the same number.
            ``"stored"`` (``Queue`` only): the number the queue stored (1 if none), read when
            the queue is opened, for tools that open a queue someone else split.
        clock: for tests, a ``delayq.testing.VirtualClock``: every time this queue and a
            worker on it use (due times, leases, backoff, the dedupe window, cron, expiring
            keys) is read from it instead of the server's clock (docs/testing.md).
        before_schedule: functions ``fn(spec)`` given each :class:`TaskSpec` of
            ``schedule`` and ``schedule_many`` before it is validated, after those of
            ``delayq.hooks.before_schedule`` (process-wide, read at each call). ``spec``
            is frozen, but its ``headers`` is always a dict of the hook's own (a copy of
            the caller's, or a new empty one): add to it in place and return None, or
            return a new spec (``dataclasses.replace(spec, payload=...)``). An exception
            from a hook refuses the call, unwritten.
    """

    _client_kinds = (redis.Redis, redis.RedisCluster)

    def _new_client(self, url: str) -> redis.Redis:
        return sync_client(url, retries=RETRIES)

    @property
    def expiring(self) -> Expiring:
        """Keys with a TTL whose expiry runs a callback: ``set``, ``touch``, ``delete``."""
        return Expiring(self)

    @property
    def runner(self) -> SyncRunner:
        """Runs script calls and plans on this queue's connection (no shard count check)."""
        return self._runner_of(SyncRunner)

    def drive(self, plan: Plan[T]) -> T:
        """Run a plan (``delayq.runner``) on this queue's connection: ``checked`` ones, the
        expiring keys' or an admin's."""
        return self.runner.drive(check_plan(plan))

    def _read_stored(self, op: Op[T]) -> T:
        return self.runner.run(op)

    def _drop_client(self) -> None:
        self.close()

    def schedule(
        self, kind: str, payload: Any = None, **options: Unpack[ScheduleOptions]
    ) -> Scheduled:
        """Schedule ``kind`` with ``payload`` after ``delay`` seconds or ``at`` a time.

        Returns the task id, a :class:`Scheduled` (a ``str``) whose ``.status`` says what
        happened: ``created``, ``replaced``, ``unchanged`` or ``running``. An id already
        waiting, running, finished within the dedupe window, or dead is left unchanged
        unless ``replace=True``, which moves a waiting task (keeping the attempts it has
        made) and re-creates a finished or dead one; a running task is never replaced, and
        its status is then ``running``. With ``durable=True`` it returns only once the
        server's AOF is fsynced (DurabilityError otherwise).

        Args:
            kind: which handler runs it (``@worker.handler(kind)``).
            payload: the handler's ``task.payload``: anything the queue's codec encodes.
            **options: keyword-only; each is optional.

                - ``delay``: seconds (or a ``timedelta``) from now on the server's clock;
                  with neither ``delay`` nor ``at`` the task is due at once.
                - ``at``: an absolute time, an aware ``datetime`` or a Unix timestamp
                  (not with ``delay``).
                - ``task_id``: the task's id, a business key such as ``"order-close:42"``
                  (default: a new random id).
                - ``replace``: move or re-create a task that has this id (above).
                - ``max_attempts``: this task's limit of attempts, which wins over the
                  handler's (0, the default: the handler's).
                - ``durable``: wait for the server's AOF fsync (see ``durable_timeout``
                  and ``durable_replicas`` of :class:`Queue`).
                - ``headers``: a dict of str to str that travels with the task (trace
                  context, a tenant): ``task.headers`` in the handler, ``TaskInfo.headers``,
                  shown by ``delayq task show`` and the dashboard. At most 4 KiB as JSON;
                  kept across retries, replays and reschedules (``replace=True`` writes the
                  new call's).
        """
        op = self._schedule_op(kind, payload, options)
        durable = options.get("durable", False)
        if self.shards.write_checked and not durable:
            return self.runner.run(op)  # the common case: one call, nothing to plan
        return self.runner.drive(self._schedule_plan(op, durable))

    def schedule_many(
        self,
        tasks: Iterable[TaskSpec | Mapping[str, Any]],
        *,
        replace: bool = False,
        durable: bool = False,
    ) -> list[Scheduled]:
        """Schedule many tasks in a few round trips; all are validated before any is sent.
        Returns a :class:`Scheduled` per task, in the order given (see :meth:`schedule`)."""
        return self.runner.drive(self._schedule_many_plan(tasks, replace, durable))

    def cancel(self, task_id: str) -> bool:
        """Remove a waiting task; True if it was still waiting."""
        return self.runner.drive(self._checked(self._of(task_id).cancel(task_id)))

    def abort(self, task_id: str) -> bool:
        """End a task for good, waiting or running; True if it was either. A running
        attempt is stopped: an async handler is cancelled, a sync one sees ``task.aborted``;
        its result is discarded and it is not retried. The task shows as ``"aborted"`` for
        the dedupe window. False for a task that is done, dead, aborted or unknown."""
        return self.runner.drive(self._checked(self._of(task_id).abort(task_id)))

    def reschedule(
        self, task_id: str, *, delay: Duration | None = None, at: datetime | float | None = None
    ) -> bool:
        """Move a waiting task to a new due time; True if it was waiting."""
        op = self._of(task_id).reschedule(task_id, delay=delay, at=at)
        return self.runner.drive(self._checked(op))

    def get(self, task_id: str) -> TaskInfo | None:
        """The task with this id (its state, times, attempts, headers, payload and last
        error), or None if the queue holds no such task."""
        return self.runner.drive(self._checked(self._of(task_id).get(task_id)))

    def stats(self) -> QueueStats:
        """How many tasks are in each state, the head of the schedule and the queue's
        counters, as of the server's clock (every shard of a split queue added up)."""
        return self.runner.drive(self._stats_plan())

    def dead(self, offset: int = 0, limit: int = 100) -> list[TaskInfo]:
        """A page of the dead set, most recent first."""
        return self.runner.drive(self._dead_plan(offset, limit))

    def page(self, state: str, *, limit: int = 100, after: str | None = None) -> TaskPage:
        """A page of the tasks in one state: ``"scheduled"`` (by due time), ``"active"`` (by
        lease deadline), ``"done"`` (by finish time), ``"aborted"`` (by abort time) or
        ``"dead"`` (most recent first). Pass
        the page's ``next`` as ``after`` for the following one: every page costs about the
        same however deep it is (on a sharded queue, at most ``limit`` from each shard),
        unlike ``dead(offset=...)``."""
        return self.runner.drive(self._page_plan(state, limit, after))

    def schedules(self) -> list[cron.ScheduleInfo]:
        """The periodic schedules stored on this queue (``delayq cron list``), by name."""
        return self.runner.drive(self._schedules_plan())

    def workers(self) -> list[WorkerInfo]:
        """Workers registered on this queue, most recently seen first, dead ones included."""
        return self.runner.drive(self._checked(self.core.workers()))

    def protocol_version(self) -> str:
        """The delayq protocol version the queue speaks, as stored in Redis (``"1.0"``), or
        ``""`` when it has none: nothing has written to it yet, or only a delayq from
        before versions were stored (it speaks protocol 1). Refuses, as every operation
        does, a queue of another major (ProtocolVersionError) or shard count. One round
        trip, every call; writes nothing."""
        return self.runner.drive(self._protocol_plan())

    def execute(self, op: Op[T], *, write: bool = False) -> T:
        """Run one script call built by delayq's builders (``delayq.expiring``'s ops, say)
        on this queue, after the check that the queue is opened with its stored shard
        count. ``write``: the call writes, and stores the count when none is stored."""
        return self.runner.drive(self.checked(op, write=write))

    def replay(self, ids: Iterable[str] | None = None, *, progress: Progress | None = None) -> int:
        """Run dead tasks again (all of them when ``ids`` is None); returns how many.
        ``progress`` hears how many each batch (one script call) replayed."""
        return self.runner.drive(self._replay_plan(ids, progress))

    def purge_dead(
        self,
        ids: Iterable[str] | None = None,
        *,
        older_than: Duration | None = None,
        progress: Progress | None = None,
    ) -> int:
        """Delete dead tasks for good: these ids, or all (that died ``older_than`` ago).
        ``progress`` hears how many each batch deleted."""
        return self.runner.drive(self._purge_plan(ids, older_than, progress))

    # -- admission controls (docs/controls.md) ------------------------------------------

    def set_rate_limit(self, rate: str, burst: int | None = None) -> RateLimit:
        """Let workers start at most ``rate`` tasks ("100/s", "30/m", "2/h") of this queue,
        all workers together, with bursts of up to ``burst`` (default: one second's worth,
        at least 1). Tasks over the limit wait, scheduled; nothing is retried for it.
        Raises ConfigurationError for a bad rate or burst, before anything is written."""
        return self.runner.drive(self._set_limit_plan(controls.rate_limit(rate, burst)))

    def rate_limit(self) -> RateLimit | None:
        """The queue's rate limit, None when it has none."""
        return self.controls().limit

    def clear_rate_limit(self) -> None:
        """Remove the rate limit: claims take every due task again."""
        self.runner.drive(self._set_limit_plan(None))

    def pause(self) -> bool:
        """Stop workers claiming this queue's tasks (running ones finish and are written;
        expired leases are still reaped); True unless it was paused already."""
        return self.runner.drive(self._pause_plan(True))

    def resume(self) -> bool:
        """Let workers claim again; idle workers hear of it at once (a wake-up). True unless
        it was not paused."""
        return self.runner.drive(self._pause_plan(False))

    def paused(self) -> bool:
        """Whether the queue is paused (:meth:`pause`)."""
        return self.controls().paused

    def controls(self) -> Controls:
        """The queue's admission controls: paused, the rate limit and its tokens now."""
        return self.runner.drive(self._read_controls_plan())

    def close(self) -> None:
        """Close the connections the queue opened (a ``client=`` given stays open); ``with
        Queue(...) as queue:`` closes them at the end."""
        if self._owns_client:
            if self._runner is not None and self._runner.held is not None:
                self._runner.held.close()
            self.client.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncQueue(_Base[aredis.Redis]):
    """The same queue for asyncio code: every method of :class:`Queue`, as a coroutine.

    It takes the arguments of :class:`Queue`, except ``shards="stored"`` (an asyncio
    client cannot read the stored count while the queue is opened): pass the number.
    ``client``, if given, is a ``redis.asyncio`` client.
    """

    _client_kinds = (aredis.Redis, aredis.RedisCluster)

    def _new_client(self, url: str) -> aredis.Redis:
        return async_client(url, retries=RETRIES)

    @property
    def expiring(self) -> AsyncExpiring:
        return AsyncExpiring(self)

    @property
    def runner(self) -> AsyncRunner:
        return self._runner_of(AsyncRunner)

    async def drive(self, plan: Plan[T]) -> T:
        """Run a plan on this queue's connection (see :meth:`Queue.drive`)."""
        return await self.runner.drive(check_plan(plan))

    def _read_stored(self, op: Op[T]) -> T:
        raise ConfigurationError(
            'shards="stored" reads the count as the queue is opened, which an AsyncQueue '
            'cannot do: pass the number (Queue(name, shards="stored").shards.n tells it)'
        )

    def _drop_client(self) -> None:
        pass  # not connected yet: an asyncio client connects on its first command

    async def schedule(
        self, kind: str, payload: Any = None, **options: Unpack[ScheduleOptions]
    ) -> Scheduled:
        op = self._schedule_op(kind, payload, options)
        durable = options.get("durable", False)
        if self.shards.write_checked and not durable:
            return await self.runner.run(op)  # as Queue.schedule
        return await self.runner.drive(self._schedule_plan(op, durable))

    async def schedule_many(
        self,
        tasks: Iterable[TaskSpec | Mapping[str, Any]],
        *,
        replace: bool = False,
        durable: bool = False,
    ) -> list[Scheduled]:
        return await self.runner.drive(self._schedule_many_plan(tasks, replace, durable))

    async def cancel(self, task_id: str) -> bool:
        return await self.runner.drive(self._checked(self._of(task_id).cancel(task_id)))

    async def abort(self, task_id: str) -> bool:
        return await self.runner.drive(self._checked(self._of(task_id).abort(task_id)))

    async def reschedule(
        self, task_id: str, *, delay: Duration | None = None, at: datetime | float | None = None
    ) -> bool:
        op = self._of(task_id).reschedule(task_id, delay=delay, at=at)
        return await self.runner.drive(self._checked(op))

    async def get(self, task_id: str) -> TaskInfo | None:
        return await self.runner.drive(self._checked(self._of(task_id).get(task_id)))

    async def stats(self) -> QueueStats:
        return await self.runner.drive(self._stats_plan())

    async def dead(self, offset: int = 0, limit: int = 100) -> list[TaskInfo]:
        return await self.runner.drive(self._dead_plan(offset, limit))

    async def page(self, state: str, *, limit: int = 100, after: str | None = None) -> TaskPage:
        return await self.runner.drive(self._page_plan(state, limit, after))

    async def schedules(self) -> list[cron.ScheduleInfo]:
        return await self.runner.drive(self._schedules_plan())

    async def workers(self) -> list[WorkerInfo]:
        return await self.runner.drive(self._checked(self.core.workers()))

    async def protocol_version(self) -> str:
        """The queue's protocol version (see :meth:`Queue.protocol_version`)."""
        return await self.runner.drive(self._protocol_plan())

    async def execute(self, op: Op[T], *, write: bool = False) -> T:
        """Run one script call on this queue after the shard count check (see
        :meth:`Queue.execute`)."""
        return await self.runner.drive(self.checked(op, write=write))

    async def replay(
        self, ids: Iterable[str] | None = None, *, progress: Progress | None = None
    ) -> int:
        return await self.runner.drive(self._replay_plan(ids, progress))

    async def purge_dead(
        self,
        ids: Iterable[str] | None = None,
        *,
        older_than: Duration | None = None,
        progress: Progress | None = None,
    ) -> int:
        return await self.runner.drive(self._purge_plan(ids, older_than, progress))

    # -- admission controls: as on Queue ------------------------------------------------

    async def set_rate_limit(self, rate: str, burst: int | None = None) -> RateLimit:
        return await self.runner.drive(self._set_limit_plan(controls.rate_limit(rate, burst)))

    async def rate_limit(self) -> RateLimit | None:
        return (await self.controls()).limit

    async def clear_rate_limit(self) -> None:
        await self.runner.drive(self._set_limit_plan(None))

    async def pause(self) -> bool:
        return await self.runner.drive(self._pause_plan(True))

    async def resume(self) -> bool:
        return await self.runner.drive(self._pause_plan(False))

    async def paused(self) -> bool:
        return (await self.controls()).paused

    async def controls(self) -> Controls:
        return await self.runner.drive(self._read_controls_plan())

    async def close(self) -> None:
        if self._owns_client:
            if self._runner is not None and self._runner.held is not None:
                await self._runner.held.close()
            await self.client.aclose()

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
