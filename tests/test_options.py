"""Every public option is validated at the edge (issue 28): a walk over the public
signatures feeds each parameter values of the wrong type and fails if any is accepted.

The walk finds the parameters itself (``inspect.signature``; a ``**options`` is followed to
where its options are declared), and derives the wrong values from each parameter's
annotation: a str for a bool, an int or a float, a float for an int, a bool for an int,
None where None is not allowed, an ``object()`` for anything. A parameter added without a
check fails here. Each wrong value must be refused with delayq's error for bad input
(``ConfigurationError`` for settings, ``InvalidTaskError`` for what a task is given)
naming the parameter, before anything is sent: a TypeError or AttributeError from deep
inside is a failure too. ``ALLOWED`` lists the parameters that take anything, each with
why. Queue methods run against a real server (the first flavour's; the checks are Python's).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import secrets
import types
import typing
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import delayq.testing
from delayq import AsyncQueue, ConfigurationError, InvalidTaskError, Queue, Task, Worker
from delayq.embedded import EmbeddedServer
from delayq.expiring.facade import AsyncExpiring, Expiring
from delayq.spec import ScheduleOptions
from delayq.testing import Drained, VirtualClock
from delayq.worker.features.cron import HANDLER_OPTIONS, Schedules

from .conftest import FLAVOURS

# Parameters that take any value, or whose wrong values cannot be told by type:
ALLOWED = {
    "payload": "a task's payload: anything the queue's codec encodes (its encoder refuses "
    "the rest, with InvalidTaskError)",
    "value": "an expiring key's value: anything the codec encodes, as a payload",
}

# What a parameter annotated ``Any`` takes (the walk cannot read it from the signature).
TAKES: dict[str, Any] = {
    "backoff": collections.abc.Sequence[float] | collections.abc.Callable[[int], float] | None,
    "client": aredis.Redis | aredis.RedisCluster | None,  # Worker(client=): an asyncio one
}

# Values of the wrong type to try; each is fed where the annotation does not allow it.
WRONG: list[Any] = ["no", 7, 1.5, True, None, b"x", object()]


# -- reading annotations ------------------------------------------------------------------------


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    target = inspect.unwrap(fn.__init__ if isinstance(fn, type) else fn)
    module = inspect.getmodule(target)
    names = {
        **vars(delayq),
        **vars(typing),
        "Worker": Worker,
        "Queue": Queue,
        "AsyncQueue": AsyncQueue,
        "Task": Task,
    }
    return typing.get_type_hints(target, globalns={**names, **vars(module)})


def _accepts(hint: Any, value: Any) -> bool:
    """Whether ``value`` is of a type the annotation allows (bool is not an int here, an
    int is a float, and a str is no collection of things)."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(h, value) for h in typing.get_args(hint))
    if origin is typing.Literal:
        return any(type(value) is type(a) and value == a for a in typing.get_args(hint))
    if isinstance(hint, typing.TypeVar):
        options = hint.__constraints__ or ((hint.__bound__,) if hint.__bound__ else ())
        return any(_accepts(h, value) for h in options) if options else True
    return _is_a(origin or hint, value)


NUMBERS: dict[Any, Callable[[Any], bool]] = {
    None: lambda v: v is None,
    type(None): lambda v: v is None,
    bool: lambda v: type(v) is bool,
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    float: lambda v: isinstance(v, int | float) and not isinstance(v, bool),
}
COLLECTIONS = (
    collections.abc.Iterable,
    collections.abc.Sequence,
    collections.abc.Mapping,
    list,
    tuple,
    dict,
)


def _is_a(base: Any, value: Any) -> bool:
    """``_accepts`` for one type: a scalar, a callable, a collection, a protocol, a class."""
    if base in NUMBERS:
        return NUMBERS[base](value)
    if base is collections.abc.Callable:
        return callable(value)
    if base in COLLECTIONS:
        return isinstance(value, base) and not isinstance(value, str | bytes)
    if isinstance(base, type) and getattr(base, "_is_protocol", False):
        return all(hasattr(value, m) for m in vars(base) if not m.startswith("_"))
    if isinstance(base, type):
        return isinstance(value, base)
    raise AssertionError(f"the walk cannot read the annotation {base!r}: teach _accepts")


# -- the table: what to call, and a valid value for each required parameter -----------------


@dataclasses.dataclass
class Entry:
    """One public call: ``make()`` gives the callable (a fresh owner each time), ``valid``
    the values its required parameters take, ``decorator``: apply the result to a
    function, ``forward``: where its ``**options`` are declared (and under which names)."""

    name: str
    make: Callable[[], Callable[..., Any]]
    valid: dict[str, Any] = dataclasses.field(default_factory=dict)
    decorator: Callable[..., Any] | None = None
    forward: dict[str, tuple[Callable[..., Any], frozenset[str] | None]] = dataclasses.field(
        default_factory=dict
    )
    positional: tuple[str, ...] = ()  # passed by position (the target's *args)


def _handler(task: Task) -> None:
    pass


async def _async_fn(*args: Any) -> None:
    pass


async def _middleware(task: Task, call_next: Any) -> Any:
    return await call_next(task)


def _signature_params(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]


def _cases(entry: Entry) -> Iterator[tuple[str, Any, Any]]:
    """(parameter, its annotation, a wrong value) for every parameter the entry takes."""
    fn = entry.make()
    hints = _hints(fn)
    for p in _signature_params(fn):
        if p.kind is p.VAR_KEYWORD or p.kind is p.VAR_POSITIONAL:
            assert p.name in entry.forward or p.kind is p.VAR_POSITIONAL, (
                f"{entry.name}(**{p.name}): say in the table where its options are declared"
            )
            if p.kind is p.VAR_POSITIONAL:
                continue
            target, names = entry.forward[p.name]
            if isinstance(target, type) and typing.is_typeddict(target):
                options = typing.get_type_hints(target)
            else:
                options = _hints(target)
                options = {
                    q.name: options.get(q.name, Any)
                    for q in _signature_params(target)
                    if q.kind not in (q.VAR_KEYWORD, q.VAR_POSITIONAL)
                }
            for name, hint in options.items():
                if names is None or name in names:
                    yield from _wrongs(entry, name, hint)
            continue
        yield from _wrongs(entry, p.name, hints.get(p.name, Any))


def _wrongs(entry: Entry, name: str, hint: Any) -> Iterator[tuple[str, Any, Any]]:
    if name in ALLOWED:
        return
    if hint is Any:
        hint = TAKES.get(name, Any)
    assert hint is not Any, (
        f"{entry.name}({name}=...) is annotated Any: give what it takes in TAKES, or say why "
        "it takes anything in ALLOWED"
    )
    wrong = [v for v in WRONG if not _accepts(hint, v)]
    assert wrong, f"{entry.name}({name}=...): no wrong value to try for {hint!r}"
    for value in wrong:
        yield name, hint, value


@dataclasses.dataclass(frozen=True)
class Fresh:
    """A valid value made anew for each call (a plan runs once)."""

    make: Callable[[], Any]


def _args(entry: Entry, name: str, value: Any) -> tuple[list[Any], dict[str, Any]]:
    """The call's arguments: the valid ones, with ``name`` given ``value`` ("": none)."""
    valid = {k: v.make() if isinstance(v, Fresh) else v for k, v in entry.valid.items()}
    kwargs = {**valid, name: value} if name else valid
    args = [kwargs.pop(p) for p in entry.positional if p in kwargs]
    return args, kwargs


def _judge(entry: Entry, name: str, hint: Any, value: Any, error: Exception | None) -> str:
    """ "" when the wrong value was refused as it should be, else what went wrong."""
    what = f"{entry.name}({name}={value!r}) [{hint}]"
    if error is None:
        return f"{what}: accepted"
    if not isinstance(error, ConfigurationError | InvalidTaskError):
        return f"{what}: raised {type(error).__name__}: {error}"
    # The parameter is named; a call of one parameter may name itself instead
    # ("a middleware is an async function ..." for middleware(fn)).
    call = entry.name.rpartition(".")[2]
    only = len(_signature_params(entry.make())) == 1
    if name not in str(error) and not (only and call in str(error)):
        return f"{what}: refused without naming {name!r}: {error}"
    return ""


def _aborted(url: str, name: str) -> str:
    """The id of an aborted task of queue ``name``: what wait() returns at once."""
    with Queue(name, url=url) as queue:
        queue.schedule("k", {}, task_id="w-aborted", delay=600)
        queue.abort("w-aborted")
    return "w-aborted"


def _walk(entries: list[Entry]) -> None:
    """Each entry's baseline works, and each wrong value is refused (sync calls)."""
    failures: list[str] = []
    for entry in entries:
        _call(entry, *_args(entry, "", None))  # the baseline: accepted
        for name, hint, value in _cases(entry):
            error: Exception | None = None
            try:
                _call(entry, *_args(entry, name, value))
            except Exception as e:  # (judged below)
                error = e
            failures.append(_judge(entry, name, hint, value, error))
    assert not any(failures), "\n".join(f for f in failures if f)


def _call(entry: Entry, args: list[Any], kwargs: dict[str, Any]) -> None:
    result = entry.make()(*args, **kwargs)
    assert not inspect.isawaitable(result), f"{entry.name} is a coroutine: walk it with _awalk"
    if entry.decorator is not None:
        result(entry.decorator)


async def _awalk(entries: list[Entry]) -> None:
    """As :func:`_walk`, awaiting what each call returns."""
    failures: list[str] = []
    for entry in entries:
        await _acall(entry, *_args(entry, "", None))  # the baseline: accepted
        for name, hint, value in _cases(entry):
            error: Exception | None = None
            try:
                await _acall(entry, *_args(entry, name, value))
            except Exception as e:  # (judged below)
                error = e
            failures.append(_judge(entry, name, hint, value, error))
    assert not any(failures), "\n".join(f for f in failures if f)


async def _acall(entry: Entry, args: list[Any], kwargs: dict[str, Any]) -> None:
    result = entry.make()(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    if entry.decorator is not None:
        result(entry.decorator)


# -- the entries --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    srv = EmbeddedServer(FLAVOURS[0][1], appendonly=False).start()
    try:
        yield srv.url
    finally:
        srv.stop()


def _name() -> str:
    return f"opt-{secrets.token_hex(4)}"


def _queue_entries(queue: Any, url: str, client: Any) -> list[Entry]:
    """The queue's constructor and every public method, and its expiring keys' methods."""
    cls = type(queue)
    prefix = cls.__name__
    expiring = queue.expiring
    exp = type(expiring).__name__

    def on_queue(method: str) -> Callable[[], Callable[..., Any]]:
        return lambda: getattr(queue, method)

    def on_expiring(method: str) -> Callable[[], Callable[..., Any]]:
        return lambda: getattr(expiring, method)

    stats = queue.core.stats()
    entries = [
        Entry(prefix, lambda: cls, {"name": _name(), "url": url}),
        Entry(prefix + "(client=)", lambda: cls, {"name": _name(), "client": client}),
        Entry(
            f"{prefix}.schedule",
            on_queue("schedule"),
            {"kind": "k"},
            forward={"options": (ScheduleOptions, None)},
        ),
        Entry(f"{prefix}.schedule_many", on_queue("schedule_many"), {"tasks": [{"kind": "k"}]}),
        Entry(f"{prefix}.cancel", on_queue("cancel"), {"task_id": "t-1"}),
        Entry(f"{prefix}.abort", on_queue("abort"), {"task_id": "t-1"}),
        Entry(f"{prefix}.reschedule", on_queue("reschedule"), {"task_id": "t-1", "delay": 1}),
        Entry(f"{prefix}.get", on_queue("get"), {"task_id": "t-1"}),
        Entry(f"{prefix}.wait", on_queue("wait"), {"task_id": _aborted(url, queue.name)}),
        Entry(f"{prefix}.page", on_queue("page"), {"state": "scheduled"}),
        Entry(f"{prefix}.replay", on_queue("replay"), {"ids": ["t-1"]}),
        Entry(f"{prefix}.purge_dead", on_queue("purge_dead"), {"ids": ["t-1"]}),
        Entry(f"{prefix}.execute", on_queue("execute"), {"op": stats}),
        Entry(f"{prefix}.checked", on_queue("checked"), {"op": stats}),
        Entry(
            f"{prefix}.drive",
            on_queue("drive"),
            {"plan": Fresh(lambda: queue.checked(stats))},  # (a plan runs once)
        ),
        Entry(f"{prefix}.set_rate_limit", on_queue("set_rate_limit"), {"rate": "10/s"}),
        Entry(f"{prefix}.update_settings", on_queue("update_settings"), {"max_payload": 65536}),
        Entry(f"{exp}.set", on_expiring("set"), {"key": "ek", "value": 1, "ttl": 10}),
        Entry(f"{exp}.touch", on_expiring("touch"), {"key": "ek", "ttl": 10}),
        Entry(f"{exp}.delete", on_expiring("delete"), {"key": "ek"}),
    ]
    # Every other public method, with no arguments (dead, stats, pause, the controls, ...):
    # one given a parameter later is walked with it; one given a required parameter fails
    # its baseline here until it is listed above with a valid value.
    listed = {e.name.rpartition(".")[2] for e in entries}
    for method, _ in inspect.getmembers(cls, inspect.isfunction):
        if not method.startswith("_") and method not in listed and method != "close":
            entries.append(Entry(f"{prefix}.{method}", on_queue(method)))
    return entries


# Worker's public methods the walk leaves out, each with why: none takes an option of the
# user's (a new method must be walked, or listed here).
WORKER_NOT_WALKED = {
    "run": "no parameters; it serves until a signal (serve() is walked)",
    "stop": "no parameters",
    "context": "the engine's seam for delayq.testing.drain: its values are the engine's own",
    "contexts": "as context",
    "sources": "no parameters; what the claim loop claims from",
    "middleware_in_use": "no parameters; the middleware a worker starting now composes",
    "registration": "what the worker publishes about itself (lane: an index of its own)",
    "schedules_of": "a lookup of the schedules of one of the worker's queues (queue= as in "
    "handler, walked there)",
}


def _worker_entries(queue: Any) -> list[Entry]:
    def fresh() -> Worker:
        return Worker(queue)

    handler_options = (Worker.handler, HANDLER_OPTIONS)
    return [
        Entry("Worker", lambda: Worker, {"queue": queue}),
        Entry("Worker.handler", lambda: fresh().handler, {"kind": "k"}, decorator=_handler),
        Entry(
            "Worker.cron",
            lambda: fresh().cron,
            {"expression": "*/5 * * * *"},
            decorator=_handler,
            forward={"options": (Schedules.cron, None)},
        ),
        Entry(
            "Schedules.cron",
            lambda: fresh().schedules.cron,
            {"expression": "*/5 * * * *"},
            decorator=_handler,
            forward={"handler_options": handler_options},
        ),
        Entry(
            "Worker.every",
            lambda: fresh().every,
            {"interval": 60},
            decorator=_handler,
            forward={"options": (Schedules.every, None)},
            positional=("interval",),
        ),
        Entry(
            "Schedules.every",
            lambda: fresh().schedules.every,
            {"interval": 60},
            decorator=_handler,
            forward={"handler_options": handler_options},
        ),
        Entry("Worker.on_expire", lambda: fresh().on_expire, {"pattern": "k*"}, decorator=_handler),
        Entry("Worker.on_startup", lambda: fresh().on_startup, {"fn": _async_fn}),
        Entry("Worker.on_dead", lambda: fresh().on_dead, {"fn": _handler}),
        Entry("Worker.middleware", lambda: fresh().middleware, {"fn": _middleware}),
        Entry("Worker.add_listener", lambda: fresh().add_listener, {"listener": _handler}),
        Entry("Worker.configure", lambda: fresh().configure),
        Entry("Worker.serve", lambda: _stopped(fresh()).serve),
    ]


def _stopped(worker: Worker) -> Worker:
    worker.stop()  # a serve() let through (the baseline) returns at once
    return worker


def _testing_entries(url: str, drain: Callable[..., Any]) -> list[Entry]:
    worker = Worker(Queue(_name(), url=url, clock=VirtualClock()))
    return [
        Entry("VirtualClock", lambda: VirtualClock),
        Entry("VirtualClock.advance", lambda: VirtualClock().advance, {"delta": 1}),
        Entry(
            "VirtualClock.advance_to",
            lambda: VirtualClock().advance_to,
            {"when": datetime.now(UTC) + timedelta(hours=1)},
        ),
        Entry(drain.__name__, lambda: drain, {"worker": worker}),
        Entry("Drained.by_kind", lambda: Drained().by_kind, {"kind": "k"}),
    ]


def test_the_walk_sees_every_public_entry() -> None:
    """What delayq.testing exports is walked (Ran and Drained are what drain returns, made
    by delayq, not given; Drained.by_kind is walked); so is every public method of Worker
    but those WORKER_NOT_WALKED names, and every one of queue.expiring's."""
    assert set(delayq.testing.__all__) == {"VirtualClock", "drain", "adrain", "Drained", "Ran"}
    walked = {e.name.partition(".")[2] for e in _worker_entries(None)} - {""}
    public = {n for n, _ in inspect.getmembers(Worker, inspect.isfunction) if n[0] != "_"}
    assert public == walked | set(WORKER_NOT_WALKED)
    assert {n for n in vars(Expiring) if n[0] != "_"} == {"set", "touch", "delete"}
    assert {n for n in vars(AsyncExpiring) if n[0] != "_"} == {"set", "touch", "delete"}


def test_sync_calls_refuse_every_wrong_type(url: str) -> None:
    """Queue, queue.expiring, the Worker and its decorators, and delayq.testing (drain runs
    in blocking code)."""
    client = redis.Redis.from_url(url)
    with Queue(_name(), url=url) as queue:
        entries = [*_queue_entries(queue, url, client), *_worker_entries(queue)]
        entries += _testing_entries(url, delayq.testing.drain)
        entries = [e for e in entries if e.name != "Worker.serve"]  # (a coroutine: below)
        _walk(entries)
    client.close()


async def test_async_calls_refuse_every_wrong_type(url: str) -> None:
    """AsyncQueue, its expiring keys, a Worker of it and its serve(), and adrain."""
    client = aredis.Redis.from_url(url)
    async with AsyncQueue(_name(), url=url) as queue:
        entries = [*_queue_entries(queue, url, client), *_worker_entries(queue)]
        entries.append(_testing_entries(url, delayq.testing.adrain)[3])
        await _awalk(entries)
    await client.aclose()


def test_replace_and_durable_take_only_true_or_false(url: str) -> None:
    """Finding 11: replace="no" was taken as True, and durable read by truthiness; now
    refused, naming the option, and nothing is written."""
    with Queue(_name(), url=url) as queue:
        queue.schedule("k", 1, task_id="a")
        for options in (
            {"replace": "no"},
            {"replace": 1},
            {"replace": None},
            {"durable": "no"},
            {"durable": 0},
            {"durable": []},
        ):
            (name,) = options
            with pytest.raises(InvalidTaskError, match=f"{name} must be True or False"):
                queue.schedule("k", 2, task_id="a", **options)  # type: ignore[arg-type]
            with pytest.raises(InvalidTaskError, match=f"{name} must be True or False"):
                queue.schedule_many([{"kind": "k", "task_id": "b"}], **options)
        info = queue.get("a")
        assert info is not None and info.payload == 1  # not replaced
        assert queue.get("b") is None and queue.stats().scheduled == 1


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda q: Worker(q, max_wait=0), "max_wait"),
        (lambda q: Worker(q, max_wait=0.01), "max_wait"),
        (lambda q: Worker(q).handler("k", timeout=0)(lambda task: None), "timeout"),
        (lambda q: Worker(q).handler("k", timeout=0.0001)(lambda task: None), "timeout"),
        (lambda q: Queue(q.name, url=q.url, durable_replicas=10**30), "durable_replicas"),
    ],
)
def test_values_of_the_right_type_out_of_range_are_refused(
    url: str, make: Callable[[Any], object], name: str
) -> None:
    """Found by the review of issue 28: Worker(max_wait=0) made an idle worker send 8,519
    script calls in 3 s; a handler's timeout=0 made every task dead unrun; a huge
    durable_replicas wrote the task, then failed in WAITAOF. Each is refused at the call."""
    queue = Queue("range-" + secrets.token_hex(3), url=url)
    try:
        with pytest.raises(ConfigurationError, match=name):
            make(queue)
    finally:
        queue.close()
