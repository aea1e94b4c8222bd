"""Model-based test: a queue against an in-memory model of states, leases and attempts.

Hypothesis drives random sequences of producer, worker and admin operations (ids from a
small pool so they collide, tokens old and new, a clock that jumps past lease deadlines
and the dedupe window) and, after every step, compares the whole Redis state with the
model: the five state sets with their scores, every record header, the errors hash and
the counters. Time is the model's clock, passed to every script as ``now_ms``.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from delayq import Queue, leasing
from delayq.codec import Attempt, Header, split_record
from delayq.embedded import EmbeddedServer
from delayq.keys import QueueKeys
from delayq.runner import SyncRunner
from delayq.spec import TaskSpec

BASE = 1_700_000_000_000
DEDUPE_MS = 5_000
IDS = ("a", "b", "c", "d")
STATES = ("scheduled", "active", "done", "dead", "aborted")
TRIM_LIMIT = 20  # ack's default
ABORT_TRIM = 100  # core.ABORT_TRIM
REAP_LIMIT = 100  # more than the id pool: claim always reaps every expired lease

# Mostly short delays, so scheduled work falls due within a few clock steps.
delays = st.one_of(st.sampled_from([0, 50, 400]), st.integers(0, 3_000))
leases = st.sampled_from([1_000, 8_000])
lookaheads = st.sampled_from([0, 100, 400])  # claim what falls due this soon
OUTCOMES = ("crash", "ack", "retry", "bury", "release", "extend")  # crash: never reports
id_lists = st.lists(st.sampled_from(IDS), min_size=1, max_size=3)


# Preconditions: keep hypothesis's steps for operations that can do something.
def holding_some_lease(machine: QueueMachine) -> bool:
    return bool(machine.active())


def some_lease_expired(machine: QueueMachine) -> bool:
    return any(t.score <= machine.model.now for t in machine.active())


def some_task_dead(machine: QueueMachine) -> bool:
    return any(t.state == "dead" for t in machine.model.tasks.values())


def some_task_stored(machine: QueueMachine) -> bool:
    return bool(machine.model.tasks)


def reaped(attempt: int) -> str:
    return (
        f"lease expired during attempt {attempt} "
        "(the worker stopped, crashed or stalled past its lease)"
    )


@dataclass
class Task:
    """What the model knows of one id: its state, score and record header."""

    state: str  # scheduled | active | done | dead | aborted
    score: int  # due time, lease deadline, or time it finished / died / was aborted
    m: int
    payload: bytes
    a: int = 0
    t: int = 0
    d: int | None = None
    error: str | None = None


@dataclass
class Model:
    """The expected queue, changed the way each script should change Redis."""

    now: int = BASE
    tasks: dict[str, Task] = field(default_factory=dict)
    stats: Counter[str] = field(default_factory=Counter)
    tokens: dict[str, set[int]] = field(default_factory=dict)  # every token handed out
    gone: dict[str, str] = field(default_factory=dict)  # id -> why it is no longer stored
    ever: set[str] = field(default_factory=set)  # ids a schedule call accepted
    cancelled: dict[str, int] = field(default_factory=dict)  # tombstones: id -> cancel time

    def bump(self, counter: str, n: int = 1) -> None:
        if n:  # the scripts only HINCRBY a counter when there is something to count
            self.stats[counter] += n

    def in_state(self, state: str) -> list[str]:
        """Ids in one state, in ZSET order (score, then id)."""
        return [
            i for _, i in sorted((t.score, i) for i, t in self.tasks.items() if t.state == state)
        ]

    def holds(self, task_id: str, token: int) -> bool:
        """lease.lua's fencing: active, deadline not passed, and the current token."""
        t = self.tasks.get(task_id)
        return bool(t and t.state == "active" and t.score >= self.now and t.t == token)

    def forget(self, task_id: str, why: str) -> None:
        del self.tasks[task_id]
        self.gone[task_id] = why

    def schedule(self, task_id: str, due: int, m: int, payload: bytes, replace: bool) -> int:
        old = self.tasks.get(task_id)
        fresh = Task("scheduled", due, m, payload)
        status = 0
        if old is None:
            status = 1
            self.cancelled.pop(task_id, None)  # scheduled again: its tombstone goes
        elif old.state == "scheduled" and replace:
            # Moved: a new record and due time; the attempts made and the last error stay.
            fresh.a, fresh.t, fresh.d, fresh.error = old.a, old.t, old.d, old.error
            status = 2
        elif old.state == "active" and replace:
            return 3  # running: never replaced, and the caller is told
        elif old.state in ("done", "aborted") and (replace or old.score < self.now - DEDUPE_MS):
            status = 2 if replace else 1
        elif old.state == "dead" and replace:
            status = 2
        if status:
            self.tasks[task_id] = fresh
            self.gone.pop(task_id, None)
            self.ever.add(task_id)
        return status

    def reap(self, limit: int) -> int:
        expired = [i for i in self.in_state("active") if self.tasks[i].score <= self.now]
        for i in expired[:limit]:
            t = self.tasks[i]
            t.error = reaped(t.a)
            if t.m > 0 and t.a >= t.m:
                t.error += "; no attempts left"
                t.state, t.score = "dead", self.now
                self.bump("dead")
            else:
                t.state, t.score = "scheduled", self.now
        self.bump("leases_expired", len(expired[:limit]))
        return len(expired[:limit])

    def claim(self, limit: int, lease_ms: int, lookahead: int) -> list[tuple[str, int, int]]:
        self.reap(REAP_LIMIT)
        due = [
            i for i in self.in_state("scheduled") if self.tasks[i].score <= self.now + lookahead
        ][:limit]
        out = []
        for i in due:
            t = self.tasks[i]
            self.stats["claim_seq"] += 1
            t.a, t.t, t.d = t.a + 1, self.stats["claim_seq"], t.score
            t.state, t.score = "active", max(self.now, t.score) + lease_ms
            self.tokens.setdefault(i, set()).add(t.t)
            out.append((i, t.a, t.t))
        return out

    def trim_done(self) -> None:
        old = [i for i in self.in_state("done") if self.tasks[i].score <= self.now - DEDUPE_MS]
        for i in old[:TRIM_LIMIT]:
            self.forget(i, "finished; dedupe window passed")

    def abort(self, task_id: str) -> int:
        """abort.lua: 1 waiting, 2 running (now aborted), else 0; then the aborted records
        past the dedupe window are forgotten."""
        t = self.tasks.get(task_id)
        status = 0
        if t is not None and t.state in ("scheduled", "active"):
            status = 1 if t.state == "scheduled" else 2
            t.state, t.score = "aborted", self.now
            self.bump("aborted")
        old = [i for i in self.in_state("aborted") if self.tasks[i].score <= self.now - DEDUPE_MS]
        for i in old[:ABORT_TRIM]:
            self.forget(i, "aborted; dedupe window passed")
        return status

    def fence(self, leases: list[tuple[str, int]]) -> tuple[list[str], list[str]]:
        """Split a call's leases into (accepted, refused) ids, handled in order as the
        scripts do, so a repeated id is refused the second time."""
        accepted: list[str] = []
        refused: list[str] = []
        for task_id, token in leases:
            ok = self.holds(task_id, token) and task_id not in accepted
            (accepted if ok else refused).append(task_id)
        return accepted, refused

    def move(self, task_id: str, state: str, score: int, error: str | None = None) -> None:
        t = self.tasks[task_id]
        t.state, t.score = state, score
        if error is not None:
            t.error = error

    def first_score(self, state: str) -> int | None:
        ids = self.in_state(state)
        return self.tasks[ids[0]].score if ids else None


def read_state(r: redis.Redis, k: QueueKeys) -> tuple[Any, ...]:
    pipe = r.pipeline(transaction=False)
    for name in STATES:
        pipe.zrange(getattr(k, name), 0, -1, withscores=True)
    pipe.hgetall(k.tasks).hgetall(k.attempts).hgetall(k.errors).hgetall(k.stats)
    *zsets, tasks, attempts, errors, stats = pipe.execute()
    assert set(attempts) <= set(tasks), "an attempt state outlived its record"
    records = {i: split_record(rec) for i, rec in tasks.items()}
    return (
        [{i.decode(): int(s) for i, s in z} for z in zsets],
        {
            i.decode(): (Header.of(h, Attempt.parse(attempts.get(i))), p)
            for i, (h, p) in records.items()
        },
        {i.decode(): e.decode() for i, e in errors.items()},
        {c.decode(): int(v) for c, v in stats.items()},
    )


class QueueMachine(RuleBasedStateMachine):
    """Each example runs on its own freshly named queue of the fixture's server.

    Every ``do_*`` method runs one script, applies the same operation to the model and
    asserts the reply matches; rules only choose the arguments.
    """

    def __init__(self, url: str) -> None:
        super().__init__()
        # Whole records of finished tasks: the model compares every record's fields
        # (tombstones: tests/test_finished.py, tests/test_scripts.py).
        self.queue = Queue(
            f"m-{secrets.token_hex(6)}",
            url=url,
            dedupe_window=DEDUPE_MS / 1000,
            keep_finished="record",
        )
        self.core = self.queue.core
        self.run = SyncRunner(self.queue.client).run
        self.model = Model()
        self.serial = 0

    def teardown(self) -> None:
        k = self.core.keys
        names = (*STATES, "cancelled", "tasks", "errors", "stats")
        self.queue.client.delete(*(getattr(k, n) for n in names))
        self.queue.close()

    def active(self) -> list[Task]:
        return [t for t in self.model.tasks.values() if t.state == "active"]

    def draw_lease(self, data: st.DataObject) -> tuple[str, int]:
        """Mostly an active task with its current token; else any id and any token it had."""
        m = self.model
        active = m.in_state("active")
        if active and data.draw(st.integers(0, 3)) > 0:
            task_id = data.draw(st.sampled_from(active))
            return task_id, m.tasks[task_id].t
        task_id = data.draw(st.sampled_from(IDS))
        return task_id, data.draw(st.sampled_from(sorted(m.tokens.get(task_id, {0}))))

    # -- one script call each, checked against the model ---------------------------------

    def do_schedule(
        self, ids: list[str], due: int, *, absolute: bool, m: int, replace: bool
    ) -> None:
        model, now = self.model, self.model.now
        self.serial += 1
        when = {"at": due / 1000} if absolute else {"delay": (due - now) / 1000}
        specs = [TaskSpec("job", self.serial, task_id=i, max_attempts=m, **when) for i in ids]
        op = self.core.schedule(specs, replace=replace, now_ms=now)
        *statuses, ran_at = self.run(dataclasses.replace(op, parse=lambda reply: reply))
        assert ran_at == now, "then the now the script ran at"
        want = [model.schedule(i, due, m, str(self.serial).encode(), replace) for i in ids]
        assert [int(s) for s in statuses] == want, "created 1, replaced 2, unchanged 0, running 3"
        model.bump("scheduled", sum(1 for s in want if s in (1, 2)))

    def do_claim(self, limit: int, lease_ms: int, lookahead: int) -> list[tuple[str, int]]:
        m = self.model
        got = self.run(
            leasing.claim(
                self.core,
                limit=limit,
                lease_ms=lease_ms,
                lookahead_ms=lookahead,
                reap_limit=REAP_LIMIT,
                now_ms=m.now,
            )
        )
        want = m.claim(limit, lease_ms, lookahead)
        assert [(c.id, c.header.attempts, c.token) for c in got.tasks] == want
        assert (got.now_ms, got.next_due_ms, got.next_lease_ms) == (
            m.now,
            m.first_score("scheduled"),
            m.first_score("active"),
        )
        return [(c.id, c.token) for c in got.tasks]

    def do_ack(self, leases: list[tuple[str, int]]) -> None:
        m = self.model
        accepted, refused = m.fence(leases)
        assert self.run(leasing.ack(self.core, leases, now_ms=m.now)) == refused
        for i in accepted:
            m.move(i, "done", m.now)
        m.bump("succeeded", len(accepted))
        m.trim_done()

    def do_retry(self, lease: tuple[str, int], delay: int, error: str) -> None:
        m = self.model
        accepted, refused = m.fence([lease])
        item = (*lease, f"+{delay}", error)
        assert self.run(leasing.retry(self.core, [item], now_ms=m.now)) == refused
        for i in accepted:
            m.move(i, "scheduled", m.now + delay, error)
        m.bump("retried", len(accepted))

    def do_bury(self, lease: tuple[str, int], reason: str) -> None:
        m = self.model
        accepted, refused = m.fence([lease])
        assert self.run(leasing.bury(self.core, [(*lease, reason)], now_ms=m.now)) == refused
        for i in accepted:
            m.move(i, "dead", m.now, reason)
        m.bump("dead", len(accepted))

    def do_release(self, lease: tuple[str, int]) -> None:
        m = self.model
        accepted, refused = m.fence([lease])
        assert self.run(leasing.release(self.core, [lease], now_ms=m.now)) == refused
        for i in accepted:
            t = m.tasks[i]
            assert t.d is not None, "a claimed task knows its due time"
            t.a = max(t.a - 1, 0)
            m.move(i, "scheduled", t.d)
        m.bump("released", len(accepted))

    def do_extend(self, lease: tuple[str, int], lease_ms: int) -> None:
        m = self.model
        accepted, lost = m.fence([lease])
        got = self.run(leasing.extend(self.core, [lease], lease_ms=lease_ms, now_ms=m.now))
        assert got == lost
        assert got.aborted == {i for i in lost if i in m.tasks and m.tasks[i].state == "aborted"}
        for i in accepted:
            m.tasks[i].score = m.now + lease_ms

    # -- producer ------------------------------------------------------------------------

    @initialize(m=st.integers(0, 2), claimed=st.integers(0, 2), lease_ms=leases)
    def some_work_some_of_it_running(self, m: int, claimed: int, lease_ms: int) -> None:
        """Start with three tasks due now, up to two of them already leased."""
        self.do_schedule(list(IDS[:3]), self.model.now, absolute=False, m=m, replace=False)
        self.do_claim(claimed, lease_ms, 0)

    @rule(
        ids=id_lists.map(lambda ids: list(dict.fromkeys(ids))),
        delay=delays,
        absolute=st.booleans(),
        past=st.booleans(),
        m=st.integers(0, 2),
        replace=st.booleans(),
    )
    def schedule(
        self, ids: list[str], delay: int, absolute: bool, past: bool, m: int, replace: bool
    ) -> None:
        now = self.model.now
        due = now - delay if absolute and past else now + delay
        self.do_schedule(ids, due, absolute=absolute, m=m, replace=replace)

    @precondition(some_task_stored)
    @rule(task_id=st.sampled_from(IDS))
    def cancel(self, task_id: str) -> None:
        m = self.model
        waiting = task_id in m.in_state("scheduled")
        assert self.run(self.core.cancel(task_id, now_ms=m.now)) == waiting
        # Every cancel forgets the tombstones whose dedupe window has passed.
        m.cancelled = {i: at for i, at in m.cancelled.items() if at > m.now - DEDUPE_MS}
        if waiting:
            m.forget(task_id, "cancelled")
            m.bump("cancelled")
            m.cancelled[task_id] = m.now

    @precondition(some_task_stored)
    @rule(task_id=st.sampled_from(IDS))
    def abort(self, task_id: str) -> None:
        """Abort a task in any state: waiting and running ones end as aborted, the rest
        are left alone; the running one's lease is gone (stale_tokens_are_refused)."""
        m = self.model
        t = m.tasks.get(task_id)
        token = t.t if t is not None else 0
        status = self.run(dataclasses.replace(self.core.abort(task_id, now_ms=m.now), parse=int))
        assert status == m.abort(task_id)
        if status == 2:  # its worker's next heartbeat: lost, to an abort
            self.do_extend((task_id, token), 1_000)

    @precondition(some_task_stored)
    @rule(task_id=st.sampled_from(IDS), delay=delays)
    def reschedule(self, task_id: str, delay: int) -> None:
        m = self.model
        waiting = task_id in m.in_state("scheduled")
        got = self.run(self.core.reschedule(task_id, delay=delay / 1000, now_ms=m.now))
        assert got == waiting
        if waiting:
            m.tasks[task_id].score = m.now + delay

    @precondition(some_task_stored)
    @rule(data=st.data())
    def producer_repeats_a_request(self, data: st.DataObject) -> None:
        """The same id again (a producer retrying its call), whatever state it is in now."""
        m = self.model
        done = m.in_state("done") + m.in_state("aborted")  # the dedupe window decides these
        task_id = data.draw(
            st.sampled_from(done if done and data.draw(st.booleans()) else sorted(m.tasks))
        )
        due = m.now + data.draw(delays)
        replace = data.draw(st.booleans())
        self.do_schedule(
            [task_id], due, absolute=False, m=data.draw(st.integers(0, 2)), replace=replace
        )

    # -- worker --------------------------------------------------------------------------

    @rule(limit=st.sampled_from([1, 2, 3, 0]), lease_ms=leases, lookahead=lookaheads)
    def claim(self, limit: int, lease_ms: int, lookahead: int) -> None:
        self.do_claim(limit, lease_ms, lookahead)

    def finish(self, lease: tuple[str, int], outcome: str, data: st.DataObject) -> None:
        """Report a handler's outcome for one lease, as a worker would."""
        if outcome == "ack":
            self.do_ack([lease])
        elif outcome == "retry":
            self.do_retry(lease, data.draw(delays), "boom")
        elif outcome == "bury":
            self.do_bury(lease, "fatal")
        elif outcome == "release":
            self.do_release(lease)
        elif outcome == "extend":
            self.do_extend(lease, data.draw(leases))
        # "crash": the worker vanishes; the lease runs out and a later claim reaps it

    @rule(data=st.data())
    def worker_cycle(self, data: st.DataObject) -> None:
        """Claim up to two tasks and finish each with a handler outcome."""
        for lease in self.do_claim(2, data.draw(leases), data.draw(lookaheads)):
            self.finish(lease, data.draw(st.sampled_from(OUTCOMES)), data)

    @precondition(holding_some_lease)
    @rule(data=st.data())
    def stalled_worker(self, data: st.DataObject) -> None:
        """A worker reports at or just after its lease deadline, and another worker polls
        at that moment: at the deadline the lease still holds (yet the claim reaps it if
        it is still active); 1 ms later the stalled worker's token must be refused."""
        m = self.model
        task_id = data.draw(st.sampled_from(m.in_state("active")))
        t = m.tasks[task_id]
        m.now = max(m.now, t.score + data.draw(st.sampled_from([0, 1, 700])))
        self.finish((task_id, t.t), data.draw(st.sampled_from(OUTCOMES)), data)
        self.do_claim(data.draw(st.integers(0, 2)), data.draw(leases), 0)

    @precondition(holding_some_lease)
    @rule(data=st.data(), n=st.integers(1, 2))
    def ack(self, data: st.DataObject, n: int) -> None:
        self.do_ack([self.draw_lease(data) for _ in range(n)])

    @precondition(lambda self: bool(self.model.tokens))
    @rule(data=st.data())
    def ack_with_stale_token(self, data: st.DataObject) -> None:
        """A token that is not the task's current one, or whose lease ran out, never acks."""
        m = self.model
        task_id = data.draw(st.sampled_from(IDS))
        t = m.tasks.get(task_id)
        current = t.t if t else 0
        stale = [*sorted(m.tokens.get(task_id, set()) - {current}), current + 1]
        if t and t.state == "active" and t.score < m.now:
            stale.append(current)  # expired, not yet reaped
        token = data.draw(st.sampled_from(stale))
        assert not m.holds(task_id, token)
        self.do_ack([(task_id, token)])  # do_ack asserts the refusal

    @precondition(holding_some_lease)
    @rule(data=st.data(), delay=delays, error=st.sampled_from(["boom", "timeout"]))
    def retry(self, data: st.DataObject, delay: int, error: str) -> None:
        self.do_retry(self.draw_lease(data), delay, error)

    @precondition(holding_some_lease)
    @rule(data=st.data())
    def bury(self, data: st.DataObject) -> None:
        self.do_bury(self.draw_lease(data), "fatal")

    @precondition(holding_some_lease)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.do_release(self.draw_lease(data))

    @precondition(holding_some_lease)
    @rule(data=st.data(), lease_ms=leases)
    def extend(self, data: st.DataObject, lease_ms: int) -> None:
        self.do_extend(self.draw_lease(data), lease_ms)

    @precondition(some_lease_expired)
    @rule(limit=st.integers(1, 3))
    def reap(self, limit: int) -> None:
        m = self.model
        assert self.run(self.core.reap(limit=limit, now_ms=m.now)) == m.reap(limit)

    # -- time ----------------------------------------------------------------------------

    @rule(ms=st.one_of(st.integers(0, 800), st.sampled_from([1_001, 8_001])))
    def advance_clock(self, ms: int) -> None:
        self.model.now += ms

    # -- dead set ------------------------------------------------------------------------

    @precondition(some_task_dead)
    @rule(ids=st.none() | id_lists, limit=st.integers(1, 3))
    def replay(self, ids: list[str] | None, limit: int) -> None:
        m = self.model
        got = self.run(self.core.replay(ids, limit=limit, now_ms=m.now))
        n = 0
        for i in m.in_state("dead")[:limit] if ids is None else ids:
            if i in m.tasks and m.tasks[i].state == "dead":
                m.tasks[i].a = 0
                m.move(i, "scheduled", m.now)
                n += 1
        assert got == n
        m.bump("replayed", n)

    @precondition(some_task_dead)
    @rule(ids=st.none() | id_lists, before=st.integers(0, 5_000), limit=st.integers(1, 3))
    def purge(self, ids: list[str] | None, before: int, limit: int) -> None:
        m = self.model
        before_ms = m.now - before
        got = self.run(self.core.purge_dead(ids, before_ms=before_ms, limit=limit))
        if ids is None:
            ids = [i for i in m.in_state("dead") if m.tasks[i].score < before_ms][:limit]
        n = 0
        for i in ids:
            if i in m.tasks and m.tasks[i].state == "dead":
                m.forget(i, "purged")
                n += 1
        assert got == n

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def redis_matches_model(self) -> None:
        m = self.model
        zsets, records, errors, stats = read_state(self.queue.client, self.core.keys)
        members = [set(z) for z in zsets]
        assert sum(len(s) for s in members) == len(set().union(*members)), "sets overlap"
        for name, zset in zip(STATES, zsets, strict=True):
            assert zset == {i: t.score for i, t in m.tasks.items() if t.state == name}, name
        assert set(records) == set().union(*members), "a record without state, or vice versa"
        assert {
            i: (h.kind, p, h.attempts, h.max_attempts, h.token, h.due_ms)
            for i, (h, p) in records.items()
        } == {i: ("job", t.payload, t.a, t.m, t.t, t.d) for i, t in m.tasks.items()}
        assert errors == {i: t.error for i, t in m.tasks.items() if t.error is not None}
        assert stats == dict(m.stats)

    @invariant()
    def get_agrees_with_model(self) -> None:
        """The inspection API reads the same state (get.lua and its parser)."""
        for task_id in IDS:
            t = self.model.tasks.get(task_id)
            info = self.run(self.core.get(task_id))
            want = t and (t.state, t.a, t.error)
            if t is None and task_id in self.model.cancelled:
                want = ("cancelled", 0, None)
            assert (info and (info.state, info.attempts, info.last_error)) == want

    @invariant()
    def tombstones_match_model(self) -> None:
        """A cancel leaves a tombstone for the dedupe window, gone when the id is scheduled
        again or a later cancel finds its window passed (cancel.lua, schedule.lua)."""
        got = self.queue.client.zrange(self.core.keys.cancelled, 0, -1, withscores=True)
        assert {i.decode(): int(s) for i, s in got} == self.model.cancelled

    @invariant()
    def nothing_silently_disappears(self) -> None:
        """Every id a schedule call accepted is in exactly one state set in Redis, or the
        model knows why it left (cancelled, purged, or finished or aborted past the dedupe
        window)."""
        m = self.model
        zsets, _, _, _ = read_state(self.queue.client, self.core.keys)
        for task_id in m.ever:
            places = [name for name, z in zip(STATES, zsets, strict=True) if task_id in z]
            assert len(places) == 1 or (not places and task_id in m.gone), (task_id, places)

    @invariant()
    def stale_tokens_are_refused(self) -> None:
        """Every token handed out, except a lease still held, is refused (probed with one
        extend call, which changes nothing for the leases it refuses)."""
        m = self.model
        for task_id, issued in m.tokens.items():
            assert sum(m.holds(task_id, tok) for tok in issued) <= 1, "one lease per attempt"
        stale = [
            (i, tok) for i, toks in m.tokens.items() for tok in sorted(toks) if not m.holds(i, tok)
        ]
        if stale:
            lost = self.run(leasing.extend(self.core, stale, lease_ms=1, now_ms=m.now))
            assert lost == [i for i, _ in stale]


def test_queue_behaves_like_its_model_under_random_operations(server: EmbeddedServer) -> None:
    run_state_machine_as_test(
        lambda: QueueMachine(server.url),
        settings=settings(max_examples=60, stateful_step_count=30, deadline=None),
    )
