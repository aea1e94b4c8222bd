"""The claim loop: which sources to claim from, how much, and when to look again.

A *source* is one shard of one of the worker's queues (a queue unsplit: one source); each
has a :class:`Source` with what the loop knows of it. The loop claims tasks due within the
lookahead and hands them to :class:`~delayq.worker.runs.Runs`, which starts each at its due
time. How much: :meth:`Runs.room`. From where: the sources visited are those prompted (a
poke, a wake-up on their channel), known due soon, or not looked at for ``max_wait``; the
first visited rotates and each visited source gets its share of the free room, so a
backlogged queue cannot starve a quiet one, and their tasks start interleaved. When: the
earliest time a source next needs a look (its first due task or lease deadline, a rate
limit's next token), less the lead (see :data:`CLAIM_STEP_S`), or a wake-up, or
``max_wait`` at most. A source whose claim failed rests for a backoff, so one unreachable
shard does not hold up the others.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from delayq import controls, leasing
from delayq.core import QueueCore
from delayq.errors import DelayqError
from delayq.leasing import Claimed
from delayq.runner import AsyncRunner
from delayq.worker import unreadable
from delayq.worker.clock import ServerClock
from delayq.worker.health import Health
from delayq.worker.lane import Lane
from delayq.worker.runs import Runs
from delayq.worker.waker import Waker

log = logging.getLogger("delayq.worker")

# A claim held back by the rate limit looks again when its next token is there, but no
# sooner than this: a throttled worker takes a few tokens a claim, not one (at 100/s, 20
# claims a second of 5 tasks, rather than 100 of one).
THROTTLE_STEP_S = 0.05
# While tasks keep falling due at a source, the next claim is sent this long after the
# lookahead reached the first task the last one left (at most half the lookahead later). A
# claim costs the worker a fixed share of CPU however few tasks it brings: sent as soon as
# the last one had been answered, claims brought a handful of tasks each, and with the
# result writes spent most of a core (docs/benchmarks.md, "Figures behind the worker's
# constants"). Not longer: a claim's tasks are set up in one go (a few microseconds each),
# which holds up timers due meanwhile.
CLAIM_STEP_S = 0.002
# A look is unprompted when nothing is known due at a source sooner than this past the
# lookahead; tasks it claims were then announced to nobody (Claimer._announced_to_nobody).
UNPROMPTED_S = 0.1
FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0


def interleave(batches: list[list[Claimed]]) -> list[Claimed]:
    """One from each batch in turn: [a1, b1, a2, b2, a3]."""
    return [c for row in itertools.zip_longest(*batches) for c in row if c is not None]


def interleave_lanes(
    batches: list[tuple[Lane, list[Claimed]]],
) -> tuple[list[Claimed], list[Lane]]:
    """:func:`interleave` of batches from several lanes, and each task's lane."""
    rows = itertools.zip_longest(*([(lane, c) for c in got] for lane, got in batches))
    pairs = [p for row in rows for p in row if p is not None]
    return [c for _, c in pairs], [lane for lane, _ in pairs]


class Source:
    """One shard of one of the worker's queues, and what the claim loop knows of it."""

    __slots__ = (
        "backoff",
        "core",
        "index",
        "lane",
        "lead",
        "next_at",
        "resting_until",
        "seen_at",
        "shard",
        "throttled_until",
    )

    def __init__(self, lane: Lane, shard: int, core: QueueCore, index: int, lead: float) -> None:
        self.lane = lane
        self.shard = shard
        self.core = core
        self.index = index  # its place among the sources: its wake channel's (Waker)
        # The loop time its earliest due task or lease deadline falls due (inf: nothing
        # known), and when it was last looked at.
        self.next_at = 0.0
        self.seen_at = 0.0
        # Left alone until then after a failed claim; the backoff doubles while they fail.
        self.resting_until = 0.0
        self.backoff = FIRST_BACKOFF_S
        # How long before its next due time the next claim is sent: the lookahead, or while
        # tasks keep coming (its last claim took some) CLAIM_STEP_S less.
        self.lead = lead
        # Until when (loop time) the rate limit holds its claims back; None: it does not.
        # Neither a poke (a handler finished) nor a wake-up ends it: a claim could take no
        # more (and a claim's own wake-up would wake this worker again).
        self.throttled_until: float | None = None

    def __repr__(self) -> str:
        return f"Source({self.lane.name!r}, shard {self.shard})"


def sources_of(lanes: Sequence[Lane], lead: float = 0.0) -> list[Source]:
    """What the claim loop claims from, in order: each lane's shards, lane by lane."""
    shards = [
        (lane, shard, core) for lane in lanes for shard, core in enumerate(lane.queue.shards.cores)
    ]
    return [Source(lane, shard, core, i, lead) for i, (lane, shard, core) in enumerate(shards)]


class SourceOrder:
    """In which order the claim loop visits its sources, and how it splits the free room
    between those it visits (``Worker(weights=, strict=)``, docs/priorities.md).

    - By default: the first visited rotates, and each gets an equal share.
    - Weighted: the room is dealt one slot at a time by smooth weighted round robin (nginx's:
      each visited source's credit grows by its weight, the one with the most takes the slot
      and pays the total), so over time each source gets slots in proportion to its weight,
      and a source with tasks due is never starved: its credit grows until it wins. A
      queue's weight is split between its shards. A source that leaves its share unused (it
      had fewer due) is not visited again until it has more, so the others take the room.
    - Strict: the lanes in order (the heaviest first, then as given), each taking all the
      room it can before the next is claimed from; a lane's shards rotate among themselves.
    """

    def __init__(self, sources: Sequence[Source], *, weighted: bool, strict: bool) -> None:
        self.sources = list(sources)
        self.strict = strict
        self.weighted = weighted and not strict
        shards: dict[int, int] = {}
        for s in sources:
            shards[s.lane.index] = shards.get(s.lane.index, 0) + 1
        self.weight = [s.lane.weight / shards[s.lane.index] for s in sources]
        self.credit = [0.0] * len(sources)
        lanes = sorted({s.lane.index: s.lane for s in sources}.values(), key=_strict_rank)
        self.groups = [[s for s in sources if s.lane is lane] for lane in lanes]

    def next(self, turn: int) -> list[Source]:
        """The sources in the order of this pass (``turn``: the pass's number)."""
        if self.strict:
            return [g[(turn + k) % len(g)] for g in self.groups for k in range(len(g))]
        n = len(self.sources)
        return [self.sources[(turn + k) % n] for k in range(n)]

    def shares(self, visit: Sequence[Source], free: int) -> list[int]:
        """How many tasks each source visited may claim, of ``free``."""
        if not visit:
            return []
        if self.strict:
            return [free] * len(visit)  # each takes what the ones before it left
        if not self.weighted or len(visit) == 1:
            return [-(-free // len(visit))] * len(visit)
        credit, weight = self.credit, self.weight
        index = [s.index for s in visit]
        total = sum(weight[i] for i in index)
        got = dict.fromkeys(index, 0)
        for _ in range(free):
            for i in index:
                credit[i] += weight[i]
            best = max(index, key=credit.__getitem__)
            credit[best] -= total
            got[best] += 1
        return [got[i] for i in index]


def _strict_rank(lane: Lane) -> tuple[int, int]:
    return (-lane.weight, lane.index)


class Claimer:
    """The claim loop of one serving worker (:meth:`run`)."""

    def __init__(
        self,
        lanes: Sequence[Lane],
        runs: Runs,
        waker: Waker,
        runner: AsyncRunner,
        clock: ServerClock,
        now: Callable[[], float],
        *,
        worker_id: str,
        registration: Callable[[Lane], Callable[[], str]],
        lease_ms: int,
        lookahead_s: float,
        max_wait_s: float,
        health: Health | None = None,
        weighted: bool = False,
        strict: bool = False,
    ) -> None:
        self.lanes = lanes
        self.sources = sources_of(lanes, lookahead_s)
        self.runs = runs
        self.waker = waker
        self.runner = runner
        self.clock = clock
        self.now = now  # the loop's clock, read afresh (clock.loop_clock)
        self.worker_id = worker_id
        self.registration = registration  # a lane's registration text, made when sent
        self.lease_ms = lease_ms
        self.lookahead_s = lookahead_s
        self.max_wait_s = max_wait_s
        self.health = health or Health(max_wait_s)  # told of each pass (/livez, /readyz)
        self.order = SourceOrder(self.sources, weighted=weighted, strict=strict)

    def to_loop(self, server_ms: float) -> float:
        return self.clock.to_loop(server_ms, asyncio.get_running_loop().time())

    async def run(self, stopping: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        sources, runs, waker = self.sources, self.runs, self.waker
        one = len(sources) == 1  # looked at every time
        streaming_lead = self.lookahead_s - min(CLAIM_STEP_S, self.lookahead_s / 2)
        # Which source goes first: rotates, so no shard's or queue's backlog starves another.
        turn = 0
        was_full = False  # the announcements heard while full were set aside unread
        health = self.health
        while not stopping.is_set():
            free = runs.room()
            if free <= 0:
                health.full()
                # Full: announcements do not matter until a handler finishes and pokes. Any
                # poke so far is answered: we looked, and we are full (and not stopping).
                waker.reset()
                was_full = True
                runs.room_wanted = True
                await waker.sleep_until(loop.time() + self.max_wait_s)
                continue
            poked, woken = waker.reset()
            throttled = any(s.throttled_until is not None for s in sources)
            unprompted = not (poked or was_full or throttled)
            was_full = False
            if poked and one:
                sources[0].resting_until = 0.0  # e.g. the wake-up link is back: the server too?
            now = loop.time()
            soon = now + self.lookahead_s
            order = self.order.next(turn)
            turn += 1
            visit = [
                s
                for s in order
                if s.resting_until <= now
                and (not throttled or self._admitted(s, now))
                and (
                    one
                    or poked
                    or s.index in woken
                    or s.next_at <= soon
                    or now - s.seen_at >= self.max_wait_s
                )
            ]
            full = False
            # Each source visited gets its share, and their tasks start interleaved: a batch
            # claimed ahead from one source must not run before every other source's tasks.
            shares = self.order.shares(visit, free)
            batches: list[tuple[Lane, list[Claimed]]] = []
            for s, share in zip(visit, shares, strict=True):
                if share <= 0:  # (weighted: none dealt this pass; looked at in a later one)
                    continue
                s.seen_at = loop.time()
                limit = min(share, free)
                # A look that nothing prompted (see _announced_to_nobody).
                lone = unprompted and s.index not in woken and s.next_at > soon + UNPROMPTED_S
                try:
                    s.next_at, got, again = await self._claim_from(s, limit, batches)
                except DelayqError as e:
                    health.failed(e)
                    where = self._where(s)
                    log.warning("claim failed%s (%s); retrying in %.1f s", where, e, s.backoff)
                    s.resting_until = loop.time() + s.backoff
                    s.next_at = s.resting_until + self.lookahead_s
                    s.lead = self.lookahead_s
                    s.backoff = min(s.backoff * 2, MAX_BACKOFF_S)
                    continue
                health.looked()
                s.backoff = FIRST_BACKOFF_S
                s.lead = streaming_lead if got else self.lookahead_s
                if lone and got and not s.lane.caps:
                    self._announced_to_nobody(s, got)
                batches.append((s.lane, got))
                free -= len(got)
                # A full batch: more may be due right now. So may a kind's room that went to a
                # row just buried as unreadable: no run of it will free the room and wake us.
                full = full or len(got) >= limit or again
                if free <= 0:
                    break
            self._start(batches)
            if full:
                continue
            # Every task due within the lookahead was taken: a freed slot changes nothing
            # until more fall due, so handlers that finish need not wake this loop (a claim
            # sent as each one finished came back with the one or two tasks due since).
            # Per-kind caps leave tasks of a full kind due: a freed slot of it wakes the loop.
            runs.room_wanted = runs.capped
            deadline = min([loop.time() + self.max_wait_s, *(s.next_at - s.lead for s in sources)])
            await waker.sleep_until(deadline, self.to_loop, self.lookahead_s)

    def _start(self, batches: list[tuple[Lane, list[Claimed]]]) -> None:
        """Hand a pass's claims to Runs, the sources' tasks interleaved."""
        now_ms = self.clock.server_now_ms
        if len(batches) == 1:
            self.runs.start_many(batches[0][0], batches[0][1], now_ms)
        elif batches:
            first = batches[0][0]
            if self.order.strict:  # the first queue's first: in the order claimed
                self.runs.start_many(
                    [lane for lane, got in batches for _ in got],
                    [c for _, got in batches for c in got],
                    now_ms,
                )
            elif all(lane is first for lane, _ in batches):  # a sharded queue's
                self.runs.start_many(first, interleave([got for _, got in batches]), now_ms)
            else:
                tasks, lanes = interleave_lanes(batches)
                self.runs.start_many(lanes, tasks, now_ms)

    def _announced_to_nobody(self, source: Source, got: list[Claimed]) -> None:
        """A look nothing prompted (no poke, no message on the source's channel, nothing known
        due within UNPROMPTED_S, no rate limit holding it back) claimed tasks: they fell due
        unannounced, so the wake-up subscription may be dead without knowing it. Renew it
        (Waker.renew). Per-kind caps are left out: a claim cut short by them leaves tasks
        unseen that a later look finds without anyone having announced them."""
        log.info(
            "claimed %d task(s)%s that no wake-up announced (first: %r); renewing the "
            "wake-up subscription",
            len(got),
            self._where(source),
            got[0].id,
        )
        self.waker.renew()

    def _where(self, source: Source) -> str:
        """Which source a log line is about ("" for the only one)."""
        shard = f" shard {source.shard}" if source.lane.queue.shards.n > 1 else ""
        if len(self.lanes) > 1:
            return f" on queue {source.lane.name!r}{shard}"
        return f" on{shard}" if shard else ""

    async def _claim_from(
        self,
        source: Source,
        free: int,
        pending: list[tuple[Lane, list[Claimed]]] | None = None,
    ) -> tuple[float, list[Claimed], bool]:
        """Claim up to ``free`` tasks from ``source``; returns (loop time the source next
        needs a look, the tasks claimed, whether to look again at once: rows were buried
        that took rooms of capped kinds). Registration rides on each queue's home shard.
        ``pending``: tasks claimed from other sources in this pass, not yet started (they
        use kinds' rooms)."""
        lane = source.lane
        worker, info = (
            lane.registration.due(self.worker_id, self.registration(lane))
            if source.shard == 0
            else ("", "")
        )
        sent = self.now()
        try:
            result = await self.runner.run(
                leasing.claim(
                    source.core,
                    limit=free,
                    lease_ms=self.lease_ms,
                    lookahead_ms=round(self.lookahead_s * 1000),
                    worker=worker,
                    worker_info=info,
                    rooms=self._kind_rooms(lane, pending) if lane.caps else (),
                )
            )
        except DelayqError:
            if info:  # not stored: send it again
                lane.registration.unsent()
            raise
        self.clock.observe(result.now_us / 1000, sent, self.now())
        again = False
        if result.unreadable:  # rows another program wrote, not UTF-8: buried (unreadable.py)
            await unreadable.bury(self.runner, source.core, lane.executor, result.unreadable)
            again = bool(lane.caps)
        next_at = math.inf
        if result.next_due_ms is not None:
            next_at = self.to_loop(result.next_due_ms)
        if result.next_token_ms is not None:
            next_at = self._throttled(source, result.next_token_ms, next_at)
        else:
            source.throttled_until = None
        if result.next_lease_ms is not None:
            next_at = min(next_at, self.to_loop(result.next_lease_ms) + 0.001 + self.lookahead_s)
        return next_at, result.tasks, again

    def _kind_rooms(
        self, lane: Lane, pending: list[tuple[Lane, list[Claimed]]] | None
    ) -> list[Any]:
        """Claim's per-kind rooms on the queue of ``lane``: each capped kind's cap less the
        runs of it held and those claimed in this pass (``pending``) on that queue."""
        held = lane.held_of_kind()
        for from_lane, batch in pending or ():
            if from_lane is not lane:
                continue
            for c in batch:
                if c.header.kind in held:
                    held[c.header.kind] += 1
        return controls.kind_rooms(lane.caps, held)

    def _throttled(self, source: Source, token_ms: int, next_at: float) -> float:
        """Due tasks wait for the rate limit's next token (server ms): the loop time to look
        again (the claim loop wakes ``lookahead`` before a shard's time, hence the add), at
        most max_wait away (a wake-up lost: the limit may have changed)."""
        now = asyncio.get_running_loop().time()
        at = min(max(self.to_loop(token_ms), now + THROTTLE_STEP_S), now + self.max_wait_s)
        source.throttled_until = at
        at += self.lookahead_s
        return at if math.isinf(next_at) else max(next_at, at)

    @staticmethod
    def _admitted(source: Source, now: float) -> bool:
        """Whether the rate limit lets the claim loop visit ``source`` now: the time of its
        next token has come (a changed limit is seen then, within max_wait)."""
        until = source.throttled_until
        if until is None or until <= now:
            source.throttled_until = None
            return True
        return False
