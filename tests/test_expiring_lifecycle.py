"""docs/expiring.md's lifecycle table, row by row, on a real server.

As tests/test_scripts.py does for the task scripts: each row seeds the exact state of one
watched key (its task in the state sets, record, attempts entry, error, the key map, the
gate), runs ONE operation with an explicit ``now`` and compares the reply and the whole
resulting state. ``want=None`` means nothing changed. A new task's id is random: ``want``
may be a function of the id the operation was given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from typing import Any

import pytest
import redis

from delayq import Queue
from delayq.codec import encode_record
from delayq.core import Op, QueueCore
from delayq.expiring import ops as expiring
from delayq.keys import QueueKeys
from delayq.leasing import ack, claim
from delayq.runner import SyncRunner

NOW = 1_700_000_000_000
LEASE = 30_000
KEY = "session:1"
X = "x:AAAAAAAAAAAAAAAA:session:1"  # the key's task, as expiring.task_id_for names it
D = NOW + 5_000  # an alive key's deadline
STATES = ("scheduled", "active", "done", "dead")


def value(v: str, deadline: int) -> str:
    return f'{{"k":"{KEY}","v":{v},"d":{deadline}}}'


FOREIGN = f'{{"k":"{KEY}","v":null,"foreign":true}}'


@dataclass
class W:
    """The state of one queue's watched keys: sets, record payloads, attempts entries,
    errors, key map, stats, and whether KEY's gate is shut."""

    scheduled: dict[str, int] = field(default_factory=dict)
    active: dict[str, int] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)
    dead: dict[str, int] = field(default_factory=dict)
    tasks: dict[str, str] = field(default_factory=dict)
    attempts: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    xkeys: dict[str, str] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    gate: bool = False


def seed(r: redis.Redis, k: QueueKeys, s: W) -> None:
    for name in STATES:
        if zset := getattr(s, name):
            r.zadd(getattr(k, name), zset)
    for i, payload in s.tasks.items():
        rec = encode_record(
            expiring.EXPIRE_KIND, payload.encode(), max_attempts=0, created_ms=NOW, fmt="json"
        )
        r.hset(k.tasks, i, rec)
    for name in ("attempts", "errors", "xkeys", "stats"):
        if mapping := getattr(s, name):
            r.hset(getattr(k, name), mapping=mapping)
    if s.gate:
        r.set(k.expire_gate(KEY), "1", px=5000)


def read(r: redis.Redis, k: QueueKeys) -> W:
    def text(h: dict[bytes, bytes]) -> dict[str, str]:
        return {a.decode(): b.decode() for a, b in h.items()}

    zsets = [
        {i.decode(): int(s) for i, s in r.zrange(getattr(k, n), 0, -1, withscores=True)}
        for n in STATES
    ]
    tasks = {i: rec.split("\n", 1)[1] for i, rec in text(r.hgetall(k.tasks)).items()}
    return W(
        *zsets,
        tasks=tasks,
        attempts=text(r.hgetall(k.attempts)),
        errors=text(r.hgetall(k.errors)),
        xkeys=text(r.hgetall(k.xkeys)),
        stats={c: int(v) for c, v in text(r.hgetall(k.stats)).items()},
        gate=bool(r.exists(k.expire_gate(KEY))),
    )


# -- the states of one watched key ---------------------------------------------------------

MAPPED = {KEY: X}
ALIVE = W(scheduled={X: D + 1}, tasks={X: value("1", D)}, xkeys=MAPPED)
# Claimed by a worker's lookahead 10 ms before its due time (deadline NOW + 9).
AHEAD = W(
    active={X: NOW + 10 + LEASE},
    tasks={X: value("1", NOW + 9)},
    attempts={X: f"7 1 {NOW + 10}"},
    xkeys=MAPPED,
)
EXPIRED = W(scheduled={X: NOW - 999}, tasks={X: value("1", NOW - 1_000)}, xkeys=MAPPED)
# Expired early (other code shortened the TTL): the bell moved it to due.
RUNG = W(scheduled={X: NOW - 10}, tasks={X: value("1", D)}, xkeys=MAPPED)
CLAIMED = W(
    active={X: NOW - 999 + LEASE},
    tasks={X: value("1", NOW - 1_000)},
    attempts={X: f"7 1 {NOW - 999}"},
    xkeys=MAPPED,
)
RETRYING = W(
    scheduled={X: NOW + 2_000},
    tasks={X: value("1", NOW - 1_000)},
    attempts={X: f"7 1 {NOW - 999}"},
    errors={X: "boom"},
    xkeys=MAPPED,
)
DELIVERED = W(
    done={X: NOW - 500},
    tasks={X: value("1", NOW - 1_000)},
    attempts={X: f"7 1 {NOW - 999}"},
    xkeys=MAPPED,
)
DEAD = W(
    dead={X: NOW - 500},
    tasks={X: value("1", NOW - 1_000)},
    attempts={X: f"7 1 {NOW - 999}"},
    errors={X: "Fail: no"},
    xkeys=MAPPED,
)
NONE = W()


# -- operations ----------------------------------------------------------------------------

Build = Callable[[QueueCore], Op[Any]]


def new_id(op: Op[Any]) -> str:
    """The id a set (or a foreign bell) gives its new task: ARGV id, 4th in both scripts."""
    arg = op.args[3]
    return arg.decode() if isinstance(arg, bytes) else str(arg)


def set_(c: QueueCore) -> Op[int]:
    return expiring.set_op(c, KEY, b"2", 5, now_ms=NOW)  # deadline NOW + 5000


def touch(c: QueueCore) -> Op[int]:
    return expiring.touch_op(c, KEY, 3, now_ms=NOW)  # deadline NOW + 3000


def delete(c: QueueCore) -> Op[bool]:
    return expiring.delete_op(c, KEY, now_ms=NOW)


def bell(c: QueueCore) -> Op[int]:
    return expiring.notice_op(c, KEY, foreign=True, now_ms=NOW)


def claim_ids(lookahead: int) -> Build:
    def build(c: QueueCore) -> Op[list[str]]:
        op = claim(c, limit=10, lease_ms=LEASE, lookahead_ms=lookahead, now_ms=NOW)
        return dc_replace(op, parse=lambda r: [t.id for t in op.parse(r).tasks])

    return build


def confirm(c: QueueCore) -> Op[tuple[str, int]]:
    return expiring.confirm_op(c, KEY, X, 7, now_ms=NOW)


def set_added(s: W) -> Callable[[str], W]:
    """State s plus the new set's task (value 2, deadline NOW + 5000), now the key's."""

    def want(y: str) -> W:
        return dc_replace(
            s,
            scheduled={**s.scheduled, y: NOW + 5_001},
            tasks={**s.tasks, y: value("2", NOW + 5_000)},
            xkeys={KEY: y},
            stats={**s.stats, "scheduled": s.stats.get("scheduled", 0) + 1},
        )

    return want


CANCELLED = W(stats={"cancelled": 1})


@dataclass(frozen=True)
class Case:
    name: str
    seed: W
    op: Build
    reply: Any
    want: W | Callable[[str], W] | None = None


def table(*cases: Case) -> list[Any]:
    return [pytest.param(c, id=c.name) for c in cases]


CASES = table(
    # alive: the only state (with ahead) in which the key has not expired.
    Case("alive x set replaces the task", ALIVE, set_, NOW + 5_000, set_added(NONE)),
    Case(
        "alive x touch moves the deadline",
        ALIVE,
        touch,
        NOW + 3_000,
        dc_replace(ALIVE, scheduled={X: NOW + 3_001}, tasks={X: value("1", NOW + 3_000)}),
    ),
    Case("alive x delete cancels it", ALIVE, delete, True, CANCELLED),
    Case(
        "alive x notification makes it due now",
        ALIVE,
        bell,
        1,
        dc_replace(ALIVE, scheduled={X: NOW}),
    ),
    Case("alive x claim before its deadline takes nothing", ALIVE, claim_ids(20), []),
    # ahead: claimed by the lookahead, the deadline not yet passed. The claim is revoked.
    Case(
        "ahead x set revokes the claim and replaces it", AHEAD, set_, NOW + 5_000, set_added(NONE)
    ),
    Case(
        "ahead x touch revokes the claim and waits again unattempted",
        AHEAD,
        touch,
        NOW + 3_000,
        W(scheduled={X: NOW + 3_001}, tasks={X: value("1", NOW + 3_000)}, xkeys=MAPPED),
    ),
    Case("ahead x delete revokes the claim and cancels it", AHEAD, delete, True, CANCELLED),
    Case("ahead x notification changes nothing", AHEAD, bell, 0),
    Case("ahead x claim changes nothing", AHEAD, claim_ids(20), []),
    Case("ahead x the worker's confirm is early", AHEAD, confirm, ("early", 10)),
    Case("a revoked claim's confirm is lost", NONE, confirm, ("lost", 0)),
    # expired, undelivered: never dropped, never moved.
    Case(
        "expired x set keeps the first expiry and adds the new one",
        EXPIRED,
        set_,
        NOW + 5_000,
        set_added(EXPIRED),
    ),
    Case(
        "expired by the bell x set keeps it and adds the new one",
        RUNG,
        set_,
        NOW + 5_000,
        set_added(RUNG),
    ),
    Case("expired x touch moves nothing", EXPIRED, touch, -1),
    Case("expired by the bell x touch moves nothing", RUNG, touch, -1),
    Case("expired x delete cancels nothing", EXPIRED, delete, False),
    Case("expired x notification changes nothing", EXPIRED, bell, 0),
    Case(
        "expired x scan claims it",
        EXPIRED,
        claim_ids(0),
        [X],
        dc_replace(
            EXPIRED,
            scheduled={},
            active={X: NOW + LEASE},
            attempts={X: f"1 1 {NOW - 999}"},
            stats={"claim_seq": 1},
        ),
    ),
    # claimed at or past the deadline: left to deliver.
    Case(
        "claimed x set keeps the running expiry and adds the new one",
        CLAIMED,
        set_,
        NOW + 5_000,
        set_added(CLAIMED),
    ),
    Case("claimed x touch moves nothing", CLAIMED, touch, -1),
    Case("claimed x delete cancels nothing", CLAIMED, delete, False),
    Case("claimed x notification changes nothing", CLAIMED, bell, 0),
    Case("claimed x claim changes nothing", CLAIMED, claim_ids(20), []),
    Case("claimed x the worker's confirm is current", CLAIMED, confirm, ("current", 0)),
    Case(
        "claimed and then set again x the worker's confirm says moved",
        dc_replace(CLAIMED, xkeys={KEY: "x:BBBBBBBBBBBBBBBB:session:1"}),
        confirm,
        ("moved", 0),
    ),
    # retrying: the backoff is kept whatever happens to the key.
    Case(
        "retrying x set keeps the retry and adds the new one",
        RETRYING,
        set_,
        NOW + 5_000,
        set_added(RETRYING),
    ),
    Case("retrying x touch moves nothing", RETRYING, touch, -1),
    Case("retrying x delete keeps the retry", RETRYING, delete, False),
    Case("retrying x notification keeps the backoff", RETRYING, bell, 0),
    Case("retrying x claim before its retry time takes nothing", RETRYING, claim_ids(20), []),
    # delivered: the mapping stays with the record, so a late bell is the key's own.
    Case("delivered x set adds a new task", DELIVERED, set_, NOW + 5_000, set_added(DELIVERED)),
    Case("delivered x touch moves nothing", DELIVERED, touch, -1),
    Case("delivered x delete changes nothing", DELIVERED, delete, False),
    Case("delivered x a late notification is no foreign expiry", DELIVERED, bell, 0),
    Case(
        "delivered x trimming its record drops the mapping with it",
        dc_replace(DELIVERED, done={X: NOW - 3_600_001}),
        lambda c: ack(c, [], now_ms=NOW),
        [],
        NONE,
    ),
    # dead: like delivered; purging it drops the mapping.
    Case("dead x set adds a new task", DEAD, set_, NOW + 5_000, set_added(DEAD)),
    Case("dead x touch moves nothing", DEAD, touch, -1),
    Case("dead x a late notification is no foreign expiry", DEAD, bell, 0),
    Case(
        "dead x purge drops the mapping with the record",
        DEAD,
        lambda c: c.purge_dead([X]),
        1,
        NONE,
    ),
    Case(
        "a cancelled task takes its mapping with it",
        ALIVE,
        lambda c: c.cancel(X),
        True,
        CANCELLED,
    ),
    # no task: a bell is a foreign key's expiry, once.
    Case("none x set adds a task", NONE, set_, NOW + 5_000, set_added(NONE)),
    Case("none x touch moves nothing", NONE, touch, -1),
    Case("none x delete changes nothing", NONE, delete, False),
    Case(
        "none x notification creates a foreign task and shuts the gate",
        NONE,
        bell,
        2,
        lambda y: W(scheduled={y: NOW}, tasks={y: FOREIGN}, stats={"scheduled": 1}, gate=True),
    ),
    Case(
        "a mapping its record did not outlive counts as none: the bell is a foreign key's",
        W(xkeys=MAPPED),  # left by a version that forgot records without their mapping
        bell,
        2,
        lambda y: W(
            scheduled={y: NOW}, tasks={y: FOREIGN}, stats={"scheduled": 1}, gate=True, xkeys=MAPPED
        ),
    ),
    Case(
        "none x notification behind a shut gate changes nothing",
        dc_replace(NONE, gate=True),
        bell,
        0,
    ),
)


@pytest.mark.parametrize("case", CASES)
def test_lifecycle_table(queue: Queue, case: Case) -> None:
    r, k = queue.client, queue.core.keys
    assert queue.core.dedupe_ms == 3_600_000, "the rows assume the queue fixture's window"
    seed(r, k, case.seed)
    assert read(r, k) == case.seed, "seeding is exact"
    op = case.op(queue.core)
    assert SyncRunner(r).run(op) == case.reply
    want = case.want
    if callable(want):
        want = want(new_id(op))
    assert read(r, k) == (case.seed if want is None else want)
