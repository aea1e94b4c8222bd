"""Lease heartbeat: while a handler runs, its lease is extended every lease/3 seconds."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from delayq import leasing
from delayq.core import QueueCore
from delayq.errors import DelayqError
from delayq.leasing import Claimed
from delayq.runner import AsyncRunner
from delayq.shards import Shards
from delayq.worker.health import Health

log = logging.getLogger("delayq.worker")


class Heartbeat:
    def __init__(
        self,
        shards: Shards,
        runner: AsyncRunner,
        leases: dict[str, Claimed],
        lease_ms: int,
        interval: float,
        on_lost: Callable[[list[tuple[str, int]]], None],
        worker_id: str = "",
        registration: Callable[[], str] = lambda: "",
        beat_while: Callable[[], bool] | None = None,
    ) -> None:
        self.shards = shards
        self.runner = runner
        # The lane's live map: id -> the claim whose lease is extended (its token, and the
        # shard it was claimed from, where the extension goes).
        self.leases = leases
        self.lease_ms = lease_ms
        self.interval = interval
        self.on_lost = on_lost
        self.worker_id = worker_id
        self.registration = registration
        # Told of each lease (id, token) lost to an abort (queue.abort) before on_lost hears
        # of it, so the run stops as aborted even when the waker missed the message.
        self.on_aborted: Callable[[str, int], object] | None = None
        # A queue of a worker of several: beat (register) while the worker holds any lease,
        # even none of this queue's, since a full worker sends no claim to register with.
        self.beat_while = beat_while
        self.health: Health | None = None  # told whether Redis answered (/readyz)

    async def tick(self) -> list[tuple[str, int]]:
        """Extend every held lease once; returns (and reports) the (id, token) found lost."""
        held = list(self.leases.values())
        sent = {c.id: c.token for c in held}
        lost: list[tuple[str, int]] = []
        aborted: set[str] = set()
        groups = self._by_shard(held)
        if (self.shards.n > 1 or not held) and all(
            core is not self.shards.home for core, _ in groups
        ):
            # The registration rides on the home shard: beat there even with no lease there,
            # or a busy worker would read as dead.
            groups.insert(0, (self.shards.home, []))
        failed: DelayqError | None = None
        for core, claims in groups:
            home = core is self.shards.home
            leases = [(c.id, c.token) for c in claims]
            try:
                for i in range(0, max(len(leases), 1), 1000):
                    op = leasing.extend(
                        core,
                        leases[i : i + 1000],
                        lease_ms=self.lease_ms,
                        worker=self.worker_id if home else "",
                        worker_info=self.registration() if home else "",
                    )
                    reply = await self.runner.run(op)
                    lost.extend((tid, sent[tid]) for tid in reply)
                    aborted |= reply.aborted
            except DelayqError as e:
                failed = e  # one shard unreachable: the others' leases are still extended
        # A lease written off meanwhile (its result just acked) is not lost, just gone; one
        # re-claimed meanwhile has a new token and is not this one.
        lost = [(tid, token) for tid, token in lost if self._holds(tid, token)]
        if aborted and self.on_aborted is not None:
            for tid, token in lost:
                if tid in aborted:
                    self.on_aborted(tid, token)
        if lost:
            self.on_lost(lost)
        if failed is not None:
            raise failed  # logged by run(); what the other shards answered is acted on
        return lost

    def _holds(self, task_id: str, token: int) -> bool:
        claimed = self.leases.get(task_id)
        return claimed is not None and claimed.token == token

    def _by_shard(self, held: list[Claimed]) -> list[tuple[QueueCore, list[Claimed]]]:
        """The leases by the shard each was claimed from (not the shard its id hashes to:
        another program may have written the task on another), in shard order."""
        cores = self.shards.cores
        if len(cores) == 1:
            return [(cores[0], held)] if held else []
        by: dict[int, list[Claimed]] = {}
        for c in held:
            by.setdefault(c.shard, []).append(c)
        return [(cores[i], by[i]) for i in sorted(by)]

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if not self.leases and not (self.beat_while and self.beat_while()):
                continue  # an idle worker sends nothing
            try:
                await self.tick()
            except DelayqError as e:
                log.warning("lease heartbeat failed (%s); retrying", e)
                if self.health is not None:
                    self.health.failed(e)
                continue
            if self.health is not None:
                self.health.answered()
