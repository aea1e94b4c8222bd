"""What a producer reads of a queue's periodic schedules: ``queue.schedules()``.

The schedules' entries in the queue's ``cron`` hash, read by one script call (``cron/read.lua``)
and shown as :class:`ScheduleInfo`. Pure, and without croniter: the producer (``queue.py``)
imports only this, while declaring schedules and deciding their times is the worker's
(``schedules.py``, ``ops.py``, ``delayq/worker/features/cron.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from delayq.core import Op, QueueCore
from delayq.info import as_bytes, as_str
from delayq.scripts import SCRIPTS
from delayq.timing import ms_to_datetime

# cron_read's reply as cron/read.lua declares it, checked once against the names read below.
_READ = SCRIPTS["cron_read"].reply
_READ.require_row("name", "meta", "state", "score")
_READ_NOW = _READ.at("now")
READ_LIMIT = 10_000  # schedules per queue read in one call


def ms_of(value: Any) -> int | None:
    """A stored time (ms), or None for anything else."""
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Stored:
    """A schedule's entry as read: the exact bytes (for compare-and-set), their decoding
    (empty if undecodable), and where its pending occurrence is."""

    name: str
    raw: bytes
    data: dict[str, Any]
    next_state: str  # scheduled, active, done, dead, aborted, or "" (gone)


@dataclass(frozen=True)
class CronState:
    now_ms: int
    schedules: dict[str, Stored]


def read(core: QueueCore, *, limit: int = READ_LIMIT, now_ms: int | None = None) -> Op[CronState]:
    def parse(r: Any) -> CronState:
        stored = {}
        for name_b, meta, state, _score in _READ.rows(r):
            try:
                name = name_b.decode() if isinstance(name_b, bytes) else str(name_b)
            except UnicodeDecodeError:  # another program's: no schedule of ours, nor one we
                continue  # could name back (what the views show as text is not its name)
            raw = as_bytes(meta)
            try:
                data = json.loads(raw)
            except ValueError:
                data = {}
            if not isinstance(data, dict):
                data = {}
            stored[name] = Stored(name, raw, data, as_str(state))
        return CronState(int(r[_READ_NOW]), stored)

    return core.op("cron_read", {"now": core.now_arg(now_ms), "limit": limit}, [], parse)


def _dt(value: Any) -> datetime | None:
    ms = ms_of(value)
    return ms_to_datetime(ms) if ms is not None else None


@dataclass(frozen=True)
class ScheduleInfo:
    """A schedule as ``delayq cron list`` shows it."""

    name: str
    spec: str
    tz: str | None
    catch_up: str
    max_running: int
    next_at: datetime | None
    next_state: str  # scheduled / active (pending), or "" / done / dead / aborted (repaired soon)
    last_at: datetime | None  # the occurrence time of the last run
    last_started: datetime | None
    last_finished: datetime | None
    last_status: str | None  # running, succeeded, retrying, discarded, dead
    last_error: str | None
    running: int
    skipped: int
    parked_since: datetime | None
    seen: datetime | None

    @classmethod
    def of(cls, st: Stored) -> ScheduleInfo:
        d = st.data
        running = d.get("running")
        return cls(
            name=st.name,
            spec=str(d.get("spec", "?")),
            tz=str(d["tz"]) if "tz" in d else None,
            catch_up=str(d.get("catch_up", "?")),
            max_running=ms_of(d.get("max_running")) or 0,
            next_at=_dt(d.get("next")),
            next_state=st.next_state,
            last_at=_dt(d.get("last")),
            last_started=_dt(d.get("last_start")),
            last_finished=_dt(d.get("last_end")),
            last_status=str(d["last_status"]) if "last_status" in d else None,
            last_error=str(d["last_error"]) if "last_error" in d else None,
            running=len(running) if isinstance(running, dict) else 0,
            skipped=ms_of(d.get("skipped")) or 0,
            parked_since=_dt(d.get("parked")),
            seen=_dt(d.get("seen")),
        )

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in self.__dict__.items():
            out[key] = value.isoformat() if isinstance(value, datetime) else value
        return out


def schedules(state: CronState) -> list[ScheduleInfo]:
    return [ScheduleInfo.of(state.schedules[n]) for n in sorted(state.schedules)]
