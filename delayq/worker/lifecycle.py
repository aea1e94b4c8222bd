"""A run's life: one table of its states and of the events that move it.

As h11's ``_state.py`` does for a connection, this module is data: the states a
:class:`~delayq.worker.runs.Run` can be in, the events that happen to it, the one table of
which event moves which state where (and what the move hands to the Finisher), and what
each state holds: one of the worker's slots, a place in its kind's count (per-kind caps),
its lease extended by the heartbeat. :meth:`Runs._move <delayq.worker.runs.Runs>` is the one
place that moves a run, and it does what the table says: what a state holds is taken or
given back when the state changes, never decided anywhere else. docs/architecture.md shows
the table, and a test checks that the two agree.

A run is claimed, waits for its time (claimed ahead of it), then for a slot, runs, and ends
finished (its outcome handed over), handed back (released unrun) or lost (its lease gone, or
aborted: nothing written). It waits for its time before a slot, not the other way round: a
slot is held only by a run that can start, so a run due in 20 ms never keeps a slot from one
due now, the count of slots held is the count of handlers running, and the time a run waits
for a slot is the time it was due and could not start, what :data:`~delayq.worker.runs.
MAX_QUEUED_S` bounds. A handler's real end is an event of its own (``returned``): a sync
handler's thread that outlives its attempt (its timeout passed, its lease was lost, it was
aborted) keeps the slot and the kind's place until it returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    import asyncio

    from delayq.leasing import Claimed
    from delayq.task import Task
    from delayq.worker.execute import Executor
    from delayq.worker.outcome import Finisher

# -- states ------------------------------------------------------------------------------

NEW: Final = 0  # made from a claim reply, not yet placed
TIMED: Final = 1  # claimed ahead of its due time: waits on the timer
QUEUED: Final = 2  # due, waits for a slot (handed back if it waits too long)
RUNNING: Final = 3  # holds a slot: its handler runs (or is about to start)
STOPPING: Final = 4  # its lease was lost or it was aborted: its handler is told to stop
OVERRUN: Final = 5  # its attempt is over, but a thread of its handler runs on
DONE: Final = 6  # nothing of it runs or waits: finished, handed back or lost

STATES: Final = ("new", "timed", "queued", "running", "stopping", "overrun", "done")

# -- what a state holds --------------------------------------------------------------------

SLOT: Final = 1  # one of the worker's concurrency slots
COUNTED: Final = 2  # a place in its kind's count, for a kind with a cap
EXTENDED: Final = 4  # its lease is extended by the heartbeat
WAITING: Final = 8  # claimed and not yet started: counts against Runs.allowance

HOLDS: Final = (
    0,  # new
    COUNTED | EXTENDED | WAITING,  # timed
    COUNTED | WAITING,  # queued: no lease extension (it is handed back within lease/6)
    SLOT | COUNTED | EXTENDED,  # running
    SLOT | COUNTED,  # stopping: the lease is gone
    SLOT | COUNTED,  # overrun: its outcome is written (or its lease gone)
    0,  # done
)

# -- events --------------------------------------------------------------------------------

AHEAD: Final = 0  # claimed before its due time
QUEUE: Final = 1  # due, and no slot free
START: Final = 2  # due, and a slot free for it
WAITED: Final = 3  # waited for a slot longer than its allowance
ENDED: Final = 4  # its attempt ended (its outcome handed over), nothing of it running
OUTLIVED: Final = 5  # its attempt ended, and a thread of its handler runs on
RETURNED: Final = 6  # the last thread of its handler that outlived the attempt returned
LOST: Final = 7  # its lease is gone (the heartbeat found it, or it was claimed again)
ABORTED: Final = 8  # queue.abort took it
SHUTDOWN: Final = 9  # the worker stops: what has not started is handed back

EVENTS: Final = (
    "ahead",
    "queue",
    "start",
    "waited",
    "ended",
    "outlived",
    "returned",
    "lost",
    "aborted",
    "shutdown",
)

# -- what a move does besides changing what is held ----------------------------------------

NOTHING: Final = 0
WAIT_TIME: Final = 1  # onto the timer
WAIT_SLOT: Final = 2  # into the queue for a slot (and the hand-back timer)
LAUNCH: Final = 3  # its handler starts
RELEASE: Final = 4  # handed back unrun: a release is written
FORGET: Final = 5  # lost before it started: no longer the task's run here, nothing written
STOP: Final = 6  # lost while running: forgotten, and its handler cancelled or told
TELL: Final = 7  # aborted while a thread runs on: the thread sees task.aborted

EFFECTS: Final = (
    "",
    "waits for its time",
    "waits for a slot",
    "its handler starts",
    "handed back (release)",
    "forgotten, nothing written",
    "forgotten, nothing written; its handler cancelled or told to stop",
    "its handler told it was aborted",
)

# (state, event) -> (new state, effect). Any pair not here changes nothing: an event that
# comes late (a lease reported lost after the run ended, a second abort) is ignored.
TABLE: Final[dict[tuple[int, int], tuple[int, int]]] = {
    (NEW, AHEAD): (TIMED, WAIT_TIME),
    (NEW, QUEUE): (QUEUED, WAIT_SLOT),
    (NEW, START): (RUNNING, LAUNCH),
    (NEW, ABORTED): (DONE, NOTHING),  # its abort was heard before its claim reply came
    (TIMED, QUEUE): (QUEUED, WAIT_SLOT),
    (TIMED, START): (RUNNING, LAUNCH),
    (TIMED, LOST): (DONE, FORGET),
    (TIMED, ABORTED): (DONE, FORGET),
    (TIMED, SHUTDOWN): (DONE, RELEASE),
    (QUEUED, START): (RUNNING, LAUNCH),
    (QUEUED, WAITED): (DONE, RELEASE),
    (QUEUED, LOST): (DONE, FORGET),
    (QUEUED, ABORTED): (DONE, FORGET),
    (QUEUED, SHUTDOWN): (DONE, RELEASE),
    (RUNNING, ENDED): (DONE, NOTHING),
    (RUNNING, OUTLIVED): (OVERRUN, NOTHING),
    (RUNNING, LOST): (STOPPING, STOP),
    (RUNNING, ABORTED): (STOPPING, STOP),
    (STOPPING, ENDED): (DONE, NOTHING),
    (STOPPING, OUTLIVED): (OVERRUN, NOTHING),
    (OVERRUN, RETURNED): (DONE, NOTHING),
    (OVERRUN, ABORTED): (OVERRUN, TELL),
}

# The table as the worker reads it on every run, every move worked out once here: MOVES
# [state][event] is None for a pair that changes nothing, else (new state, and what changes:
# slots held +1/-1/0, runs waiting to start +1/-1/0, lease extended +1 from now/-1 no more/0,
# kind's place taken +1/given back -1/0, effect). Runs._move then does no arithmetic on
# HOLDS: runs start by the ten thousand a second.
Move = tuple[int, int, int, int, int, int]


def _change(was: int, now: int, flag: int) -> int:
    return (1 if now & flag else -1) if (was ^ now) & flag else 0


def _compiled(state: int, event: int) -> Move | None:
    found = TABLE.get((state, event))
    if found is None:
        return None
    new, effect = found
    was, now = HOLDS[state], HOLDS[new]
    slot, waiting = _change(was, now, SLOT), _change(was, now, WAITING)
    return (new, slot, waiting, _change(was, now, EXTENDED), _change(was, now, COUNTED), effect)


MOVES: Final = tuple(
    tuple(_compiled(state, event) for event in range(len(EVENTS))) for state in range(len(STATES))
)


def move(state: int, event: int) -> tuple[int, int] | None:
    """What ``event`` does to a run in ``state``: (new state, effect), None for nothing."""
    return TABLE.get((state, event))


# -- the run ------------------------------------------------------------------------------


class RunLane(Protocol):
    """What Runs needs of a run's lane (:class:`~delayq.worker.lane.Lane`)."""

    executor: Executor
    finisher: Finisher
    by_id: dict[str, Run]  # the current run of each task held
    leases: dict[str, Claimed]  # id -> its claim (token, shard): what the heartbeat extends
    caps: dict[str, int]  # kind -> its cap, for the kinds with one
    of_kind: dict[str, set[Run]]  # capped kind -> its runs counted (lifecycle.COUNTED)


class RunsOf(Protocol):
    """What a run tells the :class:`~delayq.worker.runs.Runs` that holds it."""

    started: int

    def outlived(self, run: Run, fut: asyncio.Future[Any], timeout: float | None) -> None: ...


class Run:
    __slots__ = (
        "at",
        "claimed",
        "finishing",
        "handle",
        "lane",
        "overrun_at",
        "queued_at",
        "runs",
        "state",
        "task",
        "threads",
    )
    # Set when first needed: the loop time it waits for (TIMED); time.monotonic() when it
    # began to wait for a slot (QUEUED), and when the first thread of its handler outlived
    # its call (OVERRUN).
    at: float
    queued_at: float
    overrun_at: float

    def __init__(self, claimed: Claimed, lane: RunLane, runs: RunsOf | None = None) -> None:
        self.claimed = claimed
        self.lane = lane  # the queue it was claimed from
        self.runs = runs
        self.state: int = NEW
        self.handle: asyncio.Task[None] | None = None
        self.task: Task | None = None  # once its handler is called
        self.finishing = False  # an outcome handed to the Finisher, not yet written
        self.threads = 0  # threads of its handler that outlived their call (OVERRUN)

    def started(self, task: Task) -> None:
        """The executor calls its handler with ``task``."""
        self.task = task
        if self.runs is not None:
            self.runs.started += 1

    def outlived(self, fut: asyncio.Future[Any], timeout: float | None) -> None:
        """A thread of its handler runs on past its call (``WorkerContext.call``): past its
        ``timeout``, or (None) the call was cancelled. ``fut`` is done when it returns."""
        if self.runs is not None:
            self.runs.outlived(self, fut, timeout)

    def __repr__(self) -> str:
        return f"Run({self.claimed.id!r}, token {self.claimed.token}, state {self.state})"
