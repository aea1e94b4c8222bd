"""What the user sees of a task: the handler's ``Task`` and the inspection ``TaskInfo``."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

State = Literal["scheduled", "active", "done", "dead"]


@dataclass
class Task:
    """Handed to a handler: one attempt at running a task.

    ``lease_lost`` is set when the worker learns that its lease is gone (expired or taken
    over): a long sync handler may check it to stop early, since its result will be refused.
    """

    id: str
    kind: str
    payload: Any
    attempt: int
    max_attempts: int
    due_at: datetime
    queue: str
    token: int = field(repr=False)
    _lease_lost: threading.Event | None = field(default=None, repr=False, compare=False)

    @property
    def lease_lost(self) -> threading.Event:
        # Made on first use: most tasks never need one, and an Event costs a lock.
        if self._lease_lost is None:
            self._lease_lost = threading.Event()
        return self._lease_lost


@dataclass(frozen=True)
class TaskInfo:
    """A snapshot of one task, as ``Queue.get`` and ``Queue.dead`` return it."""

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
