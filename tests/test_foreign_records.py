"""What another program writes into a queue's keys never stops a worker (issue 28, finding 2
and its class; finding 6). Whatever bytes sit in a record, its header fields, its attempts
entry or its id, the task either runs as a normal task or ends in the dead set with a
reason, the tasks beside it run once, and the worker stays up. Records are written with raw
commands (key names from ``delayq/keys.py``), as a program in another language could."""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from delayq import Queue, Worker, leasing
from delayq.embedded import EmbeddedServer
from delayq.scripts import SCRIPTS
from delayq.testing import VirtualClock, drain

from .conftest import WorkerThread
from .support.helpers import wait_for

RunWorker = type[WorkerThread]


class Records(logging.Handler):
    """The delayq log records of a test, from every thread."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self.guard:
            self.records.append(record)

    def trouble(self) -> list[str]:
        """Records that mean a loop or the engine failed: a supervised loop restarting (it
        raised), an internal error running a task, or any traceback that is not a handler's."""
        with self.guard:
            return [
                r.getMessage()
                for r in self.records
                if (
                    r.levelno >= logging.ERROR
                    and ("restarting" in r.getMessage() or "internal error" in r.getMessage())
                )
                or r.levelno >= logging.CRITICAL
                or (r.exc_info and "is dead" not in r.getMessage())
            ]


@pytest.fixture
def logs() -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger("delayq")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old)


def write(
    queue: Queue, tid: bytes, record: bytes, *, score: float = 0, attempt: bytes | None = None
) -> None:
    """A task as another program writes one: its record, its id in the schedule, and
    perhaps an attempts entry."""
    keys = queue.core.keys
    queue.client.hset(keys.tasks, tid, record)
    if attempt is not None:
        queue.client.hset(keys.attempts, tid, attempt)
    queue.client.zadd(keys.scheduled, {tid: score})


def dead_reason(queue: Queue, tid: bytes) -> str | None:
    """The reason a task is dead, read raw (by its raw id), or None when it is not dead."""
    keys = queue.core.keys
    if queue.client.zscore(keys.dead, tid) is None:
        return None
    reason = queue.client.hget(keys.errors, tid)
    return reason.decode("utf-8", "replace") if isinstance(reason, bytes) else ""


def settled(queue: Queue) -> bool:
    keys = queue.core.keys
    return queue.client.zcard(keys.scheduled) == 0 and queue.client.zcard(keys.active) == 0


# -- finding 2: a field that is not UTF-8 -----------------------------------------------------

GOOD = b'{"k":"k","c":1}\n{"n":1}'


@pytest.mark.parametrize(
    ("tid", "record", "field"),
    [
        (b"bad-id-\xff", GOOD, "task id"),
        (b"bad-id-\xe2\x82", GOOD, "task id"),  # a character cut short
        (b"bad-id-\xed\xa0\x80", GOOD, "task id"),  # a surrogate, as CESU-8 writes it
        (b"bad-kind", b'{"k":"k\xff","c":1}\n{"n":1}', "kind (header field k)"),
        (b"bad-kind-slow", b'{"c":1,"k":"\xc0\xaf"}\n{"n":1}', "kind (header field k)"),
        (b"bad-format", b'{"k":"k","f":"\xfe","c":1}\n{"n":1}', "payload format"),
        (b"bad-headers", b'{"k":"k","c":1,"h":{"a":"\xff"}}\n{"n":1}', "headers"),
        (b"bad-payload", b'{"k":"k","c":1}\n{"n":"\xff"}', "payload"),
    ],
)
def test_a_field_that_is_not_utf8_buries_its_task_and_its_batch_runs(
    queue: Queue, run_worker: RunWorker, logs: Records, tid: bytes, record: bytes, field: str
) -> None:
    """Finding 2: a record with a non-UTF-8 id, kind or format made the claim parse raise
    UnicodeDecodeError; the claim loop failed 8 times, the worker exited with WorkerFailed,
    and the tasks claimed with it waited out their lease. Now the task is dead, by its raw
    id, with a reason naming the field, and the rest of its batch runs at once."""
    for i in range(3):
        queue.schedule("k", {"i": i}, task_id=f"before-{i}")
    write(queue, tid, record)
    for i in range(3):
        queue.schedule("k", {"i": i}, task_id=f"after-{i}")
    worker = Worker(queue, concurrency=4)
    ran: list[str] = []
    worker.handler("k")(lambda task: ran.append(task.id))
    t0 = time.monotonic()
    with run_worker(worker):
        wait_for(lambda: len(ran) >= 6 and settled(queue), timeout=10)
        took = time.monotonic() - t0
    assert sorted(ran) == sorted(
        [f"before-{i}" for i in range(3)] + [f"after-{i}" for i in range(3)]
    )
    assert took < 5, "the batch waited out a lease"
    reason = dead_reason(queue, tid)
    assert reason is not None and field in reason, reason
    assert logs.trouble() == []
    # The dead set shows it, the bytes that are not UTF-8 as \xNN.
    dead = queue.dead()
    assert [d.id for d in dead] == [tid.decode("utf-8", "backslashreplace")]
    assert field in (dead[0].last_error or "")


@pytest.mark.parametrize("tid", [b"capped-\xff", b"capped-format"])
def test_a_buried_row_does_not_hold_up_its_capped_kind(
    queue: Queue, run_worker: RunWorker, logs: Records, tid: bytes
) -> None:
    """A row buried as unreadable took a room of its capped kind in the claim, and no run of
    it would ever free the room and wake the claim loop: the kind's other tasks, due at
    once, waited for max_wait (15 s) per such row (found by the review of issue 28)."""
    now_ms = int(time.time() * 1000)
    queue.schedule("k", {"i": 0}, task_id="first", at=(now_ms - 30) / 1000)
    record = GOOD if tid.endswith(b"\xff") else b'{"k":"k","f":"\xfe","c":1}\n{"n":1}'
    write(queue, tid, record, score=now_ms - 20)
    for i in range(5):
        queue.schedule("k", {"i": i}, task_id=f"after-{i}", at=(now_ms - 10) / 1000)
    worker = Worker(queue, concurrency=4)
    ran: list[str] = []
    worker.handler("k", concurrency=1)(lambda task: ran.append(task.id))
    t0 = time.monotonic()
    with run_worker(worker):
        wait_for(lambda: len(ran) >= 6 and settled(queue), timeout=20)
        took = time.monotonic() - t0
    assert sorted(ran) == ["after-0", "after-1", "after-2", "after-3", "after-4", "first"]
    assert took < 5, f"the capped kind waited {took:.1f} s behind the buried row"
    assert dead_reason(queue, tid) is not None
    assert logs.trouble() == []


def test_the_dead_hooks_hear_of_a_task_id_that_is_not_utf8(
    queue: Queue, run_worker: RunWorker
) -> None:
    write(queue, b"raw-\xff", GOOD)
    worker = Worker(queue)
    heard: list[tuple[str, str, Any]] = []
    worker.handler("k")(lambda task: None)
    worker.on_dead(lambda task_id, reason, task: heard.append((task_id, reason, task)))
    with run_worker(worker):
        wait_for(lambda: heard)
    assert heard[0][0] == "raw-\\xff" and "task id" in heard[0][1] and heard[0][2] is None


def test_drain_buries_a_task_id_that_is_not_utf8(server: EmbeddedServer, qname: str) -> None:
    queue = Queue(qname, url=server.url, clock=VirtualClock())
    write(queue, b"raw-\xff", GOOD)
    queue.schedule("k", None, task_id="good")
    worker = Worker(queue)
    worker.handler("k")(lambda task: None)
    result = drain(worker)
    assert [r.task_id for r in result.ran] == ["good"]
    assert "task id" in (dead_reason(queue, b"raw-\xff") or "")
    queue.close()


def test_the_claim_parse_sorts_any_row_into_a_task_or_an_unreadable_one() -> None:
    """No server: claim's reply parse, given rows whose text fields hold any bytes, never
    raises; a row is a task exactly when its id, kind and format are UTF-8."""
    core = Queue("parse", url="redis://127.0.0.1:1/0").core  # builders only: never connects
    op = leasing.claim(core, limit=10, lease_ms=1000)
    head = [1_000_000, -1, -1, -1][: SCRIPTS["claim"].reply.head]

    @given(
        st.lists(
            st.tuples(st.binary(max_size=8), st.binary(max_size=8), st.binary(max_size=4)),
            max_size=6,
        )
    )
    def check(rows: list[tuple[bytes, bytes, bytes]]) -> None:
        reply: list[Any] = list(head)
        for i, (tid, kind, fmt) in enumerate(rows):
            reply += [tid, kind, 1, 0, i, 1000, 0, fmt, b"", b"{}"]
        result = op.parse(reply)
        readable = [r for r in rows if all(_utf8(b) for b in r)]
        assert [c.id for c in result.tasks] == [r[0].decode() for r in readable]
        assert [u.id for u in result.unreadable] == [r[0] for r in rows if r not in readable]
        assert all("not valid UTF-8" in u.reason for u in result.unreadable)
        tokens = [i for i, r in enumerate(rows) if r not in readable]
        assert [u.token for u in result.unreadable] == tokens

    check()


def _utf8(b: bytes) -> bool:
    try:
        b.decode()
    except UnicodeDecodeError:
        return False
    return True


# -- finding 6: any field order gives the same Task -------------------------------------------

HEADERS = [{"tenant": "acme", "trace": "00-ab"}, {"a": "}", "b": ',"c":9}', "c": "\\u00e9 é"}]


def _header_texts(headers: dict[str, str]) -> Iterator[bytes]:
    """The header of one task (kind k, max attempts 5, created 1, ``headers``) in every field
    order, compact and with the whitespace JSON allows, and with unknown fields around."""
    fields = {"k": "k", "m": 5, "c": 1, "h": headers}
    for order in itertools.permutations(fields):
        for sep, colon in ((",", ":"), (" , ", " : ")):
            body = sep.join(
                f"{json.dumps(f)}{colon}{json.dumps(fields[f], separators=(sep, colon))}"
                for f in order
            )
            yield ("{" + body + "}").encode()
            yield ("{ " + body + " }").encode()
    # Unknown fields, before c, after h, and holding what the fast path looks for.
    extra = ',"z":{"c":2,"h":{"x":"y"}},"y":[1,"}"]'
    h = json.dumps(headers, separators=(",", ":"))
    yield f'{{"k":"k","m":5{extra},"c":1,"h":{h}}}'.encode()
    yield f'{{"k":"k","m":5,"c":1,"h":{h}{extra}}}'.encode()
    yield f'{{"k":"k","m":5,"c":1{extra},"h":{h}}}'.encode()
    yield f'{{"k":"k","m":5,"c":1,"h":{h},"q":{{}}}}'.encode()
    yield f'{{"k":"k","m":5,"c":1,"h":{h}}}\r'.encode()  # whitespace after the object


@pytest.mark.parametrize("headers", HEADERS, ids=["plain", "tricky"])
def test_every_field_order_gives_the_same_task(
    queue: Queue, run_worker: RunWorker, headers: dict[str, str]
) -> None:
    """Finding 6: a record with h before c lost its headers in the worker (get() showed
    them): the fast path took the text before the first ',"c":<digits>}' as the kind's
    fields. Every order the protocol allows, in the worker and in get(), gives one Task."""
    texts = list(_header_texts(headers))
    for i, text in enumerate(texts):
        json.loads(text)  # (each is a valid header)
        write(queue, b"r%d" % i, text + b'\n{"n":[1,2.5,"x"]}')
    want = ("k", {"n": [1, 2.5, "x"]}, headers, 5)
    for i in range(len(texts)):
        info = queue.get(f"r{i}")
        assert info is not None
        assert (info.kind, info.payload, info.headers, info.max_attempts) == want, texts[i]
    worker = Worker(queue, concurrency=8)
    seen: dict[str, tuple[Any, ...]] = {}
    worker.handler("k")(
        lambda t: seen.__setitem__(t.id, (t.kind, t.payload, t.headers, t.max_attempts, t.attempt))
    )
    with run_worker(worker):
        wait_for(lambda: len(seen) + queue.stats().dead == len(texts), timeout=20)
    dead = {d.id: d.last_error for d in queue.dead()}
    wrong = {
        text: seen.get(f"r{i}", dead.get(f"r{i}"))
        for i, text in enumerate(texts)
        if seen.get(f"r{i}") != (*want, 1)
    }
    assert wrong == {}


# -- the class: any bytes, beside valid tasks -------------------------------------------------

FIELDS = ("k", "m", "f", "c", "h", "x")
raw_text = st.binary(max_size=12).map(
    lambda b: b'"' + b.replace(b'"', b"") + b'"'
)  # a string of any bytes
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
).map(lambda v: json.dumps(v).encode())
field_value = (
    raw_text
    | json_value
    | st.sampled_from([b'"k"', b'"json"', b'"msgpack"', b"5", b"1", b'{"a":"b"}', b"1e999", b"007"])
)
header_line = st.lists(st.tuples(st.sampled_from(FIELDS), field_value), max_size=6).map(
    lambda fs: b"{" + b",".join(b'"' + f.encode() + b'":' + v for f, v in fs) + b"}"
)
payload = st.sampled_from([b'{"n":1}', b"null", b"[]", b""]) | st.binary(max_size=20)
record = st.one_of(
    st.binary(max_size=60),  # noise
    st.tuples(header_line, payload).map(lambda t: t[0] + b"\n" + t[1]),
    st.tuples(
        st.sampled_from([b'{"k":"k","c":1', b'{"k":"k","m":2,"c":1', b'{"c":1,"k":"k"']),
        field_value,
        payload,
    ).map(lambda t: t[0] + b',"h":' + t[1] + b"}\n" + t[2]),
    st.binary(max_size=8).map(lambda b: b'{"k":"' + b + b'","c":1}\n{}'),  # the kind's bytes
    st.binary(max_size=8).map(lambda b: b'{"k":"k","f":"' + b + b'","c":1}\n{}'),  # the format's
)
foreign = st.fixed_dictionaries(
    {
        "id": st.binary(max_size=10),
        "record": record,
        "score": st.sampled_from([float("-inf"), -1e300, -1.0, 0.0, 0.5])
        | st.floats(0, 1e12, allow_nan=False),
        "attempt": st.none()
        | st.binary(max_size=16)
        | st.sampled_from([b"1 2 3", b"9 99999999999999999999 x", b"0 5 -inf"]),
    }
)
wake = st.binary(max_size=16) | st.sampled_from(
    [
        b"inf",
        b"-inf",
        b"nan",
        b"1e400",
        b"-1e400",
        b"abort",
        b"abort x y",
        b"abort 1 \xff",
        b"abort 99999999999999999999999 a",
    ]
)


def test_any_bytes_another_program_writes_leave_the_worker_up(
    server: EmbeddedServer, run_worker: RunWorker, logs: Records, qname: str
) -> None:
    """The class behind finding 2. Each example writes foreign tasks (any id bytes, any
    record, any header fields, any attempts entry, any due time up to now) with raw commands
    beside valid tasks scheduled through the API, and publishes any bytes on the wake
    channel; one real worker serves through all the examples. Every valid task runs exactly
    once, every foreign one runs or is dead with a reason, and no loop of the worker ever
    fails."""
    queue = Queue(qname, url=server.url, dedupe_window=3600)
    keys = queue.core.keys
    # unknown_kind_grace=0: a foreign kind is buried at its first claim (by handback.lua,
    # whatever its due time), not handed back for an hour (tests/test_unknown_kinds.py).
    worker = Worker(queue, concurrency=8, lease=5, unknown_kind_grace=0)
    ran: list[bytes] = []
    lock = threading.Lock()

    def handle(task: Any) -> None:
        with lock:
            ran.append(task.id.encode("utf-8", "surrogateescape"))

    worker.handler("k", max_attempts=1)(handle)
    examples = itertools.count()
    deadline = time.monotonic() + 20

    @settings(
        max_examples=60,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(tasks=st.lists(foreign, min_size=1, max_size=8), messages=st.lists(wake, max_size=3))
    def example(tasks: list[dict[str, Any]], messages: list[bytes]) -> None:
        if time.monotonic() > deadline:
            return  # bounded: the examples run so far have been checked
        n = next(examples)
        valid = [f"v{n}-{i}" for i in range(3)]
        queue.schedule("k", {"i": 0}, task_id=valid[0], headers={"h": "v"})
        ids = []
        for i, t in enumerate(tasks):
            tid = b"f%d-%d:" % (n, i) + t["id"]
            ids.append(tid)
            write(
                queue,
                tid,
                t["record"],
                score=min(t["score"], time.time() * 1000),
                attempt=t["attempt"],
            )
        queue.schedule("k", None, task_id=valid[1])
        for m in messages:
            queue.client.publish(keys.wake_channel, m)
        # As the schedule script announces a new head (the raw writes did not), or the
        # worker would look only at its next periodic check.
        queue.client.publish(keys.wake_channel, b"0")
        queue.schedule("k", [1], task_id=valid[2], delay=0.01)
        wait_for(lambda: settled(queue) and all(v.encode() in ran for v in valid), timeout=15)
        with lock:
            counts = {v: ran.count(v.encode()) for v in valid}
            foreign_ran = {tid for tid in ids if tid in ran}
        assert counts == dict.fromkeys(valid, 1), counts
        for tid, t in zip(ids, tasks, strict=True):
            reason = dead_reason(queue, tid)
            assert tid in foreign_ran or reason, (tid, t)
            assert not (tid in foreign_ran and reason), (tid, t, reason)
        assert logs.trouble() == [], (tasks, messages)

    with run_worker(worker) as w:
        example()
    assert w is worker and logs.trouble() == []
    queue.close()


# -- the cron path: what it reads of other programs ------------------------------------------


def test_foreign_registrations_and_schedules_do_not_stop_the_cron_pass(
    queue: Queue, run_worker: RunWorker, logs: Records
) -> None:
    """A worker's cron pass reads every stored schedule and every worker's registration. A
    registration another program wrote ("beat": "x") made the start-up pass raise, so the
    worker never declared its schedules and never started its cron ticker."""
    keys = queue.core.keys
    now = time.time() * 1000
    for wid, info in [
        (b"w-\xff", b"[1,2]"),
        (b"w-text", b'{"beat":"x","pid":"y","kinds":5,"started":"z","concurrency":1e999}'),
        (b"w-junk", b"\xff{"),
    ]:
        queue.client.hset(keys.workers, wid, info)
        queue.client.zadd(keys.workers_seen, {wid: now})
    queue.client.hset(keys.cron, b"sched-\xff", b"junk")
    queue.client.hset(keys.cron, b"odd", b'{"kind":5,"spec":[],"next":"x","next_id":7}')
    worker = Worker(queue)
    worker.every(3600, name="hourly")(lambda: None)
    with run_worker(worker):
        wait_for(lambda: any(s.name == "hourly" and s.next_at for s in queue.schedules()))
    assert not [r for r in logs.records if r.levelno >= logging.ERROR], logs.records
    assert {w.id for w in queue.workers()} >= {"w-\\xff", "w-text", "w-junk"}


def test_an_attempt_number_past_what_redis_replies_buries_the_task(
    queue: Queue, run_worker: RunWorker, logs: Records
) -> None:
    """An attempts entry whose attempt number is 2**63 or more reached the handler as
    attempt -9223372036854775808 (Redis turns such a Lua number into the lowest integer), ran
    a task whose entry says its attempts are spent, and a failure was an internal error
    (found by the review of issue 28). Now the task is dead with a reason, unrun."""
    write(queue, b"huge", GOOD, attempt=b"1 99999999999999999999999 5")
    queue.schedule("k", {"i": 1}, task_id="plain")
    worker = Worker(queue)
    ran: list[tuple[str, int]] = []
    worker.handler("k")(lambda task: ran.append((task.id, task.attempt)))
    with run_worker(worker):
        wait_for(lambda: settled(queue) and ran, timeout=10)
    assert ran == [("plain", 1)]
    reason = dead_reason(queue, b"huge")
    assert reason is not None and "out of range" in reason, reason
    assert logs.trouble() == []


@pytest.mark.parametrize("due", [b"nan", b"inf", b"-inf"])
def test_a_due_time_that_is_no_number_in_an_attempts_entry_is_shown_without_one(
    queue: Queue, due: bytes
) -> None:
    """get() and page() of an active task whose attempts entry ends in nan raised
    ValueError (and the HTTP lookup answered 500): found by the review of issue 28."""
    keys = queue.core.keys
    queue.client.hset(keys.tasks, "t", GOOD)
    queue.client.zadd(keys.active, {"t": int(time.time() * 1000) + 600_000})
    queue.client.hset(keys.attempts, "t", b"1 1 " + due)
    info = queue.get("t")
    assert info is not None and info.state == "active" and info.attempts == 1
    assert [t.id for t in queue.page("active").tasks] == ["t"]
