"""One queue's part of a worker: a :class:`Lane`.

A worker serves one queue or several on one server (``Worker([orders, emails])``); each is
a *lane*. What is declared for a queue lives on its lane from the worker's start: its
handlers (the registry), its start-up hooks, the extensions plugged into it (cron's
schedules, expiring keys), and when the worker last registered on it. Once the worker
serves, the engine opens each lane (:meth:`Lane.open`): its context, its Executor (which
runs its handlers), its Finisher (which writes their results), its heartbeat, the leases it
holds and its per-kind caps; :class:`~delayq.worker.runs.Runs` keeps each run's books on
the run's lane, since the same task id may be held on two queues at once. The concurrency
slots are the worker's, shared by its lanes.

A feature (periodic schedules, expiring keys: ``worker/features/``) plugs into a lane as an
:class:`Extension`, an object with named hooks, as Dramatiq's middleware is: the engine
calls them and knows no feature by name.

A new per-queue setting goes on the lane: declared here, handed to its parts by
:meth:`Lane.open`. A new feature is an Extension in ``worker/features/`` (its pure parts,
script calls and parsing, in a package of its own beside ``cron/`` and ``expiring/``) and a
decorator on the Worker that adds it to a lane.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from delayq import check
from delayq.connection import redact
from delayq.errors import ConfigurationError
from delayq.queue import AsyncQueue, Queue
from delayq.worker.context import Loop, StartupHook, WorkerContext
from delayq.worker.execute import Executor
from delayq.worker.heartbeat import Heartbeat
from delayq.worker.outcome import Finisher
from delayq.worker.registry import Handler, Registry

if TYPE_CHECKING:
    from delayq.leasing import Claimed
    from delayq.worker.runs import Run

QueueLike = Queue | AsyncQueue

REGISTER_EVERY_S = 5.0
# An unchanged registration is sent as "" (one ZADD); the whole of it at least this often.
REREGISTER_EVERY_S = 60.0


def checked_queues(queue: QueueLike | Sequence[QueueLike]) -> tuple[QueueLike, ...]:
    """The worker's queues: one, or several on the same server, each named once."""
    listed = isinstance(queue, Sequence) and not isinstance(queue, str | bytes)
    queues = (queue,) if isinstance(queue, (Queue, AsyncQueue)) else tuple(queue) if listed else ()
    if not queues or not all(isinstance(q, (Queue, AsyncQueue)) for q in queues):
        raise ConfigurationError(
            f"Worker(queue=) takes a Queue (or AsyncQueue), or a list of them, got {queue!r:.200}"
        )
    first = queues[0]
    names = [q.name for q in queues]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigurationError(f"queue {twice[0]!r} is given twice: list each queue once")
    for q in queues[1:]:
        if q.url != first.url or q.core.keys.prefix != first.core.keys.prefix:
            raise ConfigurationError(
                f"the queues of one worker share a server and a key prefix: {q.name!r} is on "
                f"{redact(q.url)} (prefix {q.core.keys.prefix!r}), {first.name!r} on "
                f"{redact(first.url)} (prefix {first.core.keys.prefix!r}); run a worker per "
                "server"
            )
        if q.core.clock is not first.core.clock:
            raise ConfigurationError(
                f"the queues of one worker share one clock: {q.name!r} and {first.name!r} were "
                "given different clock= (give them the same VirtualClock)"
            )
    return queues


@dataclass
class Registration:
    """When this worker last registered on one queue, and what it sent."""

    at: float = -REGISTER_EVERY_S
    info: str = ""  # the last whole registration sent, and when
    full_at: float = -REREGISTER_EVERY_S

    def due(self, worker_id: str, info: Callable[[], str]) -> tuple[str, str]:
        """What a claim carries: (worker id, registration), ("", "") for none. A claim
        registers only every REGISTER_EVERY_S, and sends the registration itself only when
        it changed (or once a minute): an idle worker's registration is then one ZADD with
        each of its looks (every max_wait, at most every REGISTER_EVERY_S)."""
        now = time.monotonic()
        if now - self.at < REGISTER_EVERY_S:
            return "", ""
        self.at = now
        text = info()
        if text == self.info and now - self.full_at < REREGISTER_EVERY_S:
            return worker_id, ""
        self.info, self.full_at = text, now
        return worker_id, text

    def unsent(self) -> None:
        """The claim that carried the whole registration failed: send it again."""
        self.full_at = -REREGISTER_EVERY_S


class Extension(Protocol):
    """A feature's hooks into one lane of a worker, called in this order:

    1. :meth:`register`, when it is added to the lane (:meth:`Lane.add`, before serving);
    2. :meth:`attach`, whenever a context is built for the lane: when the worker begins to
       serve, and when ``delayq.testing.drain`` builds its own;
    3. :meth:`loops`, started under the worker's supervision once the worker's own loops
       run, and cancelled when it exits;
    4. :meth:`startup`, awaited before the first claim, in the order of declaration with
       ``on_startup``'s, if :meth:`register` (or a later declaration) put it in
       ``lane.startup``: an extension with nothing declared yet has nothing to start.

    A loop that must follow the start-up pass is started by that pass (``ctx.supervise``).
    """

    def register(self, lane: Lane) -> None:
        """Added to ``lane``: declare its handlers there (``lane.registry``)."""

    def attach(self, ctx: WorkerContext) -> None:
        """A context is built for the lane: take it, and wire into it what needs no I/O (a
        channel on the waker's connection, say)."""

    def loops(self) -> Sequence[tuple[str, Loop]]:
        """Its background loops, by name."""

    async def startup(self, ctx: WorkerContext) -> None:
        """Its start-up, with the lane's context (see the class docstring)."""


X = TypeVar("X", bound=Extension)


class Lane:
    """One of a worker's queues, and everything the worker keeps for it (module docstring).

    ``ctx``, ``executor``, ``finisher`` and ``heartbeat`` are the serving worker's, set by
    :meth:`open` when it begins to serve.
    """

    ctx: WorkerContext
    executor: Executor
    finisher: Finisher
    heartbeat: Heartbeat

    def __init__(self, queue: QueueLike, index: int = 0) -> None:
        self.queue = queue
        self.name = queue.name
        self.index = index  # its place in the worker's queues
        # Its share of the worker's claims against the other lanes' (Worker(weights=)).
        self.weight = 1
        self.registry = Registry()
        # Awaited in order with the lane's context once serving has begun, before the first
        # claim: on_startup's (on the first lane) and the extensions' own (cron's pass).
        self.startup: list[StartupHook] = []
        self.extensions: list[Extension] = []
        self.registration = Registration()
        # The runs held here (Runs): the current run of each task, and the leases the
        # heartbeat extends (id -> its claim; only while the run's state extends it,
        # lifecycle.EXTENDED: never for a result handed to the Finisher).
        self.by_id: dict[str, Run] = {}
        self.leases: dict[str, Claimed] = {}
        # Per-kind concurrency: kind -> its handler's cap, and the runs of it held (claimed,
        # not yet finished); empty when no handler has a cap, and then nothing is counted.
        self.caps: dict[str, int] = {}
        self.of_kind: dict[str, set[Run]] = {}

    def add(self, extension: X) -> X:
        """Plug ``extension`` into this lane; returns it."""
        extension.register(self)
        self.extensions.append(extension)
        return extension

    def extension(self, kind: type[X]) -> X | None:
        """The lane's extension of type ``kind``, if one was added."""
        for ext in self.extensions:
            if isinstance(ext, kind):
                return ext
        return None

    def open(
        self, ctx: WorkerContext, executor: Executor, finisher: Finisher, heartbeat: Heartbeat
    ) -> None:
        """The worker serves: the lane's parts, its books emptied and its caps read from its
        handlers (the heartbeat extends :attr:`leases`, the same dict throughout)."""
        self.ctx, self.executor, self.finisher, self.heartbeat = ctx, executor, finisher, heartbeat
        self.by_id.clear()
        self.leases.clear()
        self.caps = self.registry.caps()
        self.of_kind = {kind: set() for kind in self.caps}

    def held_of_kind(self) -> dict[str, int]:
        """Kind -> runs of it held, for the kinds with a cap."""
        return {kind: len(runs) for kind, runs in self.of_kind.items()}

    def __repr__(self) -> str:
        return f"Lane({self.name!r})"


def lane_of(lanes: Sequence[Lane], queue: QueueLike | str) -> Lane:
    """The lane of ``queue``, given as itself or by name (``queue=`` of the decorators)."""
    for lane in lanes:
        q = lane.queue
        if (
            q is queue
            or q.name == queue
            or (isinstance(queue, (Queue, AsyncQueue)) and q.name == queue.name)
        ):
            return lane
    name = queue.name if isinstance(queue, (Queue, AsyncQueue)) else queue
    raise ConfigurationError(
        f"queue={name!r} is not one of this worker's queues "
        f"({', '.join(repr(lane.name) for lane in lanes)}): pass one of them"
    )


MAX_WEIGHT = 1000


def set_weights(lanes: Sequence[Lane], weights: Any) -> bool:
    """``Worker(weights=)``: a mapping of the worker's queues (or their names) to whole
    numbers from 1 to MAX_WEIGHT, set on their lanes (a queue left out weighs 1). Returns
    whether any was given. ConfigurationError names what is wrong."""
    if weights is None:
        return False
    if not isinstance(weights, Mapping):
        raise ConfigurationError(
            f"weights must be a dict of the worker's queues (or their names) to whole numbers, "
            f"got {check.shown(weights)}; e.g. weights={{payments: 5, emails: 1}}"
        )
    seen: set[int] = set()
    for queue, weight in weights.items():
        if not isinstance(queue, (Queue, AsyncQueue, str)):
            raise ConfigurationError(
                f"weights has the key {check.shown(queue)}: key it by one of the worker's "
                "queues, or its name"
            )
        name = queue if isinstance(queue, str) else queue.name
        try:
            lane = lane_of(lanes, queue)
        except ConfigurationError:
            raise ConfigurationError(
                f"weights names the queue {name!r}, which is not one of this worker's queues "
                f"({', '.join(repr(lane.name) for lane in lanes)}): weigh only those"
            ) from None
        if lane.index in seen:
            raise ConfigurationError(f"weights gives the queue {name!r} twice: weigh it once")
        seen.add(lane.index)
        lane.weight = check.whole(
            weight,
            f"weights[{name!r}]",
            1,
            MAX_WEIGHT,
            hint=" (the queue's share of the worker's claims against the others')",
        )
    return bool(seen)


def one_lane(lanes: Sequence[Lane], queue: QueueLike | str | None, what: str) -> Lane:
    """The lane a cron schedule or an expiry callback belongs to: ``queue=``'s, else the only
    one; a worker of several queues must be told which."""
    if queue is not None:
        return lane_of(lanes, queue)
    if len(lanes) > 1:
        raise ConfigurationError(
            f"this worker serves several queues ({', '.join(lane.name for lane in lanes)}):"
            f" pass queue= to {what} to say which queue it belongs to"
        )
    return lanes[0]


def add_handler(lanes: Sequence[Lane], to: Sequence[Lane], handler: Handler) -> None:
    """``handler`` on each lane of ``to`` (of the worker's ``lanes``), or on none: a kind
    taken on one of them is refused first."""
    taken = [lane.name for lane in to if lane.registry.get(handler.kind)]
    if taken:
        where = f" on queue {taken[0]!r}" if len(lanes) > 1 else ""
        raise ConfigurationError(f"a handler for {handler.kind!r} is already registered{where}")
    for lane in to:
        lane.registry.add(handler)


class WorkerHook:
    """A function given to ``Worker.on_startup``: awaited with the worker, not the
    context."""

    def __init__(self, fn: Callable[[Any], Awaitable[None]], worker: Any) -> None:
        self.fn = fn
        self.worker = worker

    def __call__(self, ctx: WorkerContext) -> Awaitable[None]:
        return self.fn(self.worker)

    def __repr__(self) -> str:
        return repr(self.fn)


def registration_text(
    concurrency: int, in_flight: int, kinds: list[str], started: float, beat: float
) -> str:
    """What a worker publishes about itself on every claim and heartbeat (JSON): its
    registrations arrive at least every ``beat`` s (never under REGISTER_EVERY_S); three
    missed ones mean it is dead."""
    return json.dumps(
        {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "concurrency": concurrency,
            "in_flight": in_flight,
            "kinds": kinds,
            "started": round(started, 3),
            "beat": round(max(REGISTER_EVERY_S, beat), 3),
        },
        separators=(",", ":"),
    )
