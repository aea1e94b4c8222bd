"""The admission controls inside claim.lua, script by script: seed exact state, claim as
of a given time, assert exact state (pause, the rate limit's bucket, per-kind rooms)."""

from __future__ import annotations

from delayq import Queue, controls
from delayq.leasing import claim
from delayq.runner import SyncRunner

from .test_scripts import LEASE, NOW, S, T, read_state, seed


def _claim(queue: Queue, now: int, limit: int = 10, rooms: tuple[object, ...] = ()) -> object:
    op = claim(queue.core, limit=limit, lease_ms=LEASE, now_ms=now, rooms=list(rooms))  # type: ignore[arg-type]
    return SyncRunner(queue.client).run(op)


def test_a_paused_shard_claims_nothing_but_still_reaps(queue: Queue) -> None:
    r, k = queue.client, queue.core.keys
    seed(
        r,
        k,
        S(
            scheduled={"a": NOW - 10, "b": NOW - 5},
            active={"l": NOW - 1},  # its lease ended: reaped even while paused
            tasks={"a": T(), "b": T(), "l": T(a=1, t=7, d=NOW - 40_000)},
        ),
    )
    assert queue.pause() is True and queue.pause() is False and queue.paused()
    got = _claim(queue, NOW)
    assert got.tasks == [] and got.next_due_ms is None and got.next_token_ms is None  # type: ignore[attr-defined]
    state = read_state(r, k)
    assert state.scheduled == {"a": NOW - 10, "b": NOW - 5, "l": NOW} and state.active == {}
    assert queue.resume() is True and queue.resume() is False and not queue.paused()
    got = _claim(queue, NOW)
    assert [c.id for c in got.tasks] == ["a", "b", "l"]  # type: ignore[attr-defined]


def test_the_rate_limit_takes_one_token_per_task_and_says_when_the_next_is(
    queue: Queue,
) -> None:
    r, k = queue.client, queue.core.keys
    seed(
        r,
        k,
        S(
            scheduled={f"t{i}": NOW - 100 + i for i in range(10)},
            tasks={f"t{i}": T() for i in range(10)},
        ),
    )
    limit = controls.rate_limit("10/s", 3)
    SyncRunner(r).run(controls.set_limit(queue.core, limit, 1, now_ms=NOW))
    got = _claim(queue, NOW)
    assert [c.id for c in got.tasks] == ["t0", "t1", "t2"]  # the burst
    assert got.next_token_ms == NOW + 100 and got.next_due_ms == NOW - 97
    got = _claim(queue, NOW + 50)  # half a token: nothing, and the same next token
    assert got.tasks == [] and got.next_token_ms == NOW + 100
    got = _claim(queue, NOW + 250)  # 2.5 tokens: two tasks, half a token left
    assert [c.id for c in got.tasks] == ["t3", "t4"] and got.next_token_ms == NOW + 300
    # The rest wait where they were: not retried, no attempt counted.
    state = read_state(r, k)
    assert sorted(state.scheduled) == [f"t{i}" for i in range(5, 10)]
    assert all(state.tasks[f"t{i}"] == T() for i in range(5, 10))
    # A claim that wants fewer than the tokens spends only what it takes.
    got = _claim(queue, NOW + 10_000, limit=2)
    assert len(got.tasks) == 2 and got.next_token_ms is None
    assert controls_tokens(queue, NOW + 10_000) == 1  # the bucket (3) less the 2 taken
    queue.clear_rate_limit()
    assert queue.rate_limit() is None
    assert [c.id for c in _claim(queue, NOW + 10_000).tasks] == ["t7", "t8", "t9"]


def controls_tokens(queue: Queue, now: int) -> int:
    return SyncRunner(queue.client).run(controls.read(queue.core, now_ms=now)).tokens


def test_nothing_due_spends_no_token_and_reports_no_throttle(queue: Queue) -> None:
    r, k = queue.client, queue.core.keys
    seed(r, k, S(scheduled={"later": NOW + 60_000}, tasks={"later": T()}))
    SyncRunner(r).run(controls.set_limit(queue.core, controls.rate_limit("1/m"), 1, now_ms=NOW))
    got = _claim(queue, NOW)
    assert got.tasks == [] and got.next_token_ms is None and got.next_due_ms == NOW + 60_000
    assert controls_tokens(queue, NOW) == 1


def test_a_kind_without_room_is_skipped_and_stays_for_other_workers(queue: Queue) -> None:
    r, k = queue.client, queue.core.keys
    pdf = T(kind="pdf")
    seed(
        r,
        k,
        S(
            scheduled={
                "p1": NOW - 9,
                "p2": NOW - 8,
                "m1": NOW - 7,
                "p3": NOW - 6,
                "m2": NOW - 5,
                "f": NOW + 5_000,
            },
            tasks={
                "p1": pdf,
                "p2": pdf,
                "p3": pdf,
                "m1": T(kind="mail"),
                "m2": T(kind="mail"),
                "f": pdf,
            },
        ),
    )
    got = _claim(queue, NOW, rooms=("pdf", 1))
    assert [c.id for c in got.tasks] == ["p1", "m1", "m2"]
    assert got.next_due_ms == NOW + 5_000  # the first row after the skipped ones
    assert sorted(read_state(r, k).scheduled) == ["f", "p2", "p3"]
    assert _claim(queue, NOW, rooms=("pdf", 0)).tasks == []
    # Another worker, with room (or no cap), takes them.
    assert [c.id for c in _claim(queue, NOW).tasks] == ["p2", "p3"]
    # The claim's sequence numbers only what it took: tokens stay dense.
    assert read_state(r, k).stats["claim_seq"] == 5


def test_a_long_run_of_blocked_kinds_cuts_the_look_short(queue: Queue) -> None:
    r, k = queue.client, queue.core.keys
    n = 120  # more than limit + ADMIT_SCAN (1 + 100)
    scheduled = {f"p{i:03}": NOW - 1000 + i for i in range(n)}
    seed(
        r,
        k,
        S(
            scheduled={**scheduled, "m": NOW - 1},
            tasks={**{i: T(kind="pdf") for i in scheduled}, "m": T(kind="mail")},
        ),
    )
    got = _claim(queue, NOW, limit=1, rooms=("pdf", 0))
    assert got.tasks == [] and got.next_due_ms is None  # looks again when a run ends
    r.zrem(k.scheduled, *[f"p{i:03}" for i in range(50)])
    assert [c.id for c in _claim(queue, NOW, limit=1, rooms=("pdf", 0)).tasks] == ["m"]


def test_a_sharded_queue_splits_the_rate_between_its_shards(server: object, qname: str) -> None:
    queue = Queue(qname, url=server.url, shards=4)  # type: ignore[attr-defined]
    try:
        limit = queue.set_rate_limit("100/s", burst=10)
        assert limit == controls.RateLimit(rate="100/s", per_second=100.0, burst=10)
        assert queue.rate_limit() == limit
        for core in queue.shards.cores:
            rate, burst = queue.client.hmget(core.keys.control, "rate", "burst")
            assert float(rate) == 0.025 and int(burst) == 3  # 100/s / 4 per ms, ceil(10 / 4)
        queue.pause()
        assert all(queue.client.hget(c.keys.control, "paused") for c in queue.shards.cores)
        queue.resume()
        assert not queue.paused() and queue.controls().tokens == 12
    finally:
        queue.close()


def _hmget_calls(queue: Queue) -> int:
    stats = queue.client.info("commandstats")
    return int(stats.get("cmdstat_hmget", {}).get("calls", 0))


def test_an_idle_look_does_not_read_the_controls(queue: Queue) -> None:
    """An idle worker's claim every max_wait must cost what it did before the controls: the
    control key is read only by a claim that finds a task due (seen failing with it read
    on every call)."""
    r, k = queue.client, queue.core.keys
    seed(r, k, S(scheduled={"later": NOW + 60_000}, tasks={"later": T()}))
    queue.pause()
    before = _hmget_calls(queue)
    got = _claim(queue, NOW)
    assert got.tasks == [] and got.next_due_ms == NOW + 60_000  # type: ignore[attr-defined]
    assert _hmget_calls(queue) == before
    got = _claim(queue, NOW + 60_000)  # due now, and paused: the controls are read
    assert got.tasks == [] and got.next_due_ms is None  # type: ignore[attr-defined]
    assert _hmget_calls(queue) == before + 1
