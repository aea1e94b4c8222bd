"""What the user sees of a task: the handler's ``Task`` and the inspection ``TaskInfo``."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Literal

from delayq.errors import TaskAborted
from delayq.timing import ms_to_datetime, stored_due_ms

if TYPE_CHECKING:
    from typing_extensions import TypeVar  # (for the default: mypy's, not a dependency)

    P = TypeVar("P", default=Any)  # Task is Task[Any]: a plain kind's payload
else:
    from typing import TypeVar

    P = TypeVar("P")

State = Literal["scheduled", "active", "done", "dead", "aborted", "cancelled"]
STATES: tuple[State, ...] = ("scheduled", "active", "done", "dead", "aborted", "cancelled")


class Task(Generic[P]):
    """Handed to a handler: one attempt at running a task.

    ``payload`` is what the producer scheduled: for a plain kind, its JSON value (a dict,
    ...); for a :class:`~delayq.TaskType`'s handler, a value of its payload type
    (``Task[CloseOrder]``).

    ``lease_lost`` is set when the worker learns that its lease is gone (expired, taken
    over or aborted): a long sync handler may check it to stop early, since its result will
    be refused.

    ``aborted`` becomes true when the task is aborted (``queue.abort``) while this attempt
    runs: an async handler is cancelled (``asyncio.CancelledError``), a sync one, which runs
    in a thread and cannot be stopped, sees ``aborted`` (and ``lease_lost``) set and may stop
    with ``raise_if_aborted()``; whatever it returns or raises is discarded.

    ``headers`` is what the producer attached (``schedule(..., headers=...)`` or a
    ``before_schedule`` hook): a dict of str to str, ``{}`` for none, the task's own (the
    same on every attempt, replay and reschedule).
    """

    __match_args__ = ("id", "kind", "payload", "attempt", "max_attempts", "due_at", "queue")
    # A class default: set on the instance only when the task is aborted (mark_aborted), so
    # making a Task costs nothing more.
    _aborted = False

    def __init__(
        self,
        id: str,
        kind: str,
        payload: P,
        attempt: int,
        max_attempts: int,
        due_at: datetime,
        queue: str,
        token: int,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.id = id
        self.kind = kind
        self.payload = payload
        self.attempt = attempt
        self.max_attempts = max_attempts
        self._due_at: datetime | None = due_at
        self._due_ms = 0.0
        self.queue = queue
        self.token = token
        self._headers = headers
        self._lease_lost: threading.Event | None = None

    @classmethod
    def claimed(
        cls,
        id: str,
        kind: str,
        payload: Any,
        attempt: int,
        max_attempts: int,
        due_ms: float,
        queue: str,
        token: int,
        headers: dict[str, str] | None = None,
    ) -> Task:
        """A worker's task: ``due_at`` is made from ``due_ms`` when first read, since most
        handlers never read it and a datetime costs about a microsecond per task."""
        task = cls.__new__(cls)
        task.id, task.kind, task.payload = id, kind, payload
        task.attempt, task.max_attempts = attempt, max_attempts
        task._due_at, task._due_ms = None, due_ms
        task.queue, task.token, task._lease_lost, task._headers = queue, token, None, headers
        return task

    @property
    def due_at(self) -> datetime:
        if self._due_at is None:
            self._due_at = ms_to_datetime(self._due_ms)
        return self._due_at

    @due_at.setter
    def due_at(self, value: datetime) -> None:
        self._due_at = value

    @property
    def headers(self) -> dict[str, str]:
        # Made on first read when there are none: most tasks have none, and most handlers
        # never read them.
        headers = self._headers
        if headers is None:
            headers = self._headers = {}
        return headers

    @headers.setter
    def headers(self, value: dict[str, str]) -> None:
        self._headers = value

    @property
    def lease_lost(self) -> threading.Event:
        # Made on first use: most tasks never need one, and an Event costs a lock.
        if self._lease_lost is None:
            self._lease_lost = threading.Event()
        return self._lease_lost

    @property
    def aborted(self) -> bool:
        """Whether the task was aborted (``queue.abort``) while this attempt ran."""
        return self._aborted

    def raise_if_aborted(self) -> None:
        """Raise :class:`~delayq.TaskAborted` if the task was aborted: a sync handler calls
        it between steps of a long job to stop as soon as it can."""
        if self._aborted:
            raise TaskAborted(f"task {self.id} was aborted")

    def _fields(self) -> tuple[Any, ...]:
        return (
            self.id,
            self.kind,
            self.payload,
            self.attempt,
            self.max_attempts,
            self.due_at,
            self.queue,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Task):
            return NotImplemented
        return (*self._fields(), self.token) == (*other._fields(), other.token)

    __hash__ = None  # type: ignore[assignment]  # mutable: compared by value, not hashed

    def __repr__(self) -> str:
        names = ("id", "kind", "payload", "attempt", "max_attempts", "due_at", "queue")
        inner = ", ".join(f"{n}={v!r}" for n, v in zip(names, self._fields(), strict=True))
        return f"Task({inner})"


def mark_aborted(task: Task) -> None:
    """The worker's side of ``Task.aborted``: the task was aborted while this attempt ran.
    ``aborted`` is set before ``lease_lost``, so a handler woken by the event sees it."""
    task._aborted = True
    task.lease_lost.set()


ScheduleStatus = Literal["created", "replaced", "unchanged", "running"]


class Scheduled(str):
    """What ``schedule`` returns: the task's id (a ``str``, usable wherever the id is), and
    what the call did to it in ``.status``:

    - ``"created"``: a new task (or an id whose dedupe window had passed);
    - ``"replaced"``: ``replace=True`` moved a waiting task (its attempts so far are kept)
      or re-created a finished or dead one;
    - ``"unchanged"``: the id was already waiting, running, finished within the dedupe
      window, or dead, and ``replace`` was not asked for;
    - ``"running"``: ``replace=True`` was asked for, but the task is running and a running
      task is never replaced: nothing changed.

    ``.due_at`` is when a task the call created or replaced is due, as the script stored it
    (the server's clock: ``Queue.get(id).due_at`` exactly), and None when the call left
    the task as it was.
    """

    # One subclass per status, whose instances are plain strings with one slot (no
    # __dict__): making one per task scheduled costs what copying the id does, not a Python
    # __init__ and a dict.
    __slots__ = ("_due_ms",)
    status: ScheduleStatus
    _due_ms: float

    def __new__(
        cls, task_id: str, status: ScheduleStatus | None = None, due_ms: float | None = None
    ) -> Scheduled:
        if cls is Scheduled:
            if status not in _BY_STATUS:
                raise ValueError(f"unknown schedule status {status!r}")
            cls = _BY_STATUS[status]
        made = str.__new__(cls, task_id)
        if due_ms is not None:
            made._due_ms = due_ms
        return made

    @staticmethod
    def from_replies(
        ids: Sequence[str], codes: Sequence[Any], dues: Sequence[str] = (), now: float = 0
    ) -> list[Scheduled]:
        """From schedule.lua's status code per task (0 unchanged, 1 created, 2 replaced,
        3 running); with ``dues`` (each task's due argument) and the ``now`` the script
        replied, each created or replaced task carries its stored due time."""
        new = str.__new__
        if not dues:
            return [new(_BY_CODE[int(c)], i) for i, c in zip(ids, codes, strict=True)]
        out = []
        for i, c, due in zip(ids, codes, dues, strict=True):
            made = new(_BY_CODE[c := int(c)], i)
            if c == 1 or c == 2:
                made._due_ms = stored_due_ms(due, now)
            out.append(made)
        return out

    @staticmethod
    def of_code(task_id: str, code: Any, due_ms: float | None = None) -> Scheduled:
        """From one status code (as :meth:`from_replies`), and its stored due time."""
        made = str.__new__(_BY_CODE[int(code)], task_id)
        if due_ms is not None:
            made._due_ms = due_ms
        return made

    @property
    def due_at(self) -> datetime | None:
        """When the task is due, as the script stored it, for a task this call created or
        replaced (the server's clock: what ``Queue.get(id).due_at`` reads); None when the
        call left the task as it was."""
        due = getattr(self, "_due_ms", None)
        return None if due is None else ms_to_datetime(due)

    @property
    def created(self) -> bool:
        return self.status == "created"

    @property
    def replaced(self) -> bool:
        return self.status == "replaced"

    def __repr__(self) -> str:
        return f"Scheduled({str(self)!r}, status={self.status!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Scheduled, (str(self), self.status, getattr(self, "_due_ms", None)))


def _status_class(status: ScheduleStatus) -> type[Scheduled]:
    return type(f"Scheduled_{status}", (Scheduled,), {"__slots__": (), "status": status})


_STATUSES: tuple[ScheduleStatus, ...] = ("unchanged", "created", "replaced", "running")
_BY_CODE: dict[int, type[Scheduled]] = {
    code: _status_class(status) for code, status in enumerate(_STATUSES)
}
_BY_STATUS: dict[Any, type[Scheduled]] = {c.status: c for c in _BY_CODE.values()}


@dataclass(frozen=True)
class TaskInfo:
    """A snapshot of one task, as ``Queue.get`` and ``Queue.dead`` return it.

    ``finished_at`` is when a done task finished, a dead one died, an aborted one was
    aborted or a cancelled one was cancelled. Of a task cancelled within the dedupe window
    only that is known: its ``kind`` is ``""``, its payload None.

    A done or aborted task keeps, by default, only a tombstone for the queue's dedupe window
    (``Queue(..., keep_finished="tombstone")``): its ``state``, ``finished_at``,
    ``attempts`` and ``kind``, its ``due_at`` (its last run's: for a done task as the
    worker reckons the server's clock, to a few milliseconds) and its ``result``. Its
    ``payload`` is then None, ``max_attempts`` 0, ``created_at`` None and ``headers``
    empty (``last_error`` stays: an earlier attempt's, if one failed). A queue made with
    ``keep_finished="record"`` keeps whole records instead."""

    id: str
    kind: str
    payload: Any
    state: State
    due_at: datetime | None
    attempts: int
    max_attempts: int
    last_error: str | None
    created_at: datetime | None
    lease_deadline: datetime | None = None
    finished_at: datetime | None = None
    queue: str = ""
    # What the producer attached (schedule(..., headers=)); {} for none.
    headers: dict[str, str] = field(default_factory=dict)
    # schedule(..., priority=): 1-9, the higher claimed first among due tasks; 0 for none.
    priority: int = 0
    # What a done task's handler returned (JSON-decoded); None when it returned None.
    result: Any = None


@dataclass(frozen=True)
class TaskPage:
    """A page of tasks in one state (``Queue.page``) and the cursor of the next page: pass
    ``next`` as ``after=`` to go on (None once a page comes back short: nothing follows)."""

    tasks: list[TaskInfo]
    next: str | None


@dataclass(frozen=True)
class QueueStats:
    """``Queue.stats()``: counts per state and how the schedule looks right now."""

    queue: str
    scheduled: int
    due: int
    active: int
    dead: int
    done: int
    oldest_due_age: float
    next_due_at: datetime | None
    next_lease_deadline: datetime | None
    counters: dict[str, int]
    now: datetime
    # How expiring keys are watched: "notifications" (timer, bell and scan) or "timer+scan"
    # (Redis refused CONFIG, so no bell); None when no worker watches expiring keys.
    expiry_mode: str | None = None
    # Aborted tasks still remembered (queue.abort; kept for the dedupe window).
    aborted: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "scheduled": self.scheduled,
            "due": self.due,
            "active": self.active,
            "dead": self.dead,
            "done": self.done,
            "oldest_due_age": self.oldest_due_age,
            "next_due_at": self.next_due_at.isoformat() if self.next_due_at else None,
            "next_lease_deadline": (
                self.next_lease_deadline.isoformat() if self.next_lease_deadline else None
            ),
            "counters": dict(self.counters),
            "now": self.now.isoformat(),
            "expiry_mode": self.expiry_mode,
            "aborted": self.aborted,
        }


@dataclass(frozen=True)
class WorkerInfo:
    """A worker as it registered itself; ``alive`` if seen within three of its beats."""

    id: str
    queue: str
    host: str
    pid: int
    concurrency: int
    in_flight: int
    kinds: list[str]
    started_at: datetime | None
    last_seen: datetime
    alive: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "queue": self.queue,
            "host": self.host,
            "pid": self.pid,
            "concurrency": self.concurrency,
            "in_flight": self.in_flight,
            "kinds": list(self.kinds),
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "last_seen": self.last_seen.isoformat(),
            "alive": self.alive,
        }
