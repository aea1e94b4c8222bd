"""Per-script tests: seed exact Redis state, run one operation, assert the exact state after.

Asynq's ``rdb_test.go`` style. Each table row seeds the queue's sorted sets and hashes
directly (key names from ``QueueKeys``, records from ``encode_record``), runs ONE builder
through ``SyncRunner`` with an explicit ``now_ms`` so time is deterministic, and compares
the reply and the whole resulting state: the four state ZSETs with scores, every record
header, the errors hash and the stats counters. ``want=None`` means "nothing changed".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from importlib import resources
from typing import Any

import pytest
import redis

from delayq import Queue
from delayq.admin import inspect as admin
from delayq.codec import Attempt, Header, RecordError, encode_record, split_record
from delayq.core import Op, QueueCore
from delayq.expiring import ops as expiring
from delayq.http import idempotency
from delayq.keys import Key, QueueKeys
from delayq.leasing import (
    ClaimResult,
    ack,
    bury,
    claim,
    extend,
    handback,
    release,
    retry,
    unregister,
)
from delayq.runner import SyncRunner
from delayq.scripts import SCRIPTS, file_of, parse_header
from delayq.settings import Given
from delayq.shards import update_op
from delayq.spec import TaskSpec
from delayq.timing import ms_to_datetime
from delayq.waits import wait_op

NOW = 1_700_000_000_000
CREATED = NOW - 7_200_000
LEASE = 30_000
DEDUPE = 3_600_000  # the `queue` fixture's dedupe_window=3600 s, in ms
STATES = ("scheduled", "active", "done", "dead")

# Texts the scripts write into the errors hash.
UNDECODABLE = "record cannot be decoded (corrupt or written by another program)"


def reaped(attempt: int, *, dead: bool = False) -> str:
    text = (
        f"lease expired during attempt {attempt} "
        "(the worker stopped, crashed or stalled past its lease)"
    )
    return text + "; no attempts left" if dead else text


# -- records and queue state -------------------------------------------------------------


@dataclass(frozen=True)
class T:
    """A task as the scripts see it: the record's header fields they read, the payload, and
    the attempt state (a, t, d) kept in the attempts hash."""

    kind: str = "job"
    payload: bytes = b'"old"'
    a: int = 0
    m: int = 0
    t: int = 0
    d: int | None = None

    def record(self) -> bytes:
        """Built like a producer does (encode_record): claims never rewrite it."""
        return encode_record(
            self.kind, self.payload, max_attempts=self.m, created_ms=CREATED, fmt="json"
        )

    def attempt(self) -> bytes | None:
        """Its attempts-hash entry, or None for a task never claimed."""
        if not (self.a or self.t or self.d):
            return None
        return f"{self.t} {self.a} {'' if self.d is None else self.d}".encode()

    @classmethod
    def of(cls, header: Header, payload: bytes) -> T:
        return cls(
            header.kind, payload, header.attempts, header.max_attempts, header.token, header.due_ms
        )

    @classmethod
    def read(cls, record: bytes, attempt: bytes | None = None) -> T | bytes:
        """An undecodable record reads back as its raw bytes."""
        try:
            header, payload = split_record(record)
        except RecordError:
            return record
        return cls.of(Header.of(header, Attempt.parse(attempt)), payload)


NEW = T(payload=b'"new"')  # what `spec()` schedules
LEASED = T(a=1, t=7, d=NOW - 5_000)  # first attempt, lease token 7


@dataclass
class S:
    """The whole state of one queue shard."""

    scheduled: dict[str, int] = field(default_factory=dict)
    active: dict[str, int] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)
    dead: dict[str, int] = field(default_factory=dict)
    tasks: dict[str, T | bytes] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)


def seed(r: redis.Redis, k: QueueKeys, s: S) -> None:
    pipe = r.pipeline(transaction=False)
    for name in STATES:
        if zset := getattr(s, name):
            pipe.zadd(getattr(k, name), zset)
    if s.tasks:
        pipe.hset(
            k.tasks, mapping={i: t.record() if isinstance(t, T) else t for i, t in s.tasks.items()}
        )
        attempts = {i: e for i, t in s.tasks.items() if isinstance(t, T) and (e := t.attempt())}
        if attempts:
            pipe.hset(k.attempts, mapping=attempts)
    if s.errors:
        pipe.hset(k.errors, mapping=s.errors)
    if s.stats:
        pipe.hset(k.stats, mapping=s.stats)
    pipe.execute()


def read_state(r: redis.Redis, k: QueueKeys) -> S:
    pipe = r.pipeline(transaction=False)
    for name in STATES:
        pipe.zrange(getattr(k, name), 0, -1, withscores=True)
    pipe.hgetall(k.tasks).hgetall(k.attempts).hgetall(k.errors).hgetall(k.stats)
    *zsets, tasks, attempts, errors, stats = pipe.execute()
    assert set(attempts) <= set(tasks), "an attempt state outlived its record"
    return S(
        *({i.decode(): int(score) for i, score in z} for z in zsets),
        tasks={i.decode(): T.read(rec, attempts.get(i)) for i, rec in tasks.items()},
        errors={i.decode(): e.decode() for i, e in errors.items()},
        stats={c.decode(): int(v) for c, v in stats.items()},
    )


# -- operations --------------------------------------------------------------------------


def spec(
    task_id: str, *, m: int = 0, delay: float | None = None, at_ms: int | None = None
) -> TaskSpec:
    at = None if at_ms is None else at_ms / 1000
    return TaskSpec("job", "new", delay=delay, at=at, task_id=task_id, max_attempts=m)


def statuses(op: Op[Any]) -> Op[list[int]]:
    """schedule's parser returns the ids; tests want the script's per-task status. The
    reply ends with the now the script ran at (protocol 1.1): the tests' NOW."""

    def parse(reply: Any) -> list[int]:
        *codes, now = reply
        assert now == NOW, "schedule.lua replies the now it ran at after the statuses"
        return [int(x) for x in codes]

    return dc_replace(op, parse=parse)


def claimed(op: Op[ClaimResult]) -> Op[tuple[Any, ...]]:
    def parse(reply: Any) -> tuple[Any, ...]:
        r = op.parse(reply)
        return (
            r.now_ms,
            r.next_due_ms,
            r.next_lease_ms,
            [(t.id, T.of(t.header, t.payload)) for t in r.tasks],
        )

    return dc_replace(op, parse=parse)


Build = Callable[[QueueCore], Op[Any]]


def sched(*specs: TaskSpec, replace: bool = False) -> Build:
    return lambda c: statuses(c.schedule(list(specs), replace=replace, now_ms=NOW))


def claim_op(limit: int = 10, lookahead: int = 0, reap_limit: int = 100) -> Build:
    return lambda c: claimed(
        claim(
            c,
            limit=limit,
            lease_ms=LEASE,
            lookahead_ms=lookahead,
            reap_limit=reap_limit,
            now_ms=NOW,
        )
    )


def no_dedupe(c: QueueCore) -> QueueCore:
    """The same queue shard, configured to forget finished tasks at once."""
    return QueueCore(c.name, prefix=c.keys.prefix, dedupe_window=0)


@dataclass(frozen=True)
class Case:
    name: str
    seed: S
    op: Build
    reply: Any
    want: S | None = None  # None: the operation changes nothing
    bug: str | None = None  # a known delayq bug: the row is a strict xfail


def table(*cases: Case) -> list[Any]:
    return [
        pytest.param(
            c, id=c.name, marks=[pytest.mark.xfail(strict=True, reason=c.bug)] if c.bug else []
        )
        for c in cases
    ]


def check(queue: Queue, case: Case) -> None:
    r, k = queue.client, queue.core.keys
    assert queue.core.dedupe_ms == DEDUPE, "the tables assume the queue fixture's window"
    seed(r, k, case.seed)
    assert read_state(r, k) == case.seed, "seeding is exact"
    assert SyncRunner(r).run(case.op(queue.core)) == case.reply
    assert read_state(r, k) == (case.seed if case.want is None else case.want)


# -- schedule ----------------------------------------------------------------------------

WAITING = S(scheduled={"a": NOW + 1_000}, tasks={"a": LEASED})  # waiting after a retry
ACTIVE = S(active={"a": NOW + 1_000}, tasks={"a": LEASED})


def done_at(ms: int) -> S:
    return S(done={"a": ms}, tasks={"a": LEASED}, errors={"a": "flaky"})


DEAD = S(dead={"a": NOW - 50}, tasks={"a": LEASED}, errors={"a": "fatal"})
CREATED_A = S(scheduled={"a": NOW + 5_000}, tasks={"a": NEW}, stats={"scheduled": 1})


@pytest.mark.parametrize(
    "case",
    table(
        Case(
            "new id with relative delay is due at now+delay",
            S(),
            sched(spec("a", delay=5)),
            [1],
            CREATED_A,
        ),
        Case(
            "new id with absolute at is due at that ms",
            S(),
            sched(spec("a", at_ms=NOW + 7_000)),
            [1],
            S(scheduled={"a": NOW + 7_000}, tasks={"a": NEW}, stats={"scheduled": 1}),
        ),
        Case(
            "new id keeps its max_attempts and starts at attempt 0 token 0",
            S(),
            sched(spec("a", m=3)),
            [1],
            S(scheduled={"a": NOW}, tasks={"a": dc_replace(NEW, m=3)}, stats={"scheduled": 1}),
        ),
        Case("waiting id without replace is unchanged", WAITING, sched(spec("a", delay=5)), [0]),
        Case(
            "waiting id with replace gets the new due and record, and keeps its attempts",
            WAITING,
            sched(spec("a", delay=5), replace=True),
            [2],
            S(
                scheduled={"a": NOW + 5_000},
                tasks={"a": dc_replace(LEASED, payload=b'"new"')},
                stats={"scheduled": 1},
            ),
        ),
        Case(
            "waiting id replaced keeps the last error of the attempts it keeps",
            dc_replace(WAITING, errors={"a": "old failure"}),
            sched(spec("a", delay=5), replace=True),
            [2],
            S(
                scheduled={"a": NOW + 5_000},
                tasks={"a": dc_replace(LEASED, payload=b'"new"')},
                errors={"a": "old failure"},
                stats={"scheduled": 1},
            ),
        ),
        Case(
            "a waiting id never claimed is replaced with no attempts",
            S(scheduled={"a": NOW + 1_000}, tasks={"a": NEW}),
            sched(spec("a", delay=5), replace=True),
            [2],
            CREATED_A,
        ),
        Case("active id is untouched", ACTIVE, sched(spec("a", delay=5)), [0]),
        Case(
            "active id is untouched even with replace, and the reply says it is running",
            ACTIVE,
            sched(spec("a", delay=5), replace=True),
            [3],
        ),
        Case(
            "done id within the dedupe window is unchanged",
            done_at(NOW - 1_000),
            sched(spec("a", delay=5)),
            [0],
        ),
        Case(
            "done id exactly dedupe_ms ago still counts as a duplicate",
            done_at(NOW - DEDUPE),
            sched(spec("a", delay=5)),
            [0],
        ),
        Case(
            "done id past the dedupe window is re-created without its old error",
            done_at(NOW - DEDUPE - 1),
            sched(spec("a", delay=5)),
            [1],
            CREATED_A,
        ),
        Case(
            "done id within the window is re-created with replace",
            done_at(NOW - 1_000),
            sched(spec("a", delay=5), replace=True),
            [2],
            CREATED_A,
        ),
        Case("dead id is unchanged without replace", DEAD, sched(spec("a", delay=5)), [0]),
        Case(
            "dead id is re-created with replace, its reason dropped",
            DEAD,
            sched(spec("a", delay=5), replace=True),
            [2],
            CREATED_A,
        ),
        Case(
            "a record in no state set is re-created rather than stranded",
            S(tasks={"a": LEASED}),
            sched(spec("a", delay=5)),
            [1],
            CREATED_A,
        ),
        Case(
            "a batch reports one status per task and counts only the created",
            WAITING,
            sched(spec("a", delay=5), spec("b", delay=2)),
            [0, 1],
            S(
                scheduled={"a": NOW + 1_000, "b": NOW + 2_000},
                tasks={"a": LEASED, "b": NEW},
                stats={"scheduled": 1},
            ),
        ),
    ),
)
def test_schedule_creates_replaces_or_keeps_by_current_state(queue: Queue, case: Case) -> None:
    check(queue, case)


# -- schedule_new: schedule's case of a new id --------------------------------------------


def sched_new(
    task_id: str, *, m: int = 0, delay: float | None = None, at_ms: int | None = None
) -> Build:
    """One task with an id just made (``Queue.schedule`` without task_id), as its status."""
    at = None if at_ms is None else at_ms / 1000
    task = TaskSpec("job", "new", delay=delay, at=at, max_attempts=m)

    def parse(reply: Any) -> int:
        status, now = reply
        assert now == NOW, "schedule_new.lua replies {status, now}"
        return int(status)

    return lambda c: dc_replace(c.schedule_new(task, task_id, now_ms=NOW), parse=parse)


@pytest.mark.parametrize(
    "case",
    table(
        Case("a new id with a relative delay", S(), sched_new("a", delay=5), 1, CREATED_A),
        Case(
            "a new id with an absolute at",
            S(),
            sched_new("a", at_ms=NOW + 7_000),
            1,
            S(scheduled={"a": NOW + 7_000}, tasks={"a": NEW}, stats={"scheduled": 1}),
        ),
        Case(
            "a new id keeps its max_attempts, beside other tasks",
            dc_replace(WAITING, stats={"scheduled": 4}),
            sched_new("b", m=3),
            1,
            S(
                scheduled={"a": NOW + 1_000, "b": NOW},
                tasks={"a": LEASED, "b": dc_replace(NEW, m=3)},
                stats={"scheduled": 5},
            ),
        ),
        # An id that has a record was sent before: the call is a resend, which wrote it.
        Case("a resent call changes nothing", CREATED_A, sched_new("a", delay=9), 0),
        Case("an id that has a record is never touched", ACTIVE, sched_new("a", delay=5), 0),
    ),
)
def test_schedule_new_adds_a_new_task_and_leaves_a_known_id_alone(queue: Queue, case: Case) -> None:
    check(queue, case)


AROUND = {"early": NOW + 1_000, "late": NOW + 60_000}


@pytest.mark.parametrize(
    "seeded",
    [
        pytest.param({}, id="empty"),
        pytest.param({"early": NOW + 1_000}, id="an-earlier-head"),
        pytest.param({"late": NOW + 60_000}, id="a-later-head"),
        pytest.param(AROUND, id="both"),
    ],
)
@pytest.mark.parametrize("delay", [0, 5, 3600])
def test_schedule_new_writes_and_announces_what_schedule_does_for_a_new_id(
    queue: Queue, seeded: dict[str, int], delay: float
) -> None:
    """schedule_new.lua is schedule.lua's case of an id new to the queue, in fewer commands:
    the same state, status and wake-up, from either script."""
    seeds = S(scheduled=seeded, tasks={i: T() for i in seeded}, stats={"scheduled": 2})
    k, r = queue.core.keys, queue.client
    outcomes = []
    for build in (sched(spec("new", delay=delay)), sched_new("new", delay=delay)):
        r.delete(k.scheduled, k.tasks, k.stats, k.attempts)
        seed(r, k, seeds)
        published = _published(queue, build)
        outcomes.append((published, read_state(r, k)))
    assert outcomes[0] == outcomes[1]
    assert outcomes[1][1].scheduled["new"] == NOW + delay * 1000
    head = min(seeded.values(), default=None)
    announced = head is None or NOW + delay * 1000 < head
    assert outcomes[1][0] == ([str(NOW + delay * 1000).encode()] if announced else [])


def test_schedule_new_call_is_laid_out_as_its_header_declares(queue: Queue) -> None:
    """QueueCore.schedule_new lays its call out by hand (checked at import): the same keys
    and arguments as the header's names give."""
    core = queue.core
    op = core.schedule_new(TaskSpec("job", "new", delay=5), "n1", now_ms=NOW)
    named = dict(zip(op.script.arg_names, op.args, strict=True))
    assert named["now"] == NOW and named["id"] == "n1" and named["due"] == "+5000"
    assert (op.keys, op.args) == op.script.keys_and_args(core.keys, named)
    record, payload = split_record(named["record"])
    assert (record.kind, record.max_attempts, payload) == ("job", 0, b'"new"')


# -- claim -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    table(
        Case(
            "claims only tasks due by now+lookahead, oldest first, lease from the later of "
            "now and due",
            S(
                scheduled={"a": NOW - 10, "b": NOW, "c": NOW + 50, "d": NOW + 51},
                tasks={i: T() for i in "abcd"},
            ),
            claim_op(lookahead=50),
            (
                NOW,
                NOW + 51,
                NOW + LEASE,
                [
                    ("a", T(a=1, t=1, d=NOW - 10)),
                    ("b", T(a=1, t=2, d=NOW)),
                    ("c", T(a=1, t=3, d=NOW + 50)),
                ],
            ),
            S(
                scheduled={"d": NOW + 51},
                active={"a": NOW + LEASE, "b": NOW + LEASE, "c": NOW + 50 + LEASE},
                tasks={
                    "a": T(a=1, t=1, d=NOW - 10),
                    "b": T(a=1, t=2, d=NOW),
                    "c": T(a=1, t=3, d=NOW + 50),
                    "d": T(),
                },
                stats={"claim_seq": 3},
            ),
        ),
        Case(
            "without lookahead a task due 1 ms from now is not claimed",
            S(scheduled={"a": NOW + 1}, tasks={"a": T()}),
            claim_op(),
            (NOW, NOW + 1, None, []),
        ),
        Case(
            "limit caps the batch",
            S(scheduled={"a": NOW - 3, "b": NOW - 2, "c": NOW - 1}, tasks={i: T() for i in "abc"}),
            claim_op(limit=2),
            (
                NOW,
                NOW - 1,
                NOW + LEASE,
                [("a", T(a=1, t=1, d=NOW - 3)), ("b", T(a=1, t=2, d=NOW - 2))],
            ),
            S(
                scheduled={"c": NOW - 1},
                active={"a": NOW + LEASE, "b": NOW + LEASE},
                tasks={"a": T(a=1, t=1, d=NOW - 3), "b": T(a=1, t=2, d=NOW - 2), "c": T()},
                stats={"claim_seq": 2},
            ),
        ),
        Case(
            "attempt counts up and the token continues the queue's claim sequence",
            S(
                scheduled={"a": NOW - 1},
                tasks={"a": T(a=2, m=5, t=17, d=NOW - 9_000)},
                errors={"a": "boom"},
                stats={"claim_seq": 41},
            ),
            claim_op(),
            (NOW, None, NOW + LEASE, [("a", T(a=3, m=5, t=42, d=NOW - 1))]),
            S(
                active={"a": NOW + LEASE},
                tasks={"a": T(a=3, m=5, t=42, d=NOW - 1)},
                errors={"a": "boom"},
                stats={"claim_seq": 42},
            ),
        ),
        Case(
            "an expired lease is reaped first and re-claimed in the same call, attempt counted",
            S(
                scheduled={"y": NOW - 100},
                active={"x": NOW - 1},
                tasks={"x": T(a=1, t=5, d=NOW - LEASE - 1), "y": T()},
            ),
            claim_op(),
            (NOW, None, NOW + LEASE, [("y", T(a=1, t=1, d=NOW - 100)), ("x", T(a=2, t=2, d=NOW))]),
            S(
                active={"x": NOW + LEASE, "y": NOW + LEASE},
                tasks={"x": T(a=2, t=2, d=NOW), "y": T(a=1, t=1, d=NOW - 100)},
                errors={"x": reaped(1)},
                stats={"leases_expired": 1, "claim_seq": 2},
            ),
        ),
        Case(
            "a lease ending exactly now is reaped (limit 0 only reaps)",
            S(active={"x": NOW}, tasks={"x": LEASED}),
            claim_op(limit=0),
            (NOW, NOW, None, []),
            S(
                scheduled={"x": NOW},
                tasks={"x": LEASED},
                errors={"x": reaped(1)},
                stats={"leases_expired": 1},
            ),
        ),
        Case(
            "a lease still running is not reaped",
            S(active={"x": NOW + 1}, tasks={"x": LEASED}),
            claim_op(),
            (NOW, None, NOW + 1, []),
        ),
        Case(
            "reaping a task whose attempts are spent (m>0, a>=m) buries it",
            S(active={"x": NOW - 1}, tasks={"x": T(a=2, m=2, t=5, d=NOW - 40_000)}),
            claim_op(),
            (NOW, None, None, []),
            S(
                dead={"x": NOW},
                tasks={"x": T(a=2, m=2, t=5, d=NOW - 40_000)},
                errors={"x": reaped(2, dead=True)},
                stats={"dead": 1, "leases_expired": 1},
            ),
        ),
        Case(
            "reaping a task with attempts left (a<m) re-claims it for its last attempt",
            S(active={"x": NOW - 1}, tasks={"x": T(a=1, m=2, t=5, d=NOW - 40_000)}),
            claim_op(),
            (NOW, None, NOW + LEASE, [("x", T(a=2, m=2, t=1, d=NOW))]),
            S(
                active={"x": NOW + LEASE},
                tasks={"x": T(a=2, m=2, t=1, d=NOW)},
                errors={"x": reaped(1)},
                stats={"leases_expired": 1, "claim_seq": 1},
            ),
        ),
        Case(
            "reap_limit caps how many expired leases one claim reaps",
            S(active={"x": NOW - 2, "y": NOW - 1}, tasks={"x": LEASED, "y": LEASED}),
            claim_op(limit=0, reap_limit=1),
            (NOW, NOW, NOW - 1, []),
            S(
                scheduled={"x": NOW},
                active={"y": NOW - 1},
                tasks={"x": LEASED, "y": LEASED},
                errors={"x": reaped(1)},
                stats={"leases_expired": 1},
            ),
        ),
        Case(
            "undecodable records go to dead with a reason and the rest is still claimed",
            S(
                scheduled={"nohead": NOW - 2, "nokind": NOW - 1, "good": NOW},
                tasks={
                    "nohead": b"junk without a header line",
                    "nokind": b'{"a":1}\n{}',
                    "good": T(),
                },
            ),
            claim_op(),
            (NOW, None, NOW + LEASE, [("good", T(a=1, t=1, d=NOW))]),
            S(
                active={"good": NOW + LEASE},
                dead={"nohead": NOW, "nokind": NOW},
                tasks={
                    "nohead": b"junk without a header line",
                    "nokind": b'{"a":1}\n{}',
                    "good": T(a=1, t=1, d=NOW),
                },
                errors={"nohead": UNDECODABLE, "nokind": UNDECODABLE},
                stats={"dead": 2, "claim_seq": 3},
            ),
        ),
        Case(
            "a non-ASCII kind survives claim's header decoding",
            S(scheduled={"a": NOW}, tasks={"a": T(kind="commande.créée/✓😀")}),
            claim_op(),
            (NOW, None, NOW + LEASE, [("a", T(kind="commande.créée/✓😀", a=1, t=1, d=NOW))]),
            S(
                active={"a": NOW + LEASE},
                tasks={"a": T(kind="commande.créée/✓😀", a=1, t=1, d=NOW)},
                stats={"claim_seq": 1},
            ),
        ),
    ),
)
def test_claim_leases_due_tasks_after_reaping_expired_ones(queue: Queue, case: Case) -> None:
    check(queue, case)


def test_claim_tokens_increase_across_calls(queue: Queue) -> None:
    """Fencing needs every token ever handed out to be new, also across claims."""
    r, k, run = queue.client, queue.core.keys, SyncRunner(queue.client).run
    seed(r, k, S(scheduled={"a": NOW, "b": NOW + 1, "c": NOW + 2}, tasks={i: T() for i in "abc"}))
    tokens = [
        t.token
        for ms in (NOW, NOW + 1, NOW + 2)
        for t in run(claim(queue.core, limit=1, lease_ms=LEASE, now_ms=ms)).tasks
    ]
    assert tokens == [1, 2, 3]


# Headers Lua's cjson decodes, with a number no reply can carry (not finite).
CREATED_INF = pytest.param(b'{"k":"job","m":0,"c":1e999}\n{}', id="created-1e999")
MAX_NAN = pytest.param(b'{"k":"job","m":"nan"}\n{}', id="max-attempts-nan")
# An integer no double holds exactly: written back with %d it would not read again.
MAX_HUGE = pytest.param(b'{"k":"job","m":100000000000000000}\n{}', id="max-attempts-1e17")


@pytest.mark.parametrize("record", [CREATED_INF, MAX_NAN, MAX_HUGE])
def test_claim_buries_a_header_with_a_number_out_of_range_and_loses_nothing(
    queue: Queue, record: bytes
) -> None:
    r, k = queue.client, queue.core.keys
    seed(r, k, S(scheduled={"bad": NOW - 1, "good": NOW}, tasks={"bad": record, "good": T()}))
    result = SyncRunner(r).run(claim(queue.core, limit=10, lease_ms=LEASE, now_ms=NOW))
    assert [t.id for t in result.tasks] == ["good"]
    after = read_state(r, k)
    assert after.dead == {"bad": NOW} and "bad" in after.errors
    assert after.active == {"good": NOW + LEASE}


def test_claim_decodes_each_header_right_when_tasks_share_their_fields(queue: Queue) -> None:
    """claim decodes the fields before "c" once per call (dq_split_cached): tasks of other
    kinds, limits and formats, and headers in another order, still read as written."""
    r, k = queue.client, queue.core.keys
    records = {
        "a": encode_record("job", b"1", max_attempts=0, created_ms=5, fmt="json"),
        "b": encode_record("job", b"2", max_attempts=0, created_ms=6, fmt="json"),
        "c": encode_record("job", b"3", max_attempts=3, created_ms=7, fmt="json"),
        "d": encode_record("other", b"4", max_attempts=0, created_ms=8, fmt="msgpack"),
        "e": b'{"c":9,"m":2,"k":"job"}\n5',  # another writer's order
        "f": b'{"k":"job","c":' + b"9" * 400 + b"}\n6",  # created beyond any double
    }
    seed(r, k, S(scheduled={i: NOW for i in records}, tasks=dict(records)))
    got = SyncRunner(r).run(claim(queue.core, limit=10, lease_ms=LEASE, now_ms=NOW)).tasks
    seen = {
        t.id: (t.header.kind, t.header.max_attempts, t.header.fmt, t.header.created_ms, t.payload)
        for t in got
    }
    assert seen == {
        "a": ("job", 0, "json", 5, b"1"),
        "b": ("job", 0, "json", 6, b"2"),
        "c": ("job", 3, "json", 7, b"3"),
        "d": ("other", 0, "msgpack", 8, b"4"),
        "e": ("job", 2, "json", 9, b"5"),
    }
    assert read_state(r, k).dead == {"f": NOW}  # not a number a reply can carry: buried


# -- ack ---------------------------------------------------------------------------------


def ack_op(
    *leases: tuple[str, int],
    discarded: bool = False,
    trim_limit: int = 20,
    core: Callable[[QueueCore], QueueCore] = lambda c: c,
) -> Build:
    return lambda c: ack(
        core(c), list(leases), discarded=discarded, trim_limit=trim_limit, now_ms=NOW
    )


OLD_DONE = S(  # finished records around the trim edge, plus a leased task to ack
    done={"o1": NOW - DEDUPE - 5, "o2": NOW - DEDUPE, "o3": NOW - DEDUPE + 1},
    active={"a": NOW + 1_000},
    tasks={"o1": LEASED, "o2": LEASED, "o3": LEASED, "a": LEASED},
    errors={"o1": "flaky"},
)
# A done task's tombstone: attempt 1, its last run due 5,000 ms before it finished, and its
# kind's code on the shard, 1 (lib/tombstone.lua); its attempts entry and error are gone.
TOMB = b"1 5000 1"
ACKED = S(done={"a": NOW}, tasks={"a": TOMB}, stats={"succeeded": 1})


def keeping_records(c: QueueCore) -> QueueCore:
    """The same queue shard, keeping whole records of finished tasks."""
    return QueueCore(c.name, prefix=c.keys.prefix, dedupe_window=3600, keep_finished="record")


@pytest.mark.parametrize(
    "case",
    table(
        Case(
            "the right token moves the task to done at now and counts succeeded",
            ACTIVE,
            ack_op(("a", 7)),
            [],
            ACKED,
        ),
        Case(
            "discarded=True counts discarded instead",
            ACTIVE,
            ack_op(("a", 7), discarded=True),
            [],
            S(done={"a": NOW}, tasks={"a": TOMB}, stats={"discarded": 1}),
        ),
        Case(
            "keep_finished='record' keeps the whole record, its attempts entry and error",
            dc_replace(ACTIVE, errors={"a": "flaky"}),
            ack_op(("a", 7), core=keeping_records),
            [],
            S(done={"a": NOW}, tasks={"a": LEASED}, errors={"a": "flaky"}, stats={"succeeded": 1}),
        ),
        Case(
            "the tombstone keeps the last error of an earlier attempt, as trim will drop it",
            dc_replace(ACTIVE, errors={"a": "flaky"}),
            ack_op(("a", 7)),
            [],
            dc_replace(ACKED, errors={"a": "flaky"}),
        ),
        Case("a wrong token is refused and nothing changes", ACTIVE, ack_op(("a", 8)), ["a"]),
        Case(
            "an expired lease is refused even before it is reaped",
            S(active={"a": NOW - 1}, tasks={"a": LEASED}),
            ack_op(("a", 7)),
            ["a"],
        ),
        Case(
            "a lease ending exactly now still acks",
            S(active={"a": NOW}, tasks={"a": LEASED}),
            ack_op(("a", 7)),
            [],
            ACKED,
        ),
        Case(
            "a waiting task is refused even with its last token", WAITING, ack_op(("a", 7)), ["a"]
        ),
        Case("an unknown id is refused", S(), ack_op(("nope", 1)), ["nope"]),
        Case(
            "dedupe window 0 deletes the record and its last error",
            dc_replace(ACTIVE, errors={"a": "flaky"}),
            ack_op(("a", 7), core=no_dedupe),
            [],
            S(stats={"succeeded": 1}),
        ),
        Case(
            "done records at or past the window are trimmed with their errors",
            OLD_DONE,
            ack_op(("a", 7)),
            [],
            S(
                done={"o3": NOW - DEDUPE + 1, "a": NOW},
                tasks={"o3": LEASED, "a": TOMB},
                stats={"succeeded": 1},
            ),
        ),
        Case(
            "trim_limit caps the trimming, oldest first",
            OLD_DONE,
            ack_op(("a", 7), trim_limit=1),
            [],
            S(
                done={"o2": NOW - DEDUPE, "o3": NOW - DEDUPE + 1, "a": NOW},
                tasks={"o2": LEASED, "o3": LEASED, "a": TOMB},
                stats={"succeeded": 1},
            ),
        ),
        Case(
            "a refused ack still trims old done records",
            OLD_DONE,
            ack_op(("a", 99)),
            ["a"],
            S(
                done={"o3": NOW - DEDUPE + 1},
                active={"a": NOW + 1_000},
                tasks={"o3": LEASED, "a": LEASED},
            ),
        ),
        Case(
            "a batch acks the held lease and refuses the stale one",
            S(
                active={"a": NOW + 1_000, "b": NOW + 1_000},
                tasks={"a": LEASED, "b": dc_replace(LEASED, t=8)},
            ),
            ack_op(("a", 7), ("b", 7)),
            ["b"],
            S(
                done={"a": NOW},
                active={"b": NOW + 1_000},
                tasks={"a": TOMB, "b": dc_replace(LEASED, t=8)},
                stats={"succeeded": 1},
            ),
        ),
    ),
)
def test_ack_finishes_only_held_leases_and_trims_done(queue: Queue, case: Case) -> None:
    check(queue, case)


# -- retry, bury, release, extend --------------------------------------------------------


def retry_op(*items: tuple[str, int, str, str]) -> Build:
    return lambda c: retry(c, list(items), now_ms=NOW)


@pytest.mark.parametrize(
    "case",
    table(
        Case(
            "relative due: scheduled at now+delay with the error, header untouched",
            ACTIVE,
            retry_op(("a", 7, "+2000", "boom")),
            [],
            S(
                scheduled={"a": NOW + 2_000},
                tasks={"a": LEASED},
                errors={"a": "boom"},
                stats={"retried": 1},
            ),
        ),
        Case(
            "absolute due is taken as given",
            ACTIVE,
            retry_op(("a", 7, str(NOW + 9_999), "boom")),
            [],
            S(
                scheduled={"a": NOW + 9_999},
                tasks={"a": LEASED},
                errors={"a": "boom"},
                stats={"retried": 1},
            ),
        ),
        Case(
            "the new error replaces the previous one",
            dc_replace(ACTIVE, errors={"a": "first"}),
            retry_op(("a", 7, "+0", "second")),
            [],
            S(
                scheduled={"a": NOW},
                tasks={"a": LEASED},
                errors={"a": "second"},
                stats={"retried": 1},
            ),
        ),
        Case(
            "an error longer than 8192 characters is cut with an ellipsis",
            ACTIVE,
            retry_op(("a", 7, "+0", "x" * 9_000)),
            [],
            S(
                scheduled={"a": NOW},
                tasks={"a": LEASED},
                errors={"a": "x" * 8_192 + "..."},
                stats={"retried": 1},
            ),
        ),
        Case("a wrong token is refused", ACTIVE, retry_op(("a", 6, "+0", "boom")), ["a"]),
        Case(
            "an expired lease is refused",
            S(active={"a": NOW - 1}, tasks={"a": LEASED}),
            retry_op(("a", 7, "+0", "boom")),
            ["a"],
        ),
    ),
)
def test_retry_reschedules_held_tasks_with_their_error(queue: Queue, case: Case) -> None:
    check(queue, case)


def bury_op(*items: tuple[str, int, str]) -> Build:
    return lambda c: bury(c, list(items), now_ms=NOW)


@pytest.mark.parametrize(
    "case",
    table(
        Case(
            "the right token moves the task to dead at now with the reason, record kept",
            ACTIVE,
            bury_op(("a", 7, "fatal: bad input")),
            [],
            S(
                dead={"a": NOW},
                tasks={"a": LEASED},
                errors={"a": "fatal: bad input"},
                stats={"dead": 1},
            ),
        ),
        Case("a wrong token is refused", ACTIVE, bury_op(("a", 8, "fatal")), ["a"]),
        Case(
            "an expired lease is refused",
            S(active={"a": NOW - 1}, tasks={"a": LEASED}),
            bury_op(("a", 7, "fatal")),
            ["a"],
        ),
    ),
)
def test_bury_moves_held_tasks_to_dead_with_reason(queue: Queue, case: Case) -> None:
    check(queue, case)


def release_op(*leases: tuple[str, int]) -> Build:
    return lambda c: release(c, list(leases), now_ms=NOW)


@pytest.mark.parametrize(
    "case",
    table(
        Case(
            "the attempt is given back and the task keeps its due time",
            S(active={"a": NOW + 1_000}, tasks={"a": T(a=2, t=7, d=NOW - 5_000)}),
            release_op(("a", 7)),
            [],
            S(
                scheduled={"a": NOW - 5_000},
                tasks={"a": T(a=1, t=7, d=NOW - 5_000)},
                stats={"released": 1},
            ),
        ),
        Case(
            "the attempt count never goes below zero",
            S(active={"a": NOW + 1_000}, tasks={"a": T(a=0, t=7, d=NOW - 5_000)}),
            release_op(("a", 7)),
            [],
            S(
                scheduled={"a": NOW - 5_000},
                tasks={"a": T(a=0, t=7, d=NOW - 5_000)},
                stats={"released": 1},
            ),
        ),
        Case(
            "a record without a due time is due now",
            S(active={"a": NOW + 1_000}, tasks={"a": T(a=1, t=7)}),
            release_op(("a", 7)),
            [],
            S(scheduled={"a": NOW}, tasks={"a": T(a=0, t=7)}, stats={"released": 1}),
        ),
        Case("a wrong token is refused", ACTIVE, release_op(("a", 8)), ["a"]),
    ),
)
def test_release_returns_held_tasks_unrun(queue: Queue, case: Case) -> None:
    check(queue, case)


def handback_op(*items: tuple[str, int, str]) -> Build:
    return lambda c: handback(
        c, list(items), grace_ms=60_000, first_ms=1_000, most_ms=10_000, now_ms=NOW
    )


def since(ms: int) -> str:
    return f"unknown kind since {ms}: no handler"


@pytest.mark.parametrize(
    "case",
    table(
        Case(
            "first met: handed back, attempt given back, waits as long as it was due, since kept",
            S(active={"a": NOW + 1_000}, tasks={"a": T(a=1, t=7, d=NOW - 5_000)}),
            handback_op(("a", 7, "no handler")),
            [("a", 1, 5_000)],
            S(
                scheduled={"a": NOW + 5_000},
                tasks={"a": T(a=0, t=7, d=NOW - 5_000)},
                errors={"a": since(NOW - 5_000)},
                stats={"unknown_kind": 1},
            ),
        ),
        Case(
            "met again: since is the first time's, not this claim's due; the wait is capped",
            S(
                active={"a": NOW + 1_000},
                tasks={"a": T(a=1, t=7, d=NOW - 1_000)},
                errors={"a": since(NOW - 50_000)},
            ),
            handback_op(("a", 7, "no handler")),
            [("a", 1, 50_000)],
            S(
                scheduled={"a": NOW + 10_000},
                tasks={"a": T(a=0, t=7, d=NOW - 1_000)},
                errors={"a": since(NOW - 50_000)},
                stats={"unknown_kind": 1},
            ),
        ),
        Case(
            "just due: the first wait is first_ms",
            S(active={"a": NOW + 1_000}, tasks={"a": T(a=1, t=7, d=NOW)}),
            handback_op(("a", 7, "no handler")),
            [("a", 1, 0)],
            S(
                scheduled={"a": NOW + 1_000},
                tasks={"a": T(a=0, t=7, d=NOW)},
                errors={"a": since(NOW)},
                stats={"unknown_kind": 1},
            ),
        ),
        Case(
            "an earlier error of another kind (a retry) is not a since: this claim's due is",
            S(
                active={"a": NOW + 1_000},
                tasks={"a": T(a=2, t=7, d=NOW - 2_000)},
                errors={"a": "boom"},
            ),
            handback_op(("a", 7, "no handler")),
            [("a", 1, 2_000)],
            S(
                scheduled={"a": NOW + 2_000},
                tasks={"a": T(a=1, t=7, d=NOW - 2_000)},
                errors={"a": since(NOW - 2_000)},
                stats={"unknown_kind": 1},
            ),
        ),
        Case(
            "the grace over: buried with the reason, no attempt counted",
            S(
                active={"a": NOW + 1_000},
                tasks={"a": T(a=1, t=7, d=NOW - 1_000)},
                errors={"a": since(NOW - 60_000)},
            ),
            handback_op(("a", 7, "no handler")),
            [("a", 2, 60_000)],
            S(
                dead={"a": NOW},
                tasks={"a": T(a=0, t=7, d=NOW - 1_000)},
                errors={
                    "a": "no handler; handed back for 60 s since it fell due, and "
                    "unknown_kind_grace is 60 s"
                },
                stats={"dead": 1},
            ),
        ),
        Case(
            "a due time before 1970 (another program's) is long due: buried at once",
            S(active={"a": NOW + 1_000}, tasks={"a": T(a=1, t=7, d=-5_000)}),
            handback_op(("a", 7, "no handler")),
            [("a", 2, NOW)],
            S(
                dead={"a": NOW},
                tasks={"a": T(a=0, t=7, d=-5_000)},
                errors={
                    "a": f"no handler; handed back for {NOW // 1000} s since it fell due, and "
                    "unknown_kind_grace is 60 s"
                },
                stats={"dead": 1},
            ),
        ),
        Case(
            "a wrong token is refused, nothing changes",
            ACTIVE,
            handback_op(("a", 8, "no handler")),
            [("a", 0, 0)],
        ),
    ),
)
def test_handback_returns_tasks_of_unknown_kinds_until_their_grace_ends(
    queue: Queue, case: Case
) -> None:
    check(queue, case)


@pytest.mark.parametrize(
    "case",
    table(
        Case(
            "only held leases move to now+lease; stale, expired and waiting ones are lost",
            S(
                scheduled={"d": NOW - 1},
                active={"a": NOW + 1_000, "b": NOW + 1_000, "c": NOW - 1},
                tasks={
                    "a": LEASED,
                    "b": dc_replace(LEASED, t=8),
                    "c": dc_replace(LEASED, t=9),
                    "d": dc_replace(LEASED, t=10),
                },
            ),
            lambda c: extend(
                c, [("a", 7), ("b", 99), ("c", 9), ("d", 10)], lease_ms=5_000, now_ms=NOW
            ),
            ["b", "c", "d"],
            S(
                scheduled={"d": NOW - 1},
                active={"a": NOW + 5_000, "b": NOW + 1_000, "c": NOW - 1},
                tasks={
                    "a": LEASED,
                    "b": dc_replace(LEASED, t=8),
                    "c": dc_replace(LEASED, t=9),
                    "d": dc_replace(LEASED, t=10),
                },
            ),
        ),
    ),
)
def test_extend_pushes_only_held_leases(queue: Queue, case: Case) -> None:
    check(queue, case)


# -- cancel, reschedule ------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    table(
        Case(
            "a waiting task is removed with its record and last error",
            dc_replace(WAITING, errors={"a": "flaky"}),
            lambda c: c.cancel("a"),
            True,
            S(stats={"cancelled": 1}),
        ),
        Case("an active task is left running", ACTIVE, lambda c: c.cancel("a"), False),
        Case("a done task is left done", done_at(NOW - 1), lambda c: c.cancel("a"), False),
        Case("a dead task is left dead", DEAD, lambda c: c.cancel("a"), False),
        Case("an unknown id changes nothing", S(), lambda c: c.cancel("a"), False),
    ),
)
def test_cancel_removes_only_waiting_tasks(queue: Queue, case: Case) -> None:
    check(queue, case)


def resched(delay: float | None = None, at_ms: int | None = None) -> Build:
    at = None if at_ms is None else at_ms / 1000
    return lambda c: c.reschedule("a", delay=delay, at=at, now_ms=NOW)


@pytest.mark.parametrize(
    "case",
    table(
        Case(
            "a waiting task moves to now+delay, record untouched",
            WAITING,
            resched(delay=5),
            True,
            dc_replace(WAITING, scheduled={"a": NOW + 5_000}),
        ),
        Case(
            "a waiting task moves to an absolute time",
            WAITING,
            resched(at_ms=NOW - 20),
            True,
            dc_replace(WAITING, scheduled={"a": NOW - 20}),
        ),
        Case("an active task is not moved", ACTIVE, resched(delay=5), False),
        Case("a done task is not moved", done_at(NOW - 1), resched(delay=5), False),
        Case("a dead task is not moved", DEAD, resched(delay=5), False),
        Case("an unknown id is not created", S(), resched(delay=5), False),
    ),
)
def test_reschedule_moves_only_waiting_tasks(queue: Queue, case: Case) -> None:
    check(queue, case)


def resched_due(delay: float | None = None, at_ms: float | None = None) -> Build:
    at = None if at_ms is None else at_ms / 1000
    return lambda c: c.reschedule_due("a", delay=delay, at=at, now_ms=NOW)


@pytest.mark.parametrize(
    "case",
    table(
        Case(
            "a waiting task moved answers the due it stored, now+delay",
            WAITING,
            resched_due(delay=5),
            NOW + 5_000,
            dc_replace(WAITING, scheduled={"a": NOW + 5_000}),
        ),
        Case(
            "a waiting task moved to an absolute time answers that time",
            WAITING,
            resched_due(at_ms=NOW - 20),
            NOW - 20,
            dc_replace(WAITING, scheduled={"a": NOW - 20}),
        ),
        Case("an active task is not moved: no due", ACTIVE, resched_due(delay=5), None),
        Case("an unknown id is not created: no due", S(), resched_due(delay=5), None),
    ),
)
def test_reschedule_with_reply_now_answers_the_stored_due(queue: Queue, case: Case) -> None:
    """reply "now" (protocol 1.1): {moved, now}, from which the stored due follows exactly."""
    check(queue, case)


def test_reschedule_without_reply_answers_moved_alone_as_in_1_0(queue: Queue) -> None:
    """A 1.0 caller sends four arguments: the reply is the bare 1 or 0 it always was."""
    seed(queue.client, queue.core.keys, WAITING)
    op = queue.core.reschedule("a", delay=5, now_ms=NOW)
    script = op.script
    assert script.arg_names[-1] == "reply"
    r = queue.client
    assert r.eval(script.source, len(op.keys), *op.keys, *op.args[:-1]) == 1
    assert r.eval(script.source, len(op.keys), *op.keys, *op.args[:-1]) == 1
    r.zrem(queue.core.keys.scheduled, "a")
    assert r.eval(script.source, len(op.keys), *op.keys, *op.args[:-1]) == 0


# -- dead set: replay, purge -------------------------------------------------------------

SPENT = T(a=3, m=3, t=9, d=NOW - 9_000)
THREE_DEAD = S(
    dead={"a": NOW - 300, "b": NOW - 200, "c": NOW - 100},
    tasks={i: SPENT for i in "abc"},
    errors={i: "fatal" for i in "abc"},
)


@pytest.mark.parametrize(
    "case",
    table(
        Case(
            "a dead task is due now with attempts reset, reason kept",
            S(dead={"a": NOW - 100}, tasks={"a": SPENT}, errors={"a": "fatal"}),
            lambda c: c.replay(["a"], now_ms=NOW),
            1,
            S(
                scheduled={"a": NOW},
                tasks={"a": dc_replace(SPENT, a=0)},
                errors={"a": "fatal"},
                stats={"replayed": 1},
            ),
        ),
        Case(
            "ids that are not dead are ignored",
            S(scheduled={"w": NOW + 5}, active={"r": NOW + 5}, tasks={"w": T(), "r": LEASED}),
            lambda c: c.replay(["w", "r", "nope"], now_ms=NOW),
            0,
        ),
        Case(
            "without ids the oldest dead tasks are replayed, up to limit",
            THREE_DEAD,
            lambda c: c.replay(limit=2, now_ms=NOW),
            2,
            S(
                scheduled={"a": NOW, "b": NOW},
                dead={"c": NOW - 100},
                tasks={"a": dc_replace(SPENT, a=0), "b": dc_replace(SPENT, a=0), "c": SPENT},
                errors={i: "fatal" for i in "abc"},
                stats={"replayed": 2},
            ),
        ),
        Case(
            "an undecodable record stays dead, untouched, rather than be lost",
            S(dead={"bad": NOW - 100}, tasks={"bad": b"junk"}, errors={"bad": UNDECODABLE}),
            lambda c: c.replay(["bad"], now_ms=NOW),
            0,
            S(dead={"bad": NOW - 100}, tasks={"bad": b"junk"}, errors={"bad": UNDECODABLE}),
        ),
    ),
)
def test_replay_reschedules_dead_tasks_with_fresh_attempts(queue: Queue, case: Case) -> None:
    check(queue, case)


@pytest.mark.parametrize("record", [CREATED_INF, MAX_NAN])  # replay sets "a" itself
def test_replay_never_loses_a_dead_task_it_cannot_read(queue: Queue, record: bytes) -> None:
    r, k = queue.client, queue.core.keys
    seed(r, k, S(dead={"bad": NOW - 100}, tasks={"bad": record}))
    SyncRunner(r).run(queue.core.replay(["bad"], now_ms=NOW))
    after = read_state(r, k)
    assert sum("bad" in getattr(after, state) for state in STATES) == 1


@pytest.mark.parametrize(
    "case",
    table(
        Case(
            "by ids: only dead ones are deleted, with record and reason",
            dc_replace(THREE_DEAD, scheduled={"w": NOW}, tasks={**THREE_DEAD.tasks, "w": T()}),
            lambda c: c.purge_dead(["a", "w", "nope"]),
            1,
            S(
                scheduled={"w": NOW},
                dead={"b": NOW - 200, "c": NOW - 100},
                tasks={"b": SPENT, "c": SPENT, "w": T()},
                errors={"b": "fatal", "c": "fatal"},
            ),
        ),
        Case(
            "by before_ms: only tasks that died strictly before it",
            THREE_DEAD,
            lambda c: c.purge_dead(before_ms=NOW - 200),
            1,
            S(
                dead={"b": NOW - 200, "c": NOW - 100},
                tasks={"b": SPENT, "c": SPENT},
                errors={"b": "fatal", "c": "fatal"},
            ),
        ),
        Case(
            "with neither: the oldest, up to limit",
            THREE_DEAD,
            lambda c: c.purge_dead(limit=2),
            2,
            S(dead={"c": NOW - 100}, tasks={"c": SPENT}, errors={"c": "fatal"}),
        ),
    ),
)
def test_purge_deletes_dead_tasks_for_good(queue: Queue, case: Case) -> None:
    check(queue, case)


# -- reap, and the read-only scripts -----------------------------------------------------


@pytest.mark.parametrize(
    "case",
    table(
        Case(
            "expired leases go back to scheduled at now; live ones stay",
            S(
                active={"x": NOW - 1, "y": NOW + 1},
                tasks={"x": LEASED, "y": dc_replace(LEASED, t=8)},
            ),
            lambda c: c.reap(now_ms=NOW),
            1,
            S(
                scheduled={"x": NOW},
                active={"y": NOW + 1},
                tasks={"x": LEASED, "y": dc_replace(LEASED, t=8)},
                errors={"x": reaped(1)},
                stats={"leases_expired": 1},
            ),
        ),
        Case(
            "an expired lease with no attempts left goes to dead",
            S(active={"x": NOW - 1}, tasks={"x": SPENT}),
            lambda c: c.reap(now_ms=NOW),
            1,
            S(
                dead={"x": NOW},
                tasks={"x": SPENT},
                errors={"x": reaped(3, dead=True)},
                stats={"dead": 1, "leases_expired": 1},
            ),
        ),
    ),
)
def test_reap_returns_expired_leases(queue: Queue, case: Case) -> None:
    check(queue, case)


MIXED = S(
    scheduled={"w": NOW + 1_000, "late": NOW - 4_000},
    active={"r": NOW + LEASE},
    done={"f": NOW - 10},
    dead={"x": NOW - 20, "y": NOW - 30},
    tasks={"w": T(), "late": T(), "r": LEASED, "f": LEASED, "x": SPENT, "y": b"junk"},
    errors={"x": "fatal", "y": UNDECODABLE},
    stats={"succeeded": 4, "claim_seq": 9},
)


def when(ms: int) -> Any:
    return ms_to_datetime(ms)


@pytest.mark.parametrize(
    ("task_id", "want"),
    [
        ("w", ("scheduled", when(NOW + 1_000), None, None, 0, None)),
        ("r", ("active", when(NOW - 5_000), when(NOW + LEASE), None, 1, None)),
        ("f", ("done", when(NOW - 5_000), None, when(NOW - 10), 1, None)),
        ("x", ("dead", when(NOW - 9_000), None, when(NOW - 20), 3, "fatal")),
        ("nope", None),
    ],
)
def test_get_reports_state_times_and_error_without_changing_anything(
    queue: Queue, task_id: str, want: Any
) -> None:
    r, k = queue.client, queue.core.keys
    seed(r, k, MIXED)
    info = SyncRunner(r).run(queue.core.get(task_id))
    got = info and (
        info.state,
        info.due_at,
        info.lease_deadline,
        info.finished_at,
        info.attempts,
        info.last_error,
    )
    assert got == want
    assert read_state(r, k) == MIXED


def test_stats_counts_states_and_hides_the_claim_sequence(queue: Queue) -> None:
    r, k = queue.client, queue.core.keys
    seed(r, k, MIXED)
    s = SyncRunner(r).run(queue.core.stats(now_ms=NOW))
    assert (s.scheduled, s.due, s.active, s.dead, s.done) == (2, 1, 1, 2, 1)
    assert s.next_due_at == when(NOW - 4_000) and s.oldest_due_age == 4.0
    assert s.next_lease_deadline == when(NOW + LEASE) and s.now == when(NOW)
    assert s.counters == {"succeeded": 4}
    assert read_state(r, k) == MIXED


def test_dead_pages_newest_first_and_shows_undecodable_records(queue: Queue) -> None:
    r, k = queue.client, queue.core.keys
    seed(r, k, MIXED)
    run = SyncRunner(r).run
    page = run(queue.core.dead(0, 10))
    assert [(i.id, i.kind, i.state, i.last_error) for i in page] == [
        ("x", "job", "dead", "fatal"),
        ("y", "?", "dead", UNDECODABLE),
    ]
    assert page[0].finished_at == when(NOW - 20)
    assert [i.id for i in run(queue.core.dead(1, 1))] == ["y"]
    assert read_state(r, k) == MIXED


def test_dead_shows_when_an_undecodable_task_died(queue: Queue) -> None:
    seed(queue.client, queue.core.keys, MIXED)
    page = SyncRunner(queue.client).run(queue.core.dead(1, 1))
    assert [(i.id, i.finished_at) for i in page] == [("y", when(NOW - 30))]


def test_a_new_task_never_inherits_an_attempt_state_left_behind(queue: Queue) -> None:
    """Scripts of earlier versions delete records but know no attempts hash, so an entry can
    outlive its record: a task created with that id again starts from no attempts."""
    r, k = queue.client, queue.core.keys
    r.hset(k.attempts, "a", b"7 3 1")  # an orphan
    SyncRunner(r).run(statuses(queue.core.schedule([spec("a", m=3, delay=0)], now_ms=NOW)))
    assert r.hexists(k.attempts, "a") == 0
    (held,) = SyncRunner(r).run(claim(queue.core, limit=1, lease_ms=LEASE, now_ms=NOW)).tasks
    assert held.header.attempts == 1


def test_claims_leave_the_record_as_it_was_written(queue: Queue) -> None:
    """A claim writes the attempt state apart (the attempts hash): the record, payload and
    all, is written once by the producer and never again."""
    r, k = queue.client, queue.core.keys
    seed(r, k, S(scheduled={"a": NOW}, tasks={"a": T()}))
    before = r.hget(k.tasks, "a")
    run = SyncRunner(r)
    (held,) = run.run(claim(queue.core, limit=1, lease_ms=LEASE, now_ms=NOW)).tasks
    assert run.run(retry(queue.core, [("a", held.token, str(NOW), "flaky")], now_ms=NOW)) == []
    run.run(claim(queue.core, limit=1, lease_ms=LEASE, now_ms=NOW))
    assert r.hget(k.tasks, "a") == before
    assert r.hget(k.attempts, "a") == f"{held.token + 1} 2 {NOW}".encode()


# -- script headers against the code -----------------------------------------------------


def every_builder_once(core: QueueCore) -> list[Op[Any]]:
    """One call of every builder; building it checks its args against the script header."""
    return [
        core.schedule([TaskSpec("job", task_id="a")], now_ms=NOW),
        core.schedule_new(TaskSpec("job"), "n", now_ms=NOW),
        claim(core, limit=1, lease_ms=LEASE, now_ms=NOW),
        ack(core, [("a", 1)], now_ms=NOW),
        retry(core, [("a", 1, "+1", "e")], now_ms=NOW),
        bury(core, [("a", 1, "r")], now_ms=NOW),
        release(core, [("a", 1)], now_ms=NOW),
        handback(core, [("a", 1, "r")], grace_ms=1, first_ms=1, most_ms=1, now_ms=NOW),
        extend(core, [("a", 1)], lease_ms=LEASE, now_ms=NOW),
        core.reap(now_ms=NOW),
        core.shard_count(1),
        update_op(core, Given(max_payload=1000)),
        core.cancel("a"),
        core.abort("a", now_ms=NOW),
        core.reschedule("a", delay=1, now_ms=NOW),
        core.reschedule_due("a", delay=1, now_ms=NOW),
        core.replay(["a"], now_ms=NOW),
        core.purge_dead(before_ms=NOW),
        core.get("a"),
        wait_op(core, "a", 1000),
        core.stats(now_ms=NOW),
        core.dead(),
        core.seek("dead", ("1", "a"), 10),
        core.workers(now_ms=NOW),
        admin.page(core, "scheduled"),
        admin.timeline(core, 60, 10, now_ms=NOW),
        admin.finished(core),
        unregister(core, "w1"),
        expiring.set_op(core, "k", b"1", 5),
        expiring.touch_op(core, "k", 5),
        expiring.delete_op(core, "k"),
        expiring.notice_op(core, "k", foreign=True, now_ms=NOW),
        expiring.confirm_op(core, "k", "x:1:k", 1, now_ms=NOW),
        expiring.delivered_op(core, "k"),
        idempotency.begin_op(core, "k", "0" * 64),
        idempotency.end_op(core, "k", "0" * 64, b""),
        *cron_builders_once(core),
        *reshard_builders_once(core),
        *controls_builders_once(core),
    ]


def controls_builders_once(core: QueueCore) -> list[Op[Any]]:
    from delayq import controls

    return [
        controls.set_limit(core, controls.rate_limit("10/s"), 1, now_ms=NOW),
        controls.set_limit(core, None, 1, now_ms=NOW),
        controls.read(core, now_ms=NOW),
        controls.pause(core, True),
    ]


def reshard_builders_once(core: QueueCore) -> list[Op[Any]]:
    from delayq.admin import reshard
    from delayq.core import SeekRow

    row = SeekRow("a", str(NOW), b'{"k":"job"}\n1', None, None)
    return [
        reshard.mark_op(core, "read"),
        reshard.put_tasks_op(core, "done", [row]),
        reshard.fields_op(core, "read", "cron", ["0", 100]),
    ]


def cron_builders_once(core: QueueCore) -> list[Op[Any]]:
    from delayq.cron import facade as cron_facade
    from delayq.cron import ops as cron_ops
    from delayq.cron.schedules import Decision, every_schedule

    sched = every_schedule("s", 1000)
    return [
        cron_ops.start(core, sched, "cron:s:1000", 1, 1000, Decision(True, 2000), now_ms=NOW),
        cron_ops.outcomes(core, [("s", "cron:s:1000", "succeeded", "")], now_ms=NOW),
        cron_facade.read(core, now_ms=NOW),
        cron_ops.sync(core, [cron_ops.Change("s", b"", None)]),
    ]


def lua_source(path: str) -> str:
    return resources.files("delayq").joinpath("lua", path).read_text(encoding="utf-8")


def lib_key_needs() -> dict[str, set[str]]:
    """For each lib function taking a key table ``k``: the fields it reads, calls included."""
    needs: dict[str, set[str]] = {}
    calls: dict[str, set[str]] = {}
    for lib in resources.files("delayq").joinpath("lua", "lib").iterdir():
        text = lib.read_text(encoding="utf-8")
        for m in re.finditer(r"^local function (\w+)\((.*?)^end$", text, re.M | re.S):
            needs[m.group(1)] = set(re.findall(r"\bk\.(\w+)", m.group(2)))
            calls[m.group(1)] = set(re.findall(r"\b(dq_\w+)\(k\b", m.group(2)))
    for _ in needs:  # close over calls; depth is at most the number of functions
        for fn, callees in calls.items():
            for callee in callees:
                needs[fn] |= needs[callee]
    return needs


def test_every_script_header_matches_queue_keys_builders_and_body(queue: Queue) -> None:
    core = queue.core
    ops = every_builder_once(core)  # raises TypeError on any ARGV-name mismatch
    assert {op.script.name for op in ops} == set(SCRIPTS), "every script has a builder"
    needs = lib_key_needs()
    for name, script in SCRIPTS.items():
        static = [k for k in script.key_names if not k.startswith("*")]
        declared = {k.lstrip("*") for k in script.key_names}  # *name: given per call
        for key in static:
            assert isinstance(getattr(QueueKeys, key, None), Key), (name, key)
        body = lua_source(file_of(name))
        assert set(re.findall(r"\bK\.(\w+)", body)) <= declared, name
        assert set(re.findall(r"\bA\.(\w+)", body)) <= set(script.arg_names), name
        for fn in re.findall(r"\b(dq_\w+)\(K\b", body):
            assert needs[fn] <= declared, (name, fn, needs[fn])
    for op in ops:
        static_keys = [k for k, n in zip(op.keys, op.script.key_names, strict=True) if "*" not in n]
        assert static_keys == [getattr(core.keys, n) for n in op.script.key_names if "*" not in n]
        assert len(op.args) >= len(op.script.arg_names)
        assert all(f"{{{core.name}}}" in key for key in op.keys), "one hash tag per call"
    runner = SyncRunner(queue.client)
    for op in ops:  # each script compiles, accepts the call it is built with, and replies
        raw = runner.run(dc_replace(op, parse=lambda reply: reply))  # as it declares
        assert op.script.reply.matches(raw), (op.script.name, op.script.reply.text, raw)
        op.parse(raw)


def test_keys_and_args_refuses_missing_or_unknown_arguments() -> None:
    script, keys = SCRIPTS["get"], QueueKeys("q")
    args = {"id": "a"}
    assert script.keys_and_args(keys, args) == (
        [
            *(keys.scheduled, keys.active, keys.dead, keys.done, keys.tasks, keys.errors),
            *(keys.attempts, keys.aborted, keys.cancelled, keys.results, keys.kinds),
        ],
        ["a"],
    )
    for bad in ({}, {**args, "extra": 1}):
        with pytest.raises(TypeError):
            script.keys_and_args(keys, bad)
    with pytest.raises(TypeError):
        script.keys_and_args(keys, args, ["variadic"])


@pytest.mark.parametrize(
    "header",
    [
        pytest.param("-- KEYS[2] scheduled\n", id="keys-start-at-2"),
        pytest.param("-- KEYS[1] scheduled\n-- KEYS[3] active\n", id="keys-skip-one"),
        pytest.param("-- KEYS[1] scheduled\n-- KEYS[1] active\n", id="keys-repeat"),
        pytest.param("-- ARGV[2] now\n", id="argv-start-at-2"),
        pytest.param("-- ARGV[1] now\n-- ARGV[1] limit\n", id="argv-repeat"),
        pytest.param(
            "-- ARGV[1] now\n-- ARGV[2...] ids\n-- ARGV[3] late\n", id="argv-after-variadic"
        ),
    ],
)
def test_parse_header_refuses_numbering_out_of_order(header: str) -> None:
    with pytest.raises(ValueError, match="out of order"):
        parse_header("x", header)


def test_parse_header_reads_names_in_order_and_stops_at_the_body() -> None:
    text = (
        "-- x: doc\n-- KEYS[1] scheduled\n-- KEYS[2] tasks\n-- ARGV[1] now  ms\n"
        "-- ARGV[2...] ids  the rest\nlocal x = 1\n-- KEYS[3] late\n"
    )
    assert parse_header("x", text) == (("scheduled", "tasks"), ("now",), "ids")


def test_acks_forget_expired_records_faster_than_they_add_new_ones(queue: Queue) -> None:
    """Under sustained load every ack call adds its batch to the finished set; it must also
    forget more expired records than that, or they pile up past the dedupe window."""
    core, run = queue.core, SyncRunner(queue.client).run
    keys = core.keys
    expired = {f"old{i}": 0 for i in range(300)}  # finished long before the window
    queue.client.zadd(keys.done, expired)
    queue.client.hset(keys.tasks, mapping=dict.fromkeys(expired, b"{}\n"))
    run(core.schedule([TaskSpec("job", task_id=f"n{i}") for i in range(100)], now_ms=NOW))
    claimed = run(claim(core, limit=100, lease_ms=LEASE, now_ms=NOW)).tasks
    assert run(ack(core, [(c.id, c.token) for c in claimed], now_ms=NOW)) == []
    # 100 added, 200 expired ones forgotten (twice the batch), records with them.
    assert queue.client.zcard(keys.done) == 300 - 200 + 100
    assert queue.client.hlen(keys.tasks) == 300 - 200 + 100


def _published(queue: Queue, build: Build) -> list[bytes]:
    """Run one operation and return what it published on the queue's wake channel."""
    sub = queue.client.pubsub(ignore_subscribe_messages=True)
    sub.subscribe(queue.core.keys.wake_channel)
    assert sub.get_message(timeout=1) is None  # the subscribe confirmation, skipped
    try:
        SyncRunner(queue.client).run(build(queue.core))
        got = []
        while (msg := sub.get_message(timeout=0.2)) is not None:
            got.append(msg["data"])
        return got
    finally:
        sub.close()


@pytest.mark.parametrize(
    ("held", "wanted"),
    [
        pytest.param({}, [str(NOW + LEASE).encode()], id="first-lease"),
        pytest.param({"x": NOW + LEASE + 5_000}, [str(NOW + LEASE).encode()], id="shorter-lease"),
        pytest.param({"x": NOW + 10_000}, [], id="a-lease-ends-sooner-already"),
    ],
)
def test_claim_announces_a_lease_that_ends_before_every_held_one(
    queue: Queue, held: dict[str, int], wanted: list[bytes]
) -> None:
    """Idle workers sleep until the earliest lease they know of; a claim whose lease ends
    sooner tells them, or a crashed worker's task would wait for their periodic look."""
    tasks: dict[str, T | bytes] = {"a": T()} | {i: LEASED for i in held}
    seed(queue.client, queue.core.keys, S(scheduled={"a": NOW}, active=held, tasks=tasks))
    assert _published(queue, claim_op()) == wanted


def test_an_unchanged_registration_is_one_write(queue: Queue) -> None:
    """An idle worker registers every few seconds: with nothing new to say, only the time it
    was seen is written; the registration itself stays as last sent."""
    r, k, run = queue.client, queue.core.keys, SyncRunner(queue.client).run
    run(claim(queue.core, limit=1, lease_ms=LEASE, worker="w1", worker_info='{"v":1}', now_ms=NOW))
    assert r.hgetall(k.workers) == {b"w1": b'{"v":1}'}
    r.config_resetstat()
    later = NOW + 5_000
    run(claim(queue.core, limit=1, lease_ms=LEASE, worker="w1", worker_info="", now_ms=later))
    writes = {c for c in r.info("commandstats") if c in ("cmdstat_hset", "cmdstat_zadd")}
    assert writes == {"cmdstat_zadd"}
    assert r.hgetall(k.workers) == {b"w1": b'{"v":1}'}
    assert r.zscore(k.workers_seen, "w1") == later


def test_claims_reply_is_laid_out_as_claim_lua_declares(queue: Queue) -> None:
    """The claim reply the worker unpacks by name: a head, then one whole row per task."""
    r, k = queue.client, queue.core.keys
    seed(r, k, S(scheduled={i: NOW for i in "abc"}, tasks={i: T() for i in "abc"}))
    op = claim(queue.core, limit=10, lease_ms=LEASE, now_ms=NOW)
    raw = SyncRunner(r).run(dc_replace(op, parse=lambda reply: reply))
    declared = SCRIPTS["claim"].reply
    assert len(raw) == declared.head + 3 * declared.stride and declared.matches(raw)
    rows = list(declared.rows(raw))
    assert [row[declared.field("id")] for row in rows] == [b"a", b"b", b"c"]
    assert [row[declared.field("token")] for row in rows] == [1, 2, 3]
    assert raw[declared.at("now")] == NOW * 1000


@pytest.mark.parametrize(
    ("replace", "statuses", "due"), [("0", [1, 0], 10_000), ("1", [1, 2], 20_000)]
)
def test_schedule_sees_its_own_pending_writes_when_one_call_holds_an_id_twice(
    queue: Queue, replace: str, statuses: list[int], due: int
) -> None:
    # Python refuses a repeated id before sending; another producer may not. The script
    # writes the scheduled set in batches, and must still treat the second as known.
    core, now = queue.core, 1_000_000
    first = core.encode_tasks([TaskSpec("k", {"n": 1}, task_id="dup", delay=10)])[1]
    second = core.encode_tasks([TaskSpec("k", {"n": 2}, task_id="dup", delay=20)])[1]
    args = {"now": now, "dedupe_ms": core.dedupe_ms, "replace": replace}
    args |= {"channel": core.keys.wake_channel, "durable": "0"}
    op = core.op("schedule", args, first + second, lambda reply: reply)
    assert SyncRunner(queue.client).run(op) == [*statuses, now]  # (then the now it ran at)
    assert queue.client.zscore(core.keys.scheduled, "dup") == now + due
    assert queue.client.hlen(core.keys.tasks) == 1
