"""Periodic schedules: parsing, occurrence times, ids and catch-up decisions. Pure: no I/O.

An occurrence is an instant (Unix ms). Its task id is ``cron:<name>:<ms>``, the same in every
process, so any number of workers create it once.

Cron expressions are matched on the wall clock of the schedule's zone (croniter on naive
local times), and the mapping to instants is ours, so daylight-saving days are defined here
rather than by croniter's tz handling (which fires a daily ``30 1 * * *`` twice on a
fall-back day):

- a wall time that does not exist (spring forward: 02:30 in New York on a March Sunday)
  fires once, at the instant the clocks jump (03:00 EDT); several such times collapse
  into that one occurrence;
- a wall time that happens twice (fall back: 01:30 in New York on a November Sunday) fires
  once, on its first pass (EDT), unless the expression fires every hour (hour field ``*``):
  then both passes fire, since each is a real hour.

``every()`` intervals are counted from the Unix epoch in absolute time, so zones do not
apply and any two processes agree on the grid.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, cast, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from delayq import check
from delayq.errors import ConfigurationError
from delayq.timing import MAX_DELAY_S, config_seconds

CatchUp = Literal["latest", "all", "skip"]
CATCH_UP_POLICIES: tuple[str, ...] = get_args(CatchUp)

KIND_PREFIX = "cron:"
DEFAULT_MISFIRE_GRACE_S = 60.0
DEFAULT_CATCH_UP_LIMIT = 100
MIN_INTERVAL_MS = 1000

_NAME_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,100}$")
# croniter's hashed (H) and random (R) fields differ between processes: refused.
_NONDETERMINISTIC_RE = re.compile(r"(?<![A-Za-z])[HhRr](?![A-Za-z])")
_MARGIN_MS = 3 * 3600 * 1000  # wider than any daylight-saving shift (at most two hours)
_SCAN_LIMIT = 100_000  # croniter steps per search; far more than any real expression needs


def _utc_ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


def _naive_wall(ms: int, tz: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz).replace(tzinfo=None)


def _offset(ms: int, tz: ZoneInfo) -> timedelta:
    off = datetime.fromtimestamp(ms / 1000, tz).utcoffset()
    return off if off is not None else timedelta(0)


def _transition(lo_ms: int, hi_ms: int, tz: ZoneInfo) -> int:
    """The first instant (whole second) in (lo, hi] whose UTC offset differs from lo's."""
    lo, hi = lo_ms // 1000, -(-hi_ms // 1000)
    before = _offset(lo * 1000, tz)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _offset(mid * 1000, tz) == before:
            lo = mid
        else:
            hi = mid
    return hi * 1000


class CronTiming:
    """Occurrences of a five-field cron expression on the wall clock of a zone."""

    def __init__(self, expression: str, tz: str = "UTC") -> None:
        if not isinstance(expression, str):
            raise ConfigurationError(f"a cron expression is a string, got {expression!r}")
        self.expression = " ".join(expression.split())
        self.tz_name = tz
        self.tz = _zone(tz)
        _check_expression(self.expression)
        self._every_hour = croniter(self.expression).expanded[1] == ["*"]

    def describe(self) -> str:
        return self.expression

    def _first_instant(self, wall: datetime) -> int:
        """The instant a matching wall time fires at (its first pass, or the jump)."""
        a = _utc_ms(wall.replace(tzinfo=self.tz, fold=0))
        b = _utc_ms(wall.replace(tzinfo=self.tz, fold=1))
        if a <= b:
            return a  # unambiguous (a == b) or the first of two passes
        # Nonexistent: fold=0 read it with the offset before the jump (later instant),
        # fold=1 with the one after (earlier); the jump lies between.
        return _transition(b, a, self.tz)

    def next_after(self, t_ms: int) -> int:
        """The first occurrence strictly after ``t_ms``."""
        it = croniter(self.expression, _naive_wall(t_ms, self.tz))
        best: int | None = None
        for _ in range(_SCAN_LIMIT):
            candidate = self._first_instant(it.get_next(datetime))
            if candidate > t_ms:
                best = candidate
                break
        if best is None:
            raise ConfigurationError(f"cron expression {self.expression!r} never fires")
        if self._every_hour:
            second = self._second_pass_after(t_ms)
            if second is not None and second < best:
                best = second
        return best

    def _second_pass_after(self, t_ms: int) -> int | None:
        """An every-hour expression also fires in the repeated hour of a fall-back: the
        first such occurrence after t, if t is near a fold (only there can it come first)."""
        lo, hi = t_ms - _MARGIN_MS, t_ms + _MARGIN_MS
        before, after = _offset(lo, self.tz), _offset(hi, self.tz)
        if after >= before:
            return None
        fold_at = _transition(lo, hi, self.tz)
        size_ms = round((before - after).total_seconds() * 1000)
        if not fold_at - size_ms <= t_ms < fold_at + size_ms:
            return None
        start = max(t_ms, fold_at - 1)
        wall = datetime.fromtimestamp(start / 1000, UTC).replace(tzinfo=None) + after
        nxt = croniter(self.expression, wall).get_next(datetime)
        instant = _utc_ms((nxt - after).replace(tzinfo=UTC))
        return instant if t_ms < instant < fold_at + size_ms else None

    def latest_at_or_before(self, t_ms: int) -> int | None:
        """The last occurrence at or before ``t_ms`` (None if there is none)."""
        near = _offset(t_ms - _MARGIN_MS, self.tz) != _offset(t_ms + _MARGIN_MS, self.tz)
        # Wall times up to t's (plus a margin near a transition, where first passes of later
        # wall times can come before t) are the candidates; _first_instant is monotonic.
        top = _naive_wall(t_ms + (_MARGIN_MS if near else 0), self.tz) + timedelta(microseconds=1)
        it = croniter(self.expression, top)
        found: int | None = None
        try:
            for _ in range(_SCAN_LIMIT):
                candidate = self._first_instant(it.get_prev(datetime))
                if candidate <= t_ms:
                    found = candidate
                    break
        except CroniterError:
            return None
        if found is None:
            return None
        # Second passes of a fold are not among the candidates above: step forward exactly.
        for _ in range(_SCAN_LIMIT):
            nxt = self.next_after(found)
            if nxt > t_ms:
                return found
            found = nxt
        return found


class IntervalTiming:
    """Every ``interval_ms``, on a grid counted from the Unix epoch (absolute time)."""

    tz_name = "UTC"
    tz = ZoneInfo("UTC")

    def __init__(self, interval_ms: int) -> None:
        self.interval_ms = interval_ms

    def describe(self) -> str:
        ms = self.interval_ms
        for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
            if ms % size == 0:
                return f"every {ms // size}{unit}"
        return f"every {ms}ms"

    def next_after(self, t_ms: int) -> int:
        return (t_ms // self.interval_ms + 1) * self.interval_ms

    def latest_at_or_before(self, t_ms: int) -> int | None:
        return t_ms // self.interval_ms * self.interval_ms


Timing = CronTiming | IntervalTiming


@dataclass(frozen=True)
class Decision:
    """What to do with an occurrence that starts now: run it or not, and which occurrence
    comes next (scheduled before the occurrence's function runs)."""

    run: bool
    successor: int
    reason: str = ""


@dataclass(frozen=True)
class Schedule:
    """A validated periodic schedule."""

    name: str
    timing: Timing
    catch_up: CatchUp = "latest"
    max_running: int = 1
    misfire_grace_ms: int = round(DEFAULT_MISFIRE_GRACE_S * 1000)
    catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT

    @property
    def kind(self) -> str:
        return KIND_PREFIX + self.name

    @property
    def sig(self) -> str:
        """Identity of the occurrence times: when it changes, the pending occurrence is
        replaced at the next start. Catch-up and overlap options do not move occurrences."""
        text = f"{self.timing.describe()}|{self.timing.tz_name}"
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def occurrence_id(self, at_ms: int) -> str:
        return f"{self.kind}:{at_ms}"

    def payload(self, at_ms: int) -> dict[str, object]:
        when = datetime.fromtimestamp(at_ms / 1000, self.timing.tz)
        spec = "milliseconds" if at_ms % 1000 else "seconds"
        return {"schedule": self.name, "at": at_ms, "time": when.isoformat(timespec=spec)}

    def next_after(self, t_ms: int) -> int:
        return self.timing.next_after(t_ms)

    def decide(self, occurrence_ms: int, now_ms: int) -> Decision:
        """Apply the catch-up policy to an occurrence starting at ``now_ms``.

        An occurrence is *missed* when the one after it is also due by now (the workers were
        down, or it waited behind a long previous run). Then ``latest`` runs only the latest
        due occurrence, ``all`` runs each (at most ``catch_up_limit`` after an outage) and
        ``skip`` runs none. ``skip`` also drops an occurrence more than ``misfire_grace``
        late, so a daily job whose time passed during an outage does not run hours late.
        """
        timing = self.timing
        s1 = timing.next_after(occurrence_ms)
        late_s = (now_ms - occurrence_ms) / 1000
        if s1 > now_ms:
            if self.catch_up == "skip" and now_ms - occurrence_ms > self.misfire_grace_ms:
                return Decision(False, s1, f"skipped: started {late_s:.1f} s late (catch_up=skip)")
            return Decision(True, s1)
        latest = timing.latest_at_or_before(now_ms)
        if self.catch_up == "latest" and latest is not None:
            return Decision(
                False, latest, f"skipped: occurrence {latest} is due too (catch_up=latest)"
            )
        if self.catch_up != "all":
            return Decision(
                False,
                timing.next_after(now_ms),
                f"skipped: missed, {late_s:.1f} s late (catch_up=skip)",
            )
        # all: run this one and each one after it, unless more than the limit are due.
        count, x = 1, s1  # occurrences due by now, this one included
        while x <= now_ms and count <= self.catch_up_limit:
            x, count = timing.next_after(x), count + 1
        if count <= self.catch_up_limit or latest is None:
            return Decision(True, s1)
        first = latest  # the earliest of the last `catch_up_limit` due occurrences
        for _ in range(self.catch_up_limit - 1):
            prev = timing.latest_at_or_before(first - 1)
            if prev is None or prev <= occurrence_ms:
                break
            first = prev
        return Decision(
            False,
            first,
            f"skipped: more than {self.catch_up_limit} occurrences were missed; "
            "only the latest ones run (catch_up_limit)",
        )


def occurrence_of(task_id: str) -> int | None:
    """The occurrence time encoded in an occurrence's task id."""
    if not task_id.startswith(KIND_PREFIX):
        return None
    _, _, tail = task_id.rpartition(":")
    return int(tail) if tail.isdigit() else None


# -- validation ---------------------------------------------------------------------------


def _zone(tz: object) -> ZoneInfo:
    if not isinstance(tz, str) or not tz:
        raise ConfigurationError(
            f"tz must be an IANA zone name such as 'Asia/Shanghai', not {tz!r}"
        )
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"unknown time zone {tz!r}: use an IANA name such as 'Asia/Shanghai', "
            "'Europe/Berlin' or 'UTC'"
        ) from None


def _check_expression(expression: str) -> None:
    hint = (
        "use five fields, minute hour day-of-month month day-of-week (e.g. '0 2 * * *'), "
        "or a macro such as '@daily'"
    )
    if _NONDETERMINISTIC_RE.search(expression):
        raise ConfigurationError(
            f"cron expression {expression!r} uses H or R (hashed or random fields), which "
            "differ between processes; write the minute and hour out"
        )
    try:
        fields = len(croniter(expression).expanded)
    except CroniterError as e:
        raise ConfigurationError(f"invalid cron expression {expression!r} ({e}); {hint}") from None
    if fields != 5:
        raise ConfigurationError(
            f"cron expression {expression!r} has {fields} fields; {hint}. For schedules "
            "finer than a minute use every(seconds=...)"
        )
    try:
        croniter(expression, datetime(2000, 1, 1)).get_next(datetime)
    except CroniterError:
        raise ConfigurationError(
            f"cron expression {expression!r} never fires (no date matches it)"
        ) from None


def validate_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigurationError(
            f"invalid schedule name {name!r}: use 1-100 characters from letters, digits and "
            "'_.:-', e.g. name='daily-report'"
        )
    return name


def _options(
    catch_up: object, max_running: object, misfire_grace: object, catch_up_limit: object
) -> tuple[CatchUp, int, int, int]:
    if catch_up not in CATCH_UP_POLICIES:
        raise ConfigurationError(
            f"catch_up must be one of {', '.join(map(repr, CATCH_UP_POLICIES))}, got {catch_up!r}"
        )
    running = check.whole(max_running, "max_running", 0, hint=" (0: no limit)")
    grace = config_seconds(misfire_grace, "misfire_grace")  # type: ignore[arg-type]
    limit = check.whole(catch_up_limit, "catch_up_limit", 1)
    return cast(CatchUp, catch_up), running, round(grace * 1000), limit


def cron_schedule(
    name: str,
    expression: str,
    *,
    tz: str = "UTC",
    catch_up: CatchUp = "latest",
    max_running: int = 1,
    misfire_grace: float | timedelta = DEFAULT_MISFIRE_GRACE_S,
    catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT,
) -> Schedule:
    """Validate a cron schedule; raises ConfigurationError with what to write instead."""
    validate_name(name)
    try:
        timing = CronTiming(expression, tz)
    except ConfigurationError as e:
        raise ConfigurationError(f"schedule {name!r}: {e}") from None
    return Schedule(name, timing, *_options(catch_up, max_running, misfire_grace, catch_up_limit))


UNIT_S = {"seconds": 1, "minutes": 60, "hours": 3600}


def interval_ms(
    interval: float | timedelta | None = None,
    *,
    seconds: float | None = None,
    minutes: float | None = None,
    hours: float | None = None,
) -> int:
    """``every()``'s interval in ms: a timedelta or seconds, or seconds=/minutes=/hours=."""
    parts = {"seconds": seconds, "minutes": minutes, "hours": hours}
    given = {k: v for k, v in parts.items() if v is not None}
    if (interval is None) == (not given):
        raise ConfigurationError(
            "every() takes an interval: every(minutes=5), every(seconds=30), "
            "every(hours=1, minutes=30) or every(timedelta(minutes=5))"
        )
    for key, value in given.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 <= value <= MAX_DELAY_S  # (NaN fails both; inf the second)
        ):
            raise ConfigurationError(
                f"every({key}=...) must be a number from 0 to ten years, got {value!r}"
            )
    if interval is not None:
        if isinstance(interval, bool) or not isinstance(interval, int | float | timedelta):
            raise ConfigurationError(
                f"every(interval) takes a timedelta or seconds, not {type(interval).__name__}"
            )
        total = interval.total_seconds() if isinstance(interval, timedelta) else interval
    else:
        total = sum(v * UNIT_S[k] for k, v in given.items())
    if not MIN_INTERVAL_MS <= total * 1000 <= MAX_DELAY_S * 1000:  # (NaN and inf too)
        raise ConfigurationError(
            f"every() interval of {total} s: use whole milliseconds between 1 second and ten years"
        )
    ms = round(total * 1000)
    if abs(ms - total * 1000) > 1e-6:
        raise ConfigurationError(
            f"every() interval of {total} s: use whole milliseconds between 1 second and ten years"
        )
    return ms


def every_schedule(
    name: str,
    every_ms: int,
    *,
    catch_up: CatchUp = "latest",
    max_running: int = 1,
    misfire_grace: float | timedelta = DEFAULT_MISFIRE_GRACE_S,
    catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT,
) -> Schedule:
    validate_name(name)
    return Schedule(
        name,
        IntervalTiming(every_ms),
        *_options(catch_up, max_running, misfire_grace, catch_up_limit),
    )
