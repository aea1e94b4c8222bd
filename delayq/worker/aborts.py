"""Aborts heard for a claim that is not (yet) a run here.

``queue.abort`` of a running task publishes ``abort <token> <id>`` as it takes the lease.
The worker that claimed the task may hear it before the claim's reply has become a run: the
reply is on its way, or waits for the other shards' replies of the same pass. So an abort
that matches no run is remembered a while, by (lane, task id, token), and a claim's task
that matches one is never started (``Runs.start_many``). The memory is bounded in size and
in time: a claim's reply is a matter of milliseconds, seconds on a congested link, never of
the 60 s an entry is kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable

REMEMBER_S = 60.0  # an abort is forgotten this long after it was heard
MAX_REMEMBERED = 1000  # and the oldest first once this many are remembered


class RecentAborts:
    """(lane, task id, token) of the aborts heard lately for no run: none, almost always,
    so the claim path pays one truth test of :attr:`heard` per task."""

    def __init__(
        self,
        *,
        keep_s: float = REMEMBER_S,
        most: int = MAX_REMEMBERED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keep_s = keep_s
        self.most = most
        self.clock = clock
        # (lane, id, token) -> when it was heard, oldest first. Read, never changed, from
        # outside: an empty dict spares the claim path a call per task.
        self.heard: dict[tuple[object, str, int], float] = {}

    def __len__(self) -> int:
        return len(self.heard)

    def remember(self, lane: object, task_id: str, token: int) -> None:
        now = self.clock()
        self._forget_old(now)
        key = (lane, task_id, token)
        self.heard.pop(key, None)  # (heard again: kept from now)
        while len(self.heard) >= self.most:
            del self.heard[next(iter(self.heard))]
        self.heard[key] = now

    def take(self, lane: object, task_id: str, token: int) -> bool:
        """Whether this claim's abort was heard (and forget it: it is acted on once)."""
        heard = self.heard.pop((lane, task_id, token), None)
        return heard is not None and self.clock() - heard <= self.keep_s

    def _forget_old(self, now: float) -> None:
        heard = self.heard
        while heard:
            key = next(iter(heard))
            if now - heard[key] <= self.keep_s:
                return
            del heard[key]
