"""Script calls of periodic schedules, what is stored about each, and the plan of a worker's
start-up pass. Pure: no I/O (the worker and the CLI run these through a runner). Reading
the stored schedules is ``facade.py``'s (the producer's ``queue.schedules()``).

Each schedule has one JSON entry in the queue's ``cron`` hash: its definition (``kind``,
``spec``, ``tz``, ``catch_up``, ``max_running``, ``sig``), the pending occurrence (``next``,
``next_id``), the last one that ran (``last``, ``last_id``, ``last_start``, ``last_end``,
``last_status``, ``last_error``), the runs holding a lease (``running``), the occurrence
waiting for a slot (``waiting``), skip counts, when a worker declaring it last checked in
(``seen``) and, when no live worker declares it, since when it is ``parked``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from delayq.core import Op, QueueCore
from delayq.cron.facade import CronState, Stored, ms_of
from delayq.cron.schedules import KIND_PREFIX, CronTiming, Decision, Schedule
from delayq.info import as_str
from delayq.scripts import SCRIPTS, Arg
from delayq.spec import TaskSpec
from delayq.text import escape

_SYNC = SCRIPTS["cron_sync"].reply
_SYNC.require_row("applied")

ERROR_CHARS = 500  # of the last error kept in the metadata


def _encode(meta: dict[str, Any]) -> str:
    return json.dumps(meta, separators=(",", ":"), sort_keys=True)


def definition(sched: Schedule) -> dict[str, Any]:
    d: dict[str, Any] = {
        "kind": sched.kind,
        "spec": sched.timing.describe(),
        "catch_up": sched.catch_up,
        "max_running": sched.max_running,
        "sig": sched.sig,
    }
    if isinstance(sched.timing, CronTiming):
        d["tz"] = sched.timing.tz_name
    return d


def occurrence_task(core: QueueCore, sched: Schedule, at_ms: int) -> list[Arg]:
    """id, due and record of an occurrence's task, encoded like any scheduled task."""
    spec = TaskSpec(
        sched.kind, sched.payload(at_ms), at=at_ms / 1000, task_id=sched.occurrence_id(at_ms)
    )
    return core.encode_tasks([spec])[1]


def start(
    core: QueueCore,
    sched: Schedule,
    task_id: str,
    token: int,
    occurrence_ms: int,
    decision: Decision,
    *,
    now_ms: int | None = None,
) -> Op[str]:
    """The occurrence ``task_id`` is starting: "run", "skip", "busy", "waiting" or "lost"."""
    return core.op(
        "cron_next",
        {
            "now": core.now_arg(now_ms),
            "channel": core.keys.wake_channel,
            "name": sched.name,
            "id": task_id,
            "token": token,
            "occurrence": occurrence_ms,
            "max_running": sched.max_running,
            "run": "1" if decision.run else "0",
            "reason": decision.reason,
            "init": _encode(definition(sched)),
        },
        occurrence_task(core, sched, decision.successor),
        as_str,
    )


def outcomes(
    core: QueueCore, items: Sequence[tuple[str, str, str, str]], *, now_ms: int | None = None
) -> Op[int]:
    """items: (schedule name, occurrence id, status, error)."""
    rest: list[Arg] = [x for n, i, s, e in items for x in (n, i, s, escape(e, ERROR_CHARS))]
    return core.op(
        "cron_outcome", {"now": core.now_arg(now_ms), "channel": core.keys.wake_channel}, rest, int
    )


@dataclass(frozen=True)
class Change:
    """One compare-and-set change of a schedule (see cron/sync.lua)."""

    name: str
    expect: bytes
    meta: dict[str, Any] | None  # None: forget the schedule
    cancel: str = ""
    create: list[Arg] = field(default_factory=list)  # id, due, record


def sync(core: QueueCore, changes: Sequence[Change]) -> Op[list[bool]]:
    rest: list[Arg] = []
    for c in changes:
        create = c.create or ["", "", ""]
        meta = "" if c.meta is None else _encode(c.meta)
        rest += [c.name, c.expect, meta, c.cancel, *create]
    return core.op(
        "cron_sync",
        {"channel": core.keys.wake_channel},
        rest,
        lambda r: [int(applied) == 1 for (applied,) in _SYNC.rows(r)],
    )


# -- the start-up pass and the periodic check ------------------------------------------------


def plan(
    core: QueueCore,
    own: Sequence[Schedule],
    state: CronState,
    live_kinds: set[str],
    *,
    startup: bool,
    orphan_grace_ms: int,
    forget_after_ms: int,
) -> list[Change]:
    """What a worker declaring ``own`` changes, given what is stored and the kinds that live
    workers declare.

    Its own schedules: create a missing one (first occurrence after now); at start-up only,
    replace one whose occurrence times changed; recreate a parked one's occurrence; continue
    a chain whose pending occurrence was consumed without running (buried, cancelled) by the
    catch-up policy; otherwise note that a worker still declares it (``seen``). Schedules it
    does not declare: parked (pending occurrence removed) once no live worker declares them
    and none has checked in for ``orphan_grace``; forgotten ``forget_after`` later.
    """
    now = state.now_ms
    changes = [
        _plan_own(core, s, state.schedules.get(s.name), now, startup, orphan_grace_ms) for s in own
    ]
    names = {s.name for s in own}
    for name, st in state.schedules.items():
        if name not in names:
            changes.append(_plan_orphan(st, now, live_kinds, orphan_grace_ms, forget_after_ms))
    return [c for c in changes if c is not None]


def _plan_own(
    core: QueueCore,
    sched: Schedule,
    st: Stored | None,
    now: int,
    startup: bool,
    orphan_grace_ms: int,
) -> Change | None:
    expect = st.raw if st is not None else b""
    data = st.data if st is not None else {}
    defn = definition(sched)
    pending = ms_of(data.get("next"))
    if pending is None or not isinstance(data.get("next_id"), str):
        first = sched.next_after(now)
        meta = {**defn, "next": first, "next_id": sched.occurrence_id(first), "seen": now}
        return Change(sched.name, expect, meta, create=occurrence_task(core, sched, first))
    assert st is not None
    meta = {**data, **(defn if startup else {}), "seen": now}
    if startup and data.get("sig") != sched.sig:
        first = sched.next_after(now)
        meta.update(next=first, next_id=sched.occurrence_id(first))
        meta.pop("parked", None)
        meta.pop("waiting", None)
        create = occurrence_task(core, sched, first)
        return Change(sched.name, expect, meta, cancel=data["next_id"], create=create)
    if data.get("parked") is not None and st.next_state == "":
        # Parked: its occurrence was taken out unrun. Put it back as it was; the catch-up
        # policy decides when it starts how late it is.
        meta.pop("parked", None)
        return Change(sched.name, expect, meta, create=occurrence_task(core, sched, pending))
    if st.next_state in ("", "done", "dead", "aborted"):
        # Consumed without running here (buried unrun, cancelled, aborted, lost): continue the chain
        # as if it had started now.
        nxt = sched.decide(pending, now).successor
        meta.pop("parked", None)
        meta.update(next=nxt, next_id=sched.occurrence_id(nxt))
        return Change(sched.name, expect, meta, create=occurrence_task(core, sched, nxt))
    if data.get("parked") is not None:
        meta.pop("parked", None)
        return Change(sched.name, expect, meta)
    seen = ms_of(data.get("seen")) or 0
    if startup or now - seen > orphan_grace_ms // 4:
        return Change(sched.name, expect, meta)
    return None


def _plan_orphan(
    st: Stored, now: int, live_kinds: set[str], orphan_grace_ms: int, forget_after_ms: int
) -> Change | None:
    data = st.data
    if data.get("kind", KIND_PREFIX + st.name) in live_kinds:
        return None
    if now - (ms_of(data.get("seen")) or 0) < orphan_grace_ms:
        return None
    next_id = data.get("next_id")
    cancel = next_id if isinstance(next_id, str) and st.next_state == "scheduled" else ""
    parked = ms_of(data.get("parked"))
    if parked is None:
        return Change(st.name, st.raw, {**data, "parked": now}, cancel=cancel)
    if now - parked > forget_after_ms:
        return Change(st.name, st.raw, None, cancel=cancel)
    return None
