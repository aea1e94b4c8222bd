"""What :class:`~delayq.queue.Queue` and :class:`~delayq.queue.AsyncQueue` share: the
queue's configuration, the validation of what is scheduled, and every operation of several
steps written once as a plan (``runner.py``), which each flavour drives its own way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any, Generic, Literal, TypeVar, cast

import redis
import redis.asyncio as aredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayq import check, controls, hooks
from delayq.codec import DEFAULT_MAX_RESULT, KeepFinished
from delayq.connection import check_client, resolve_url
from delayq.controls import Controls, RateLimit
from delayq.core import MAX_DEAD_PAGE, REPLY_BATCH, Op, QueueCore, check_page
from delayq.cron import facade as cron
from delayq.errors import ConfigurationError, ConnectionFailed, InvalidTaskError
from delayq.history import DEFAULT_HISTORY_WINDOW
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
)
from delayq.settings import QueueSettings, given
from delayq.shards import (
    STORED,
    Shards,
    add_stats,
    decode_cursor,
    merge_dead,
    merge_page,
    stored_count,
    update_op,
)
from delayq.spec import (
    CheckedSpec,
    ScheduleOptions,
    TaskSpec,
    TaskType,
    new_task_id,
    task_ids,
    validate_task_id,
)
from delayq.task import QueueStats, Scheduled, TaskInfo, TaskPage
from delayq.timing import Clock, Duration, seconds

T = TypeVar("T")
C = TypeVar("C", redis.Redis, aredis.Redis)
R = TypeVar("R", SyncRunner, AsyncRunner)
L = TypeVar("L", RateLimit, None)

SCHEDULE_BATCH = 1000  # tasks per script call in schedule_many
CALLS_PER_ROUND_TRIP = 8
MAX_DURABLE_REPLICAS = 1000  # durable_replicas: more than any deployment runs; WAITAOF takes a long


_OPTIONS = frozenset(
    ("delay", "at", "task_id", "replace", "max_attempts", "durable", "headers", "priority")
)


def _spec(kind: str | TaskType[Any, Any], payload: Any, options: ScheduleOptions) -> TaskSpec:
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
        options.get("priority"),
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
        spec.kind,
        spec.payload,
        spec.delay,
        spec.at,
        spec.task_id,
        spec.max_attempts,
        headers,
        spec.priority,
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


class QueueBase(Generic[C]):
    """A named queue of delayed tasks: the configuration and plans shared by :class:`Queue`
    and :class:`AsyncQueue` (their arguments are documented on :class:`Queue`)."""

    def __init__(
        self,
        name: str,
        url: str | None = None,
        *,
        client: C | None = None,
        prefix: str = DEFAULT_PREFIX,
        codec: str | None = None,
        max_payload: int | None = None,
        dedupe_window: Duration | None = None,
        history_window: Duration = DEFAULT_HISTORY_WINDOW,
        durable_timeout: Duration | None = None,
        shards: int | Literal["stored"] = 1,
        durable_replicas: int = 0,
        clock: Clock | None = None,
        before_schedule: Iterable[BeforeSchedule] = (),
        keep_finished: KeepFinished = "tombstone",
        max_result: int = DEFAULT_MAX_RESULT,
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
        check.whole(durable_replicas, "durable_replicas", 0, MAX_DURABLE_REPLICAS)
        # The AOF fsync takes up to ~1 s under appendfsync everysec; a replica's confirmation
        # arrives with its next acknowledgement after its own fsync, about a second later.
        if durable_timeout is None:
            durable_timeout = 3.0 if durable_replicas else 1.0
        self.durable_ms = max(1, round(seconds(durable_timeout, "durable_timeout") * 1000))
        self.durable = Durable(self.durable_ms, durable_replicas)
        # The settings the queue's producers share (delayq/settings.py): None, not given,
        # follows the queue's stored one, else the default; one given must agree with it.
        options: dict[str, Any] = dict(
            prefix=prefix,
            given=given(dedupe_window, max_payload, codec),
            history_window=history_window,
            clock=clock,
            keep_finished=keep_finished,
            max_result=max_result,
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

    def _schedule_specs(
        self, tasks: Iterable[TaskSpec | Mapping[str, Any]], replace: bool, durable: bool
    ) -> list[TaskSpec]:
        """``schedule_many``'s tasks as specs the before_schedule hooks have seen (the
        process-wide ones, delayq.hooks, first). A bad task refuses the whole call unwritten:
        each is then validated and encoded by :meth:`_ops_of`."""
        check.flag(replace, "replace", InvalidTaskError)
        check.flag(durable, "durable", InvalidTaskError)
        items = check.many(tasks, "tasks", error=InvalidTaskError, what="TaskSpecs or dicts")
        return self._hooked([_as_spec(t) for t in items])

    def _ops_of(
        self, specs: list[TaskSpec], replace: bool, durable: bool
    ) -> tuple[list[str], list[Op[list[str]]]]:
        """(ids in the order given, script calls per shard) of specs the hooks have seen:
        all validated and encoded before any is sent."""
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

    def _schedule_op(
        self, kind: str | TaskType[Any, Any], payload: Any, options: ScheduleOptions
    ) -> Op[Scheduled]:
        """The script call of one ``schedule``, validated and encoded."""
        spec, replace, durable = self._schedule_spec(kind, payload, options)
        return self._spec_op(spec, replace, durable)

    def _schedule_spec(
        self, kind: str | TaskType[Any, Any], payload: Any, options: ScheduleOptions
    ) -> tuple[TaskSpec, bool, bool]:
        """One ``schedule``'s spec as the hooks leave it, and its replace and durable."""
        spec = _spec(kind, payload, options)
        replace, durable = options.get("replace", False), options.get("durable", False)
        if replace is not False or durable is not False:  # (the common case: neither given)
            check.flag(replace, "replace", InvalidTaskError)
            check.flag(durable, "durable", InvalidTaskError)
        if hooks.before_schedule or self.before_schedule:
            (spec,) = self._hooked([spec])
        return spec, replace, durable

    def _spec_op(self, spec: TaskSpec, replace: bool, durable: bool) -> Op[Scheduled]:
        """The script call of one ``schedule`` of a spec the hooks have seen, validated and
        encoded. A task given no id, and neither ``replace`` nor ``durable``, is new to the
        queue: ``schedule_new.lua`` (what ``schedule.lua`` does for a new task, in fewer
        commands) on its id's shard. Any other, or one given a priority (schedule.lua's), is a
        ``schedule_many`` of one task."""
        if spec.task_id is None and not (replace or durable) and spec.priority is None:
            task_id = new_task_id()
            return self.shards.of(task_id).schedule_new(spec, task_id)
        if self.shards.n == 1:  # (encode_tasks checks the id: no lists of a batch)
            return _first(self.core.schedule([spec], replace=replace, durable=durable))
        _, ops = self._ops_of([spec], replace, durable)
        return _first(ops[0])

    # Multi-step operations, written once as plans (see runner.py); each flavour drives them.

    def _encoded_plan(self, build: Callable[[], T]) -> Plan[T]:
        """``build()`` (validating and encoding tasks with the queue's settings) on a queue
        object's first write, and the shard count check, in one round trip: the settings
        come with the count (``shards.lua``). Built first with this process's settings, so
        bad input is refused before any call; built again if the queue's differ. A refusal
        that the queue's settings may undo (a payload over this process's limit, one its
        codec cannot encode) reads them first (a read: nothing is written) and builds again:
        the queue's settings decide. Once checked, only ``build()``."""
        if self.shards.write_checked:
            return build()
        try:
            made = build()
        except InvalidTaskError as refused:
            if self.shards.checked:
                raise
            try:
                yield from self._check_shards_plan(store=False)
            except (ConnectionFailed, RedisConnectionError, RedisTimeoutError):
                raise refused from None  # (no server to ask: this process's refusal)
            made = build()
        settings = self.shards.settings
        yield from self._check_shards_plan()
        if self.shards.settings != settings:
            made = build()  # the queue's settings differ from those it was built with
        return made

    def _settings_plan(self) -> Plan[QueueSettings]:
        """The queue's settings, read now (one round trip, every call), with the checks of
        a first call; this queue object follows them from now on."""
        stored = yield from call(self.shards.check_op(store=False))
        self.shards.verify(stored)
        return self.shards.settings

    def _update_settings_plan(
        self, dedupe_window: Duration | None, max_payload: int | None, codec: str | None
    ) -> Plan[QueueSettings]:
        new = given(dedupe_window, max_payload, codec)
        stored = yield from call(update_op(self.shards.root, new))
        return self.shards.follow(stored, new)

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
        specs = self._schedule_specs(tasks, replace, durable)
        ids, ops = yield from self._encoded_plan(lambda: self._ops_of(specs, replace, durable))
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

    def _schedule_plan(
        self, kind: str | TaskType[Any, Any], payload: Any, options: ScheduleOptions
    ) -> Plan[Scheduled]:
        """One ``schedule``'s call after the first call's shard count check (and the
        settings with it); with ``durable``, WAITAOF after it. (Once the count is checked, a
        call that is not durable is run without a plan: ``Queue.schedule``.)"""
        spec, replace, durable = self._schedule_spec(kind, payload, options)
        op = yield from self._encoded_plan(lambda: self._spec_op(spec, replace, durable))
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
