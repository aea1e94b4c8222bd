"""Builders for the worker's script calls: claim, ack, retry, bury, release, extend. Pure.

A lease is ``(task id, token)``: the token is handed out by ``claim`` and checked by every
later call, so a worker whose lease expired or was taken over cannot finish the task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from delayq.codec import Header
from delayq.core import Op, QueueCore
from delayq.scripts import SCRIPTS, Arg
from delayq.text import escape

Lease = tuple[str, int]

MAX_CLAIM = 1000  # tasks per claim call: bounds the script's run time and its reply

# claim's reply as claim.lua declares it, read once: the head's positions by name, and its
# rows unpacked by name, checked here against the declaration's (unpacking a row costs a
# quarter less than ten index sums, on the worker's hottest path).
_CLAIM = SCRIPTS["claim"].reply
_NOW, _NEXT_DUE, _NEXT_LEASE, _NEXT_TOKEN = (
    _CLAIM.at(n) for n in ("now", "next_due", "next_lease", "next_token")
)
_CLAIM.require_row(
    "id",
    "kind",
    "attempt",
    "max_attempts",
    "token",
    "due",
    "created",
    "format",
    "headers",
    "payload",
)


@dataclass(slots=True)
class Claimed:
    """A task this worker now holds a lease on, payload still encoded."""

    id: str
    header: Header
    payload: bytes
    # The shard it was claimed from: its outcome and its lease extensions go there, even
    # when another program wrote it onto a shard its id does not hash to.
    shard: int = 0

    @property
    def token(self) -> int:
        return self.header.token


@dataclass(frozen=True)
class ClaimResult:
    now_ms: int
    next_due_ms: int | None
    next_lease_ms: int | None
    tasks: list[Claimed]
    now_us: int  # the same instant as now_ms, to the microsecond (the worker's clock)
    # Due tasks were left for want of the rate limit's tokens: when the next one is (ms).
    next_token_ms: int | None = None


def _opt(v: Any) -> int | None:
    n = int(float(v))
    return None if n < 0 else n


# The other calls answer with the ids refused: one id per row; extend with the ids lost.
for _name in ("ack", "retry", "bury", "release"):
    SCRIPTS[_name].reply.require_row("id")
_EXTEND = SCRIPTS["extend"].reply
_EXTEND.require_row("id", "aborted")


def _ids(reply: Any) -> list[str]:
    return [r.decode() if isinstance(r, bytes) else str(r) for r in reply]


class Lost(list[str]):
    """extend's answer: the ids whose lease was lost (a list), and in ``aborted`` those of
    them that were aborted (``queue.abort``), whose handlers stop as aborted."""

    aborted: frozenset[str] = frozenset()


def _lost(reply: Any) -> Lost:
    lost, aborted = Lost(), []
    for tid, was_aborted in _EXTEND.rows(reply):
        lost.append(tid.decode() if isinstance(tid, bytes) else str(tid))
        if int(was_aborted):
            aborted.append(lost[-1])
    if aborted:
        lost.aborted = frozenset(aborted)
    return lost


def claim(
    core: QueueCore,
    *,
    limit: int,
    lease_ms: int,
    lookahead_ms: int = 0,
    reap_limit: int = 100,
    worker: str = "",
    worker_info: str = "",
    rooms: Sequence[Arg] = (),
    now_ms: int | None = None,
) -> Op[ClaimResult]:
    """Lease the tasks due within ``lookahead_ms``, at most ``limit``. ``rooms``: pairs
    ``kind, room`` (the worker's per-kind concurrency left; see controls.kind_rooms); a kind
    whose room is 0 is left waiting. Empty: every kind, as claim always did."""

    shard = core.shard

    def parse(r: Any) -> ClaimResult:
        # claim.lua buried the records it could not read and sends the rest's header fields
        # decoded (see its header): nothing to validate here, and no JSON to parse.
        tasks = [
            Claimed(
                id.decode(),
                Header(
                    kind.decode(),
                    attempt,
                    max_attempts,
                    token,
                    created,
                    due if type(due) is int else float(due),
                    format.decode() or "json",
                    headers,  # b"" for none; decoded by the executor (build_task)
                ),
                payload,
                shard,
            )
            for id, kind, attempt, max_attempts, token, due, created, format, headers, payload in (
                _CLAIM.rows(r)
            )
        ]
        now_us = int(r[_NOW])
        return ClaimResult(
            now_us // 1000,
            _opt(r[_NEXT_DUE]),
            _opt(r[_NEXT_LEASE]),
            tasks,
            now_us,
            _opt(r[_NEXT_TOKEN]),
        )

    return core.op(
        "claim",
        {
            "now": core.now_arg(now_ms),
            "lookahead_ms": lookahead_ms,
            "limit": min(limit, MAX_CLAIM),
            "lease_ms": lease_ms,
            "reap_limit": reap_limit,
            "worker": worker,
            "worker_info": worker_info,
            "channel": core.keys.wake_channel,
        },
        list(rooms),
        parse,
    )


def _flat(items: Sequence[tuple[Any, ...]]) -> list[Arg]:
    return [x for item in items for x in item]


def ack(
    core: QueueCore,
    leases: Sequence[Lease],
    *,
    discarded: bool = False,
    trim_limit: int | None = None,
    now_ms: int | None = None,
) -> Op[list[str]]:
    # Each call forgets up to twice the records it adds (at least 20): under any sustained
    # load, finished records leave once their dedupe window has passed instead of piling up.
    trim = trim_limit if trim_limit is not None else max(20, 2 * len(leases))
    return core.op(
        "ack",
        {
            "now": core.now_arg(now_ms),
            "dedupe_ms": core.dedupe_ms,
            "counter": "discarded" if discarded else "succeeded",
            "trim_limit": trim,
        },
        _flat(leases),
        _ids,
    )


def retry(
    core: QueueCore, items: Sequence[tuple[str, int, str, str]], *, now_ms: int | None = None
) -> Op[list[str]]:
    """items: (id, token, due spec, error text); the text is escaped (text.escape)."""
    rest: list[Arg] = [x for i, t, d, e in items for x in (i, t, d, escape(e))]
    args: dict[str, Arg] = {"now": core.now_arg(now_ms), "channel": core.keys.wake_channel}
    return core.op("retry", args, rest, _ids)


def bury(
    core: QueueCore, items: Sequence[tuple[str, int, str]], *, now_ms: int | None = None
) -> Op[list[str]]:
    """items: (id, token, reason); the reason is escaped (text.escape)."""
    rest: list[Arg] = [x for i, t, r in items for x in (i, t, escape(r))]
    return core.op("bury", {"now": core.now_arg(now_ms)}, rest, _ids)


def release(
    core: QueueCore,
    leases: Sequence[Lease],
    *,
    dues: Sequence[str] | None = None,
    now_ms: int | None = None,
) -> Op[list[str]]:
    """Hand tasks back without counting the attempt; ``dues`` ("" keeps the due time) defers."""
    due_list = list(dues) if dues is not None else [""] * len(leases)
    if len(due_list) != len(leases):
        raise ValueError("release needs one due per lease")
    items = [(tid, token, due) for (tid, token), due in zip(leases, due_list, strict=True)]
    return core.op(
        "release",
        {"now": core.now_arg(now_ms), "channel": core.keys.wake_channel},
        _flat(items),
        _ids,
    )


def extend(
    core: QueueCore,
    leases: Sequence[Lease],
    *,
    lease_ms: int,
    worker: str = "",
    worker_info: str = "",
    now_ms: int | None = None,
) -> Op[Lost]:
    """Heartbeat: extend held leases (and refresh the worker's registration); parses to the
    ids lost (:class:`Lost`)."""
    args: dict[str, Arg] = {
        "now": core.now_arg(now_ms),
        "lease_ms": lease_ms,
        "worker": worker,
        "worker_info": worker_info,
    }
    return core.op("extend", args, _flat(leases), _lost)


def unregister(core: QueueCore, worker: str) -> Op[bool]:
    return core.op("unregister", {"worker": worker}, [], lambda r: int(r) == 1)
