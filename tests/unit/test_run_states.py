"""A run's life, row by row (worker/lifecycle.py, applied by Runs._move).

Each row puts a real Run of a real Runs into a state by the events that lead there, then
applies one event and checks everything the state table decides: the new state, whether
the run holds a slot, a place in its kind's count, its lease in the heartbeat's map, what
was handed to the Finisher, and what was done to its handler. Every pair of state and event
the table does not list must change nothing. The expectations are written out here, not read
from the table: the table is what is tested. docs/architecture.md shows the same table; the
last tests check that the page and the code agree.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest

from delayq import Queue
from delayq.codec import Header
from delayq.leasing import Claimed
from delayq.task import Task
from delayq.worker import lifecycle as lc
from delayq.worker.aborts import RecentAborts
from delayq.worker.lane import Lane
from delayq.worker.runs import Runs

ROOT = Path(__file__).resolve().parents[2]
KIND = "k"  # a kind with a cap: its runs are counted

# state, event -> new state, slot held, counted, lease extended, written, handler
# (written: the action handed to the Finisher by the move; handler: "started", "cancelled",
# "told aborted", "" for nothing).
ROWS: list[tuple[str, str, str, bool, bool, bool, str, str]] = [
    ("new", "ahead", "timed", False, True, True, "", ""),
    ("new", "queue", "queued", False, True, False, "", ""),
    ("new", "start", "running", True, True, True, "", "started"),
    ("new", "aborted", "done", False, False, False, "", ""),
    ("timed", "queue", "queued", False, True, False, "", ""),
    ("timed", "start", "running", True, True, True, "", "started"),
    ("timed", "lost", "done", False, False, False, "", ""),
    ("timed", "aborted", "done", False, False, False, "", ""),
    ("timed", "shutdown", "done", False, False, False, "release", ""),
    ("queued", "start", "running", True, True, True, "", "started"),
    ("queued", "waited", "done", False, False, False, "release", ""),
    ("queued", "lost", "done", False, False, False, "", ""),
    ("queued", "aborted", "done", False, False, False, "", ""),
    ("queued", "shutdown", "done", False, False, False, "release", ""),
    ("running", "ended", "done", False, False, False, "", ""),
    ("running", "outlived", "overrun", True, True, False, "", ""),
    ("running", "lost", "stopping", True, True, False, "", "cancelled"),
    ("running", "aborted", "stopping", True, True, False, "", "told aborted"),
    ("stopping", "ended", "done", False, False, False, "", ""),
    ("stopping", "outlived", "overrun", True, True, False, "", ""),
    ("overrun", "returned", "done", False, False, False, "", ""),
    ("overrun", "aborted", "overrun", True, True, False, "", "told aborted"),
]

# The events that lead from new to each state.
PATHS = {
    "new": [],
    "timed": ["ahead"],
    "queued": ["queue"],
    "running": ["start"],
    "stopping": ["start", "lost"],
    "overrun": ["start", "outlived"],
    "done": ["start", "ended"],
}


class Written:
    """A Finisher stand-in that only records the outcomes handed to it."""

    def __init__(self) -> None:
        self.outcomes: list[Any] = []

    def add(self, outcome: Any) -> None:
        self.outcomes.append(outcome)


class Handle:
    """Stands for the asyncio task running a handler: records its cancel."""

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


async def _run_in(state: str) -> tuple[Runs, Lane, Any, list[Any], Written]:
    """A Runs with one lane (its kind capped) and one run brought into ``state``."""
    loop = asyncio.get_running_loop()
    written = Written()
    runs = Runs(lambda ms: 0.0, lambda: None, concurrency=4)
    lane = Lane(Queue("q", url="redis://127.0.0.1:1/0"))  # builders only: never connects
    lane.finisher = written  # type: ignore[assignment]
    lane.caps, lane.of_kind = {KIND: 4}, {KIND: set()}
    runs.add_lane(lane)
    launched: list[Any] = []

    def launch(run: Any) -> None:  # no executor: the handler "runs" from here on
        launched.append(run)
        run.handle = Handle()
        run.task = Task.claimed("A", KIND, None, 1, 5, 0, "q", 7)

    runs._launch = launch  # type: ignore[method-assign]
    runs.moved_at = time.monotonic()  # (as start_many and the timer set it)
    run = lc.Run(Claimed("A", Header(KIND, 1, 5, 7, 0, 0, "json"), b"null"), lane, runs)
    lane.by_id["A"] = run
    run.at = loop.time() + 60
    for name in PATHS[state]:
        assert runs._move(run, lc.EVENTS.index(name)), (state, name)
    assert lc.STATES[run.state] == state
    written.outcomes.clear()
    launched.clear()
    return runs, lane, run, launched, written


def _holds(runs: Runs, lane: Lane, run: Any) -> tuple[bool, bool, bool]:
    return (
        runs.busy == 1,
        run in lane.of_kind[KIND],
        lane.leases.get("A") is run.claimed,
    )


@pytest.mark.parametrize(
    ("state", "event", "becomes", "slot", "counted", "extended", "written", "handler"),
    ROWS,
    ids=[f"{r[0]}-{r[1]}" for r in ROWS],
)
async def test_each_row_of_the_table(
    state: str,
    event: str,
    becomes: str,
    slot: bool,
    counted: bool,
    extended: bool,
    written: str,
    handler: str,
) -> None:
    runs, lane, run, launched, finisher = await _run_in(state)
    handle = run.handle
    was_cancelled = handle is not None and handle.cancelled
    assert runs._move(run, lc.EVENTS.index(event)) is True
    assert lc.STATES[run.state] == becomes
    assert _holds(runs, lane, run) == (slot, counted, extended)
    assert runs.held == (1 if becomes in ("timed", "queued") else 0) + runs.busy
    assert [o.action for o in finisher.outcomes] == ([written] if written else [])
    if handler == "started":
        assert launched == [run]
    elif handler == "cancelled":
        assert handle.cancelled and not was_cancelled
        assert run.task.lease_lost.is_set() and not run.task.aborted
    elif handler == "told aborted":
        assert run.task.aborted and run.task.lease_lost.is_set()
    else:
        assert not launched and (handle is None or handle.cancelled == was_cancelled)
    # Lost, or aborted, before its outcome: no longer the task's run here.
    lost = {"lost", "aborted"} & {*PATHS[state], event}
    forgotten = bool(lost) and (state, event) not in {("new", "aborted"), ("overrun", "aborted")}
    assert ("A" in lane.by_id) is (not forgotten)


LISTED = {(lc.STATES.index(r[0]), lc.EVENTS.index(r[1])) for r in ROWS}
UNLISTED = [
    (s, e) for s in range(len(lc.STATES)) for e in range(len(lc.EVENTS)) if (s, e) not in LISTED
]


@pytest.mark.parametrize(
    ("state", "event"), UNLISTED, ids=[f"{lc.STATES[s]}-{lc.EVENTS[e]}" for s, e in UNLISTED]
)
async def test_every_other_pair_changes_nothing(state: int, event: int) -> None:
    """A late event (a lease reported lost after the run ended, a thread returning before
    its attempt did) is ignored."""
    runs, lane, run, launched, finisher = await _run_in(lc.STATES[state])
    before = (_holds(runs, lane, run), runs.held, "A" in lane.by_id)
    assert runs._move(run, event) is False
    assert run.state == state
    assert (_holds(runs, lane, run), runs.held, "A" in lane.by_id) == before
    assert finisher.outcomes == [] and launched == []


def test_the_table_lists_exactly_the_rows_tested() -> None:
    assert set(lc.TABLE) == LISTED
    for s, e, becomes, *_ in ROWS:
        found = lc.move(lc.STATES.index(s), lc.EVENTS.index(e))
        assert found is not None and lc.STATES[found[0]] == becomes


async def test_a_run_lost_before_its_handler_was_called_ends_at_once() -> None:
    """Running, but its handler not yet called (launched, its task not begun): lost, it
    gives its slot back at once, since nothing of the user's runs."""
    runs, lane, run, _, _ = await _run_in("running")
    run.task = None
    assert runs._move(run, lc.LOST)
    assert run.state == lc.DONE and runs.busy == 0 and not lane.leases
    assert run not in lane.of_kind[KIND] and run.handle is None


async def test_a_freed_slot_goes_to_the_run_that_waited_longest() -> None:
    runs, lane, first, launched, _ = await _run_in("running")
    runs.concurrency = 1
    later = lc.Run(Claimed("B", Header(KIND, 1, 5, 8, 0, 0, "json"), b"null"), lane, runs)
    lane.by_id["B"] = later
    assert runs._move(later, lc.QUEUE)
    assert runs._move(first, lc.ENDED)
    assert later.state == lc.RUNNING and launched == [later] and runs.busy == 1


# -- the abort heard before its claim ---------------------------------------------------


async def test_an_abort_heard_before_its_claim_reached_runs_is_applied_when_it_does() -> None:
    """Finding 5, with real objects: the waker delivers the abort before start_many has
    the claim's tasks. The task is never started; another claim of the same task (a new
    token) is not the one aborted, and runs."""
    runs, lane, _, launched, finisher = await _run_in("new")
    del lane.by_id["A"]

    def claimed(tid: str, token: int) -> Claimed:
        return Claimed(tid, Header(KIND, 1, 5, token, 0, 0, "json"), b"null")

    assert runs.abort(lane, "X", 11) is False  # no run of it yet: remembered
    runs.start_many(lane, [claimed("X", 11), claimed("Y", 12)])
    assert [r.claimed.id for r in launched] == ["Y"]
    assert "X" not in lane.by_id and "X" not in lane.leases and runs.busy == 1
    assert run_of(lane, "Y").state == lc.RUNNING and finisher.outcomes == []
    assert not runs.aborts.heard  # acted on once
    runs.start_many(lane, [claimed("X", 13)])
    assert [r.claimed.id for r in launched] == ["Y", "X"]


def run_of(lane: Lane, tid: str) -> Any:
    return lane.by_id[tid]


def test_the_memory_of_aborts_is_bounded_in_size_and_in_time() -> None:
    now = [0.0]
    aborts = RecentAborts(keep_s=60, most=100, clock=lambda: now[0])
    for i in range(150):
        aborts.remember("lane", f"t{i}", i)
    assert len(aborts.heard) == 100
    assert not aborts.take("lane", "t0", 0)  # the oldest went first
    assert aborts.take("lane", "t149", 149) and not aborts.take("lane", "t149", 149)
    assert not aborts.take("lane", "t148", 1)  # another claim's token
    now[0] = 61.0
    assert not aborts.take("lane", "t140", 140)  # heard too long ago
    aborts.remember("lane", "u", 1)  # (forgets what is too old as it remembers)
    assert list(aborts.heard) == [("lane", "u", 1)]


# -- docs/architecture.md shows this table --------------------------------------------


def _doc_tables() -> tuple[list[list[str]], list[list[str]]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("### A run's life") :]
    section = section[: section.index("\n## ")]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    holds = [c for c in cells if len(c) == 5]
    moves = [c for c in cells if len(c) == 2]
    return holds, moves


def test_the_docs_say_what_each_state_holds_as_the_code_does() -> None:
    holds, _ = _doc_tables()
    yes = {"yes": True, "no": False}
    seen = {}
    for state, slot, counted, extended, _what in holds:
        seen[state.strip("`")] = (yes[slot], yes[counted], yes[extended])
    want = {
        name: tuple(bool(lc.HOLDS[i] & f) for f in (lc.SLOT, lc.COUNTED, lc.EXTENDED))
        for i, name in enumerate(lc.STATES)
        if name != "new"
    }
    assert seen == want


def test_the_docs_list_the_moves_of_the_code() -> None:
    _, moves = _doc_tables()
    seen = set()
    for state, cell in moves:
        for item in cell.split(";"):
            events, _, after = item.partition("→")
            target = re.findall(r"`([a-z]+)`", after)[0]
            for event in re.findall(r"`([a-z]+)`", events):
                seen.add((state.strip("`"), event, target))
    want = {(lc.STATES[s], lc.EVENTS[e], lc.STATES[t]) for (s, e), (t, _) in lc.TABLE.items()}
    assert seen == want
