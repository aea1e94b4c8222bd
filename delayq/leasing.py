"""Builders for the worker's script calls: claim, ack, retry, bury, release, extend. Pure.

A lease is ``(task id, token)``: the token is handed out by ``claim`` and checked by every
later call, so a worker whose lease expired or was taken over cannot finish the task.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from delayq.codec import Header
from delayq.core import Op, QueueCore
from delayq.history import encode_lateness, span_and_ttl
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


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A claimed row that cannot become a task: its id, kind or payload format is not UTF-8
    (another program wrote it; delayq writes only UTF-8). The worker holds its lease, and
    buries it by its raw ``id`` with ``reason`` (worker/unreadable.py). ``claimed`` is the
    row as text, undecodable bytes shown as ``\\xNN``, for logs, events and on_dead hooks."""

    id: bytes
    reason: str
    claimed: Claimed

    @property
    def token(self) -> int:
        return self.claimed.token


@dataclass(frozen=True)
class ClaimResult:
    now_ms: int
    next_due_ms: int | None
    next_lease_ms: int | None
    tasks: list[Claimed]
    now_us: int  # the same instant as now_ms, to the microsecond (the worker's clock)
    # Due tasks were left for want of the rate limit's tokens: when the next one is (ms).
    next_token_ms: int | None = None
    # Claimed rows that cannot become tasks, to bury (see Unreadable); not in ``tasks``.
    unreadable: tuple[Unreadable, ...] = ()


def _opt(v: Any) -> int | None:
    n = int(float(v))
    return None if n < 0 else n


def _text(b: bytes) -> str:
    """Bytes another program may have written, as text to show: undecodable bytes as \\xNN."""
    return b.decode("utf-8", "backslashreplace")


# The fields of a claim row that the parse decodes as text, with the names a reason gives
# them; the headers and the payload are decoded by the executor (RecordError names them).
_TEXT_FIELDS = (
    ("task id", 0),
    ("kind (header field k)", 1),
    ("payload format (header field f)", 7),
)


def _read_rows(r: Any, shard: int) -> tuple[list[Claimed], tuple[Unreadable, ...]]:
    """claim's rows one by one, when some field is not UTF-8: the tasks, and the rows that
    cannot be tasks (the first bad field named in the reason)."""
    tasks: list[Claimed] = []
    unreadable: list[Unreadable] = []
    for row in _CLAIM.rows(r):
        id, kind, attempt, max_attempts, token, due, created, format, headers, payload = row
        due = due if type(due) is int else float(due)
        bad = None
        for name, i in _TEXT_FIELDS:
            try:
                row[i].decode()
            except UnicodeDecodeError as e:
                bad = (
                    f"record cannot be read: its {name} is not valid UTF-8 ({e.reason} at "
                    f"byte {e.start}: {row[i][:200]!r}); delayq writes only UTF-8, so "
                    "another program wrote it"
                )
                break
        fmt = _text(format) or "json"
        header = Header(_text(kind), attempt, max_attempts, token, created, due, fmt, headers)
        if bad is None:
            tasks.append(Claimed(id.decode(), header, payload, shard))
        else:
            unreadable.append(Unreadable(id, bad, Claimed(_text(id), header, payload, shard)))
    return tasks, tuple(unreadable)


# The other calls answer with the ids refused: one id per row; extend with the ids lost.
for _name in ("ack", "retry", "bury", "release"):
    SCRIPTS[_name].reply.require_row("id")
_EXTEND = SCRIPTS["extend"].reply
_EXTEND.require_row("id", "aborted")


def _ids(reply: Any) -> list[str]:
    # An id we sent (valid UTF-8), or the raw id of an Unreadable row we buried.
    return [_text(r) if isinstance(r, bytes) else str(r) for r in reply]


class Lost(list[str]):
    """extend's answer: the ids whose lease was lost (a list), and in ``aborted`` those of
    them that were aborted (``queue.abort``), whose handlers stop as aborted."""

    aborted: frozenset[str] = frozenset()


def _lost(reply: Any) -> Lost:
    lost, aborted = Lost(), []
    for tid, was_aborted in _EXTEND.rows(reply):
        lost.append(_text(tid) if isinstance(tid, bytes) else str(tid))
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
        # decoded (see its header): no JSON to parse. It does not look at their bytes (a
        # pattern over every id costs the script a quarter of a microsecond a task): a field
        # that is not UTF-8 fails its decode here, and only then are the rows read one by
        # one (_read_rows). A try costs nothing until it catches.
        unreadable: tuple[Unreadable, ...] = ()
        try:
            tasks = [
                Claimed(
                    id.decode(),
                    Header(
                        kind.decode(),
                        attempt,
                        most,
                        token,
                        created,
                        due if type(due) is int else float(due),
                        fmt.decode() or "json",
                        headers,  # b"" for none; decoded by the executor (build_task)
                    ),
                    payload,
                    shard,
                )
                for id, kind, attempt, most, token, due, created, fmt, headers, payload in (
                    _CLAIM.rows(r)
                )
            ]
        except UnicodeDecodeError:  # another program's record: bury its row, keep the rest
            tasks, unreadable = _read_rows(r, shard)
        now_us = int(r[_NOW])
        return ClaimResult(
            now_us // 1000,
            _opt(r[_NEXT_DUE]),
            _opt(r[_NEXT_LEASE]),
            tasks,
            now_us,
            _opt(r[_NEXT_TOKEN]),
            unreadable,
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


def _history(
    core: QueueCore, args: dict[str, Arg], lateness: Iterable[float], now_ms: int | None
) -> dict[str, str]:
    """Add the history's arguments to ``args`` (delayq/history.py); its hash's key."""
    span, ttl = span_and_ttl(core.wall_ms() if now_ms is None else now_ms, core.history_ms)
    args["history"] = ttl if core.history_ms else 0
    args["lateness"] = encode_lateness(lateness)
    return {"history": core.keys.history(span)}


def _flat(items: Sequence[tuple[Any, ...]]) -> list[Arg]:
    return [x for item in items for x in item]


def ack(
    core: QueueCore,
    leases: Sequence[Lease],
    *,
    discarded: bool = False,
    trim_limit: int | None = None,
    lateness: Iterable[float] = (),
    now_ms: int | None = None,
    finished: Sequence[tuple[str, str, str]] | None = None,
) -> Op[list[str]]:
    """Record tasks as done. ``finished``: per lease, (tombstone's prefix, kind, result):
    ``"<attempt> <ms from its due time to now> "`` ("": the script reads them from the
    attempts entry), the kind ("": read from its record) and what its handler returned, as
    JSON text ("": nothing); none given: ("", "", "") each. ``lateness``: the start lateness
    of the batch's attempts (seconds; negative: not run), for the dashboard's history
    (delayq/history.py); so for retry and bury."""
    # Each call forgets up to twice the records it adds (at least 20): under any sustained
    # load, finished records leave once their dedupe window has passed instead of piling up.
    trim = trim_limit if trim_limit is not None else max(20, 2 * len(leases))
    if finished is None:
        rest: list[Arg] = [x for i, t in leases for x in (i, t, "", "", "")]
    else:
        if len(finished) != len(leases):
            raise ValueError("ack needs one (prefix, kind, result) per lease")
        rest = [
            x for (i, t), (p, k, r) in zip(leases, finished, strict=True) for x in (i, t, p, k, r)
        ]
    args: dict[str, Arg] = {
        "now": core.now_arg(now_ms),
        "dedupe_ms": core.dedupe_ms,
        "counter": "discarded" if discarded else "succeeded",
        "trim_limit": trim,
        "keep": "1" if core.keep_finished == "record" else "",
        "channel": core.keys.finished_channel,
    }
    key = _history(core, args, lateness, now_ms)
    return core.op("ack", args, rest, _ids, key)


def retry(
    core: QueueCore,
    items: Sequence[tuple[str, int, str, str]],
    *,
    lateness: Iterable[float] = (),
    now_ms: int | None = None,
) -> Op[list[str]]:
    """items: (id, token, due spec, error text); the text is escaped (text.escape)."""
    rest: list[Arg] = [x for i, t, d, e in items for x in (i, t, d, escape(e))]
    args: dict[str, Arg] = {"now": core.now_arg(now_ms), "channel": core.keys.wake_channel}
    return core.op("retry", args, rest, _ids, _history(core, args, lateness, now_ms))


def bury(
    core: QueueCore,
    items: Sequence[tuple[str | bytes, int, str]],
    *,
    lateness: Iterable[float] = (),
    now_ms: int | None = None,
) -> Op[list[str]]:
    """items: (id, token, reason); the reason is escaped (text.escape). An id may be the raw
    bytes of an :class:`Unreadable` row; the ids refused come back as text (``\\xNN``)."""
    rest: list[Arg] = [x for i, t, r in items for x in (i, t, escape(r))]
    args: dict[str, Arg] = {"now": core.now_arg(now_ms), "finished": core.keys.finished_channel}
    return core.op("bury", args, rest, _ids, _history(core, args, lateness, now_ms))


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


HANDED_BACK, BURIED = 1, 2  # handback's statuses (0: refused, the lease was lost)
_HANDBACK = SCRIPTS["handback"].reply
_HANDBACK.require_row("id", "status", "waited")


def handback(
    core: QueueCore,
    items: Sequence[tuple[str, int, str]],
    *,
    grace_ms: int,
    first_ms: int,
    most_ms: int,
    now_ms: int | None = None,
) -> Op[list[tuple[str, int, int]]]:
    """Tasks of a kind the worker has no handler for: handed back without counting the
    attempt until ``grace_ms`` has passed since they fell due, then buried. items: (id,
    token, reason); parses to (id, status, ms waited since it fell due) per task (status: 0
    refused, or
    :data:`HANDED_BACK`, :data:`BURIED`)."""
    rest: list[Arg] = [x for i, t, r in items for x in (i, t, escape(r))]
    args: dict[str, Arg] = {
        "now": core.now_arg(now_ms),
        "channel": core.keys.wake_channel,
        "grace_ms": grace_ms,
        "first_ms": first_ms,
        "most_ms": most_ms,
        "finished": core.keys.finished_channel,
    }
    key = _history(core, args, [], now_ms)  # a burial counts as dead in the history
    return core.op("handback", args, rest, _handback_rows, key)


def _handback_rows(r: Any) -> list[tuple[str, int, int]]:
    return [(_text(i), int(s), int(waited)) for i, s, waited in _HANDBACK.rows(r)]


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
