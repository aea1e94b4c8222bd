"""What happens to each attempt, for listeners such as metrics exporters and logs.

Listeners run on the worker's event loop and must be quick; one that raises is logged and
ignored. Events never carry the payload.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger("delayq.worker")

EventName = Literal[
    "started",  # the handler is about to run; lateness is set
    "succeeded",
    "discarded",  # Discard: done, not retried
    "retried",  # will run again (Retry, or an error with attempts left)
    "failed",  # the handler raised (besides Retry/Discard); also sent with retried or dead
    "dead",  # went to the dead set (Fail, attempts spent, no handler, undecodable)
    "lease_lost",  # the worker lost the lease while the handler ran
    "aborted",  # the task was aborted (queue.abort) while the handler ran: not a failure
    # No handler for its kind on this worker: handed back, its attempt not counted (or, its
    # unknown_kind_grace over, buried: then "dead" follows).
    "unknown_kind",
    # A sync handler's thread runs on past its attempt (its timeout, a lost lease, an abort):
    # it holds its slot and its kind's place until it returns ("overrun_ended", duration:
    # how long it ran on).
    "overrunning",
    "overrun_ended",
]


@dataclass(frozen=True)
class TaskEvent:
    event: EventName
    queue: str
    kind: str
    task_id: str
    attempt: int
    lateness: float | None = None  # seconds from due time to handler start ("started")
    duration: float | None = None  # seconds the handler ran (outcome events)
    error: str | None = None  # first line of the error ("failed", "dead")


Listener = Callable[[TaskEvent], None]


class Events:
    def __init__(self) -> None:
        self.listeners: list[Listener] = []

    def emit(self, event: TaskEvent) -> None:
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:
                log.exception("event listener %r failed on %s", listener, event.event)
