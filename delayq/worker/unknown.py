"""Tasks of a kind the worker has no handler for: handed back, not buried at once.

In a rolling deploy a new producer may schedule a new kind before every worker has its
handler. A worker that meets such a task hands it back (``lua/handback.lua``) without
counting an attempt, to wait a while and be claimed again, perhaps by a worker that has the
handler by then. Only once ``unknown_kind_grace`` (default 1 h) has passed since the task
fell due is it buried, with the reason.

Since when, and who remembers it: the server. The first hand-back keeps the due time of the
claim that met the kind in the task's last error (``unknown kind since <ms>: ...``), so
every worker of the queue, one restarted or one started later, counts from the same
instant, on the server's clock; a worker's own memory would start the grace again with
each process. The due time rather than the time the task was scheduled: a task scheduled a
day ahead gets its grace when it falls due, not a day before.

Each hand-back waits as long as has passed since then, from :data:`FIRST_WAIT_S` up to
:data:`MOST_WAIT_S` (both shorter for a short grace): a backoff that doubles, so a task no
worker can run costs a few claims an hour. Meanwhile: the ``unknown_kind`` event (the
``delayq_tasks_unknown_kind_total`` metric), the ``unknown_kind`` counter of the queue's
stats (``delayq info``, the dashboard), and a WARNING once per kind per minute.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

from delayq import leasing
from delayq.core import Op, QueueCore
from delayq.leasing import Claimed

log = logging.getLogger("delayq.worker")

DEFAULT_GRACE_S = 3600.0
FIRST_WAIT_S = 10.0
MOST_WAIT_S = 300.0
LOG_EVERY_S = 60.0  # one WARNING per kind this often, at most


class UnknownKinds:
    """One lane's policy for tasks of kinds it has no handler for.

    Args:
        grace_s: ``unknown_kind_grace``.
        on_buried: told of each task buried after its grace (its claim and the reason), to
            log it and tell the listeners and ``on_dead`` hooks as any burial.
    """

    def __init__(
        self,
        grace_s: float = DEFAULT_GRACE_S,
        on_buried: Callable[[Claimed, str], None] = lambda claimed, reason: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.grace_ms = round(grace_s * 1000)
        self.first_ms = round(min(FIRST_WAIT_S, grace_s / 8) * 1000)
        self.most_ms = round(min(MOST_WAIT_S, grace_s / 4) * 1000)
        self.on_buried = on_buried
        self.clock = clock  # paces the WARNING
        self.claims: dict[str, Claimed] = {}  # handed to a write, until it is answered
        self.buried: set[str] = set()  # the ids the last write buried
        self._warned: dict[str, float] = {}  # kind -> monotonic time of its last WARNING

    def reason(self, kind: str, registered: Sequence[str]) -> str:
        return (
            f"no handler for kind {kind!r} on this worker "
            f"(registered: {', '.join(registered) or 'none'})"
        )

    def met(self, claimed: Claimed, queue: str, registered: Sequence[str]) -> str:
        """A claim of a kind with no handler here: the reason, and a WARNING if none was
        logged for the kind within LOG_EVERY_S."""
        kind = claimed.header.kind
        self.claims[claimed.id] = claimed
        now = self.clock()
        if now - self._warned.get(kind, -math.inf) >= LOG_EVERY_S:
            self._warned[kind] = now
            log.warning(
                "tasks of kind %r have no handler on this worker (registered: %s): handed "
                "back without counting an attempt, until unknown_kind_grace (%g s) has "
                "passed since they fell due (first: %s on queue %r)",
                kind,
                ", ".join(registered) or "none",
                self.grace_ms / 1000,
                claimed.id,
                queue,
                extra={"kind": kind, "queue": queue, "task_id": claimed.id},
            )
        return self.reason(kind, registered)

    def op(self, core: QueueCore, items: Sequence[tuple[str, int, str]]) -> Op[list[str]]:
        """The write of hand-backs (id, token, reason): parses to the ids refused (their
        lease was lost), as the other writes do, and tells ``on_buried`` of the rest
        buried."""
        inner = leasing.handback(
            core, items, grace_ms=self.grace_ms, first_ms=self.first_ms, most_ms=self.most_ms
        )
        reasons = {i: r for i, _, r in items}

        def parse(reply: object) -> list[str]:
            refused: list[str] = []
            self.buried = set()
            for tid, status, waited in inner.parse(reply):
                claimed = self.claims.pop(tid, None)
                if status == leasing.BURIED:
                    self.buried.add(tid)
                    if claimed is not None:  # (the reason as the script stored it)
                        self.on_buried(
                            claimed,
                            f"{reasons.get(tid, '')}; handed back for {waited // 1000} s "
                            f"since it fell due, and unknown_kind_grace is "
                            f"{self.grace_ms // 1000} s",
                        )
                elif status != leasing.HANDED_BACK:
                    refused.append(tid)
            return refused

        return Op(inner.script, inner.keys, inner.args, parse)
