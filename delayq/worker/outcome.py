"""What became of one attempt, and the batching of those results into script calls."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Literal, NamedTuple

from delayq import leasing
from delayq.core import Op, QueueCore
from delayq.errors import ConnectionFailed, DelayqError
from delayq.runner import AsyncRunner
from delayq.shards import Shards
from delayq.worker.unknown import UnknownKinds

log = logging.getLogger("delayq.worker")

# A write the server refuses this many times in a row is taken apart (see Finisher).
REFUSALS_BEFORE_ALONE = 3
# A write starts at least this long after the one before it began. A write costs the worker
# about the same CPU however few results it carries: written again as soon as the last one
# was answered, writes carried a few results each and took a large share of the worker's
# core at burst rates (docs/benchmarks.md, "Figures behind the worker's constants").
# So at most 500 writes a second, and a result waits at most this much longer (an idle
# worker's is written at once).
WRITE_EVERY_S = 0.002

Action = Literal["ack", "discard", "retry", "bury", "release", "handback"]


class Outcome(NamedTuple):
    """(A tuple: a worker makes one per attempt, and a tuple is the cheapest record.)"""

    action: Action
    id: str
    token: int
    due: str = ""  # retry: due spec; release: new due spec ("" keeps the due time)
    text: str = ""  # retry: error; bury, handback: reason
    shard: int = 0  # of its queue: the one it was claimed from (Claimed.shard)
    late: float = -1.0  # seconds from its due time to its handler's start; -1: never started
    kind: str = ""  # ack, discard: the task's kind, for its tombstone
    result: str = ""  # ack: what the handler returned, as JSON text ("" for None)
    # ack, discard: the tombstone's "<attempt> <ms from due to finish> " (leasing.ack)
    tomb: str = ""


def outcome_op(
    core: QueueCore, action: Action, items: list[Outcome], unknown: UnknownKinds | None = None
) -> Op[list[str]]:
    """The write of ``items``, all of ``action``; a hand-back's by ``unknown``'s policy. An
    ack's, retry's or burial's lateness goes to the dashboard's history (delayq/history.py)."""
    if action in ("ack", "discard"):
        leases = [(o.id, o.token) for o in items]
        late = [o.late for o in items]
        finished = [(o.tomb, o.kind, o.result) for o in items]
        return leasing.ack(
            core, leases, discarded=action == "discard", lateness=late, finished=finished
        )
    if action == "retry":
        rows = [(o.id, o.token, o.due, o.text) for o in items]
        return leasing.retry(core, rows, lateness=[o.late for o in items])
    if action == "bury":
        buried = [(o.id, o.token, o.text) for o in items]
        return leasing.bury(core, buried, lateness=[o.late for o in items])
    if action == "handback":
        return (unknown or UnknownKinds()).op(core, [(o.id, o.token, o.text) for o in items])
    return leasing.release(core, [(o.id, o.token) for o in items], dues=[o.due for o in items])


class Finisher:
    """Writes outcomes in batches: one round trip carries every result that finished since
    the previous one began, and starts at least WRITE_EVERY_S after it, so a busy worker
    acks hundreds of tasks per call while an idle one acks each at once. A write that fails
    for want of Redis, or that the server refuses for now (out of memory, a demoted
    primary), is kept and tried again, never dropped. One result that cannot be written
    (the client cannot send it, or the server refuses it while it accepts others: a bug)
    must not hold up the rest: a batch the client cannot send, or the server keeps
    refusing, is written a result at a time, and only a result that fails alone is given
    up (``on_dropped``). Its lease is not extended (see Runs), so its task runs again once
    the lease ends.
    """

    def __init__(
        self,
        shards: Shards,
        runner: AsyncRunner,
        on_written: Callable[[list[Outcome], set[str]], None],
        on_dropped: Callable[[list[Outcome]], None] = lambda outcomes: None,
        unknown: UnknownKinds | None = None,
    ) -> None:
        self.shards = shards
        self.unknown = unknown  # how hand-backs of unknown kinds are written
        self.runner = runner
        self.on_written = on_written
        self.on_dropped = on_dropped
        self._pending: list[Outcome] = []
        self._writing = 0  # results in the write in flight
        self._event = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def add(self, outcome: Outcome) -> None:
        self._pending.append(outcome)
        self._idle.clear()
        self._event.set()

    @property
    def pending(self) -> int:
        """Results not yet written (waiting, or in the write in flight)."""
        return len(self._pending) + self._writing

    async def drained(self) -> None:
        """Wait until every outcome added so far is written."""
        while self._pending or not self._idle.is_set():
            await self._idle.wait()

    def _ops(self, batch: list[Outcome]) -> list[Op[list[str]]]:
        ops: list[Op[list[str]]] = []
        for core, in_shard in self._by_shard(batch):
            by: dict[Action, list[Outcome]] = {}
            if all(o.action == "ack" for o in in_shard):
                by["ack"] = in_shard  # the usual batch: every handler returned
            else:
                for o in in_shard:
                    by.setdefault(o.action, []).append(o)
            for action, items in by.items():
                for i in range(0, len(items), 1000):
                    ops.append(outcome_op(core, action, items[i : i + 1000], self.unknown))
        return ops

    def _by_shard(self, batch: list[Outcome]) -> list[tuple[QueueCore, list[Outcome]]]:
        """The outcomes by the shard each task was claimed from (not the shard its id
        hashes to: another program may have written it on another), in shard order."""
        cores = self.shards.cores
        if len(cores) == 1:
            return [(cores[0], batch)]
        by: dict[int, list[Outcome]] = {}
        for o in batch:
            by.setdefault(o.shard, []).append(o)
        return [(cores[i], by[i]) for i in sorted(by)]

    async def run(self) -> None:
        delay = 0.1
        refusals = 0  # writes in a row the server refused (not for want of a connection)
        loop = asyncio.get_running_loop()
        began = -math.inf  # loop time the last write began
        while True:
            await self._event.wait()
            # Results that finish meanwhile join this write (see WRITE_EVERY_S).
            wait = began + WRITE_EVERY_S - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self._event.clear()
            batch, self._pending = self._pending, []
            if not batch:
                self._idle.set()
                continue
            self._writing = len(batch)
            began = loop.time()
            try:
                replies = await self.runner.run_many(self._ops(batch))
            except Exception as e:
                self._writing = 0
                self._pending = batch + self._pending
                if not isinstance(e, DelayqError):  # the client could not send it: a bug
                    log.error("could not send %d task results", len(batch), exc_info=e)
                    alone = True
                else:
                    # Refused by the server: out of memory, a demoted primary, a busy script
                    # all pass, so wait as for a connection; refused again and again, the
                    # batch is tried a result at a time, in case one result is what is wrong.
                    refusals = refusals + 1 if not isinstance(e, ConnectionFailed) else 0
                    alone = refusals >= REFUSALS_BEFORE_ALONE
                if alone:
                    refusals = 0
                    if await self._one_by_one(len(batch)):
                        continue
                log.warning("could not write %d task results, retrying: %s", len(batch), e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                self._event.set()
                continue
            delay, refusals, self._writing = 0.1, 0, 0
            refused = {tid for reply in replies for tid in reply}
            self.on_written(batch, refused)
            if not self._pending:
                self._idle.set()

    async def _one_by_one(self, n: int) -> bool:
        """Write the first ``n`` pending results one at a time, and give up a result only
        when it alone cannot be written: the client cannot send it, or the server refuses it
        while it accepts others. Returns False, with every result still pending, when the
        server refused them all (it refuses everything for now) or the connection failed."""
        batch, self._pending = self._pending[:n], self._pending[n:]
        self._writing = n
        kept: list[Outcome] = []  # not tried, or refused: pending again unless given up
        refused: list[Outcome] = []
        wrote = 0
        for i, outcome in enumerate(batch):
            try:
                replies = await self.runner.run_many(self._ops([outcome]))
            except ConnectionFailed:
                kept += batch[i:]  # Redis went away: the rest wait for it with run()'s backoff
                break
            except DelayqError:
                refused.append(outcome)
                continue
            except Exception:
                log.exception(
                    "cannot send result %r of task %s; giving it up: the task runs again "
                    "once its lease ends",
                    outcome.action,
                    outcome.id,
                )
                self.on_dropped([outcome])
                continue
            wrote += 1
            self.on_written([outcome], {tid for reply in replies for tid in reply})
        if refused and wrote:
            log.error(
                "the server refused %d task result(s) while it accepted %d others; giving "
                "them up: their tasks run again once their leases end (%s)",
                len(refused),
                wrote,
                ", ".join(f"{o.action} {o.id}" for o in refused[:10]),
            )
            self.on_dropped(refused)
        else:
            kept = refused + kept
        self._pending = kept + self._pending
        self._writing = 0
        if kept:
            return False
        self._event.set()
        return True

    def flush_now(self) -> None:
        self._event.set()
