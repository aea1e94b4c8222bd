"""The dashboard's history: per-minute counts of outcomes and a lateness histogram. Pure.

Workers write it in the scripts that record outcomes (ack, retry, bury: ``lua/lib/
history.lua``), with no round trip of its own and a few commands per script call whatever
its batch: the script counts what it acked, retried or buried (one ``HINCRBY``), and the
worker sends the batch's start lateness already bucketed (:func:`encode_lateness`), one
``HINCRBY`` per bucket that occurred. Each shard keeps one hash per ten minutes
(``QueueKeys.history(minute)``, named by its first minute), fields ``<minute>:<s|d|r|x>``
(succeeded, discarded, retried, dead) and ``<minute>:<bucket>`` (lateness), which expires
``history_window`` (24 h by default) after its ten minutes end: nothing is trimmed, a minute
is kept for at least the window and at most ten minutes more.

Why these choices (measured: docs/architecture.md, "The dashboard's history"):
``HINCRBY`` leaves the arithmetic and the number formatting to the server; a packed value
per minute, merged in Lua, cost 30 µs a call (Lua formats and parses numbers slowly), and
cjson 11 µs. A hash of ten minutes, named by the worker from its own clock, needs no
trimming (its expiry bounds it), stays small enough for the server's compact encoding (a
listpack: up to 128 fields, ten minutes of about 12) and is read with 146 commands for a
day; a minute's fields land in the hash of the ten minutes the worker thinks it is, and are
read by their minute, so a clock a little off only moves the expiry.

Lateness is a histogram of fixed buckets, not a list of values or a quantile sketch:
histograms add (the batches of a minute, the shards of a queue, the minutes of a bar), so
the server merges them with ``HINCRBY`` and the p50 and p99 are read when shown. The buckets
double from 0.1 ms (bucket 0: at most 0.1 ms; bucket i: at most 0.1 ms x 2^i; the last one
holds the rest), so a percentile is known within a factor of 2 from 0.1 ms to 30 h with at
most 32 buckets, of which a minute holds only those that occurred. Each bucket a batch
touches is one ``HINCRBY``, which is why they are not finer: buckets of √2 touch more (4
instead of 3 for a batch starting within 0.15-0.5 ms), at about 1 µs each.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from delayq.errors import ConfigurationError
from delayq.timing import Duration, config_seconds

DEFAULT_HISTORY_WINDOW = 24 * 3600.0
MAX_HISTORY_WINDOW = 7 * 24 * 3600.0

FIRST_EDGE_S = 0.0001  # bucket 0's upper bound
LAST_BUCKET = 31  # holds everything above 0.1 ms x 2^30 (about 30 h)
_SCALE = 1 / FIRST_EDGE_S
_TOP_EDGE = FIRST_EDGE_S * 2 ** (LAST_BUCKET - 1)  # the last bucket's lower bound


SPAN_MS = 600_000  # the time one hash holds
# The hashes a reader looks at: a day's, the one of now, and the next (a worker whose clock
# runs ahead of the reader's).
READ_SPANS = 24 * 6 + 2


def window_ms(window: Duration) -> int:
    """``history_window`` in ms (0: keep none)."""
    s = config_seconds(window, "history_window")
    if s > MAX_HISTORY_WINDOW:
        raise ConfigurationError(
            f"history_window is at most 7 days ({MAX_HISTORY_WINDOW:.0f} s), got {s:g} s: each "
            "shard keeps a few fields per minute of it"
        )
    return round(s * 1000)


def span_of(now_ms: int) -> int:
    """The first minute (since the epoch) of the hash a write at ``now_ms`` goes to."""
    return now_ms // SPAN_MS * (SPAN_MS // 60_000)


def span_and_ttl(now_ms: int, window: int) -> tuple[int, int]:
    """The hash a write at ``now_ms`` goes to (:func:`span_of`), and the ms it is kept from
    then on: to the end of its ten minutes, then the window (``window`` ms)."""
    start = now_ms // SPAN_MS * SPAN_MS
    return span_of(now_ms), start + SPAN_MS - now_ms + window


def bucket(late_s: float) -> int:
    """The bucket of a lateness in seconds."""
    if late_s <= FIRST_EDGE_S:
        return 0
    if not late_s <= _TOP_EDGE:  # (infinity too)
        return LAST_BUCKET
    return math.ceil(math.log2(late_s * _SCALE) - 1e-9)


def upper_edge(i: int) -> float:
    """Bucket ``i``'s upper bound in seconds (the last bucket's is infinite)."""
    return math.inf if i >= LAST_BUCKET else FIRST_EDGE_S * 2**i


def encode_lateness(lateness: Iterable[float]) -> str:
    """A batch's lateness (seconds; negative: the task never ran) as the scripts' argument:
    ``"<bucket>:<count>"`` pairs, space-separated ("" for none)."""
    counts: dict[int, int] = {}
    for v in lateness:
        if v >= 0:
            i = bucket(v)
            counts[i] = counts.get(i, 0) + 1
    return " ".join(f"{i}:{n}" for i, n in counts.items())


@dataclass
class Minute:
    """One minute of a queue's history (or several merged): its outcomes and lateness."""

    minute: int  # minutes since the epoch (UTC) of its first minute
    succeeded: int = 0
    discarded: int = 0
    retried: int = 0
    dead: int = 0
    buckets: dict[int, int] = field(default_factory=dict)

    @property
    def done(self) -> int:
        return self.succeeded + self.discarded

    @property
    def started(self) -> int:
        """Attempts whose lateness is counted."""
        return sum(self.buckets.values())

    def add(self, other: Minute) -> None:
        self.succeeded += other.succeeded
        self.discarded += other.discarded
        self.retried += other.retried
        self.dead += other.dead
        for i, n in other.buckets.items():
            self.buckets[i] = self.buckets.get(i, 0) + n

    def percentile(self, p: float) -> float | None:
        """The lateness at or below which ``p`` percent of the attempts started, as its
        bucket's upper bound (so within a factor of 2 above the truth); None if none."""
        total = self.started
        if not total:
            return None
        rank = math.ceil(p / 100 * total)
        seen = 0
        for i in sorted(self.buckets):
            seen += self.buckets[i]
            if seen >= rank:
                return upper_edge(i)
        return upper_edge(LAST_BUCKET)  # (not reached)

    def as_dict(self) -> dict[str, Any]:
        p50, p99 = self.percentile(50), self.percentile(99)
        return {
            "minute": self.minute * 60,
            "done": self.done,
            "succeeded": self.succeeded,
            "discarded": self.discarded,
            "retried": self.retried,
            "dead": self.dead,
            "started": self.started,
            "lateness_p50": None if p50 is None or math.isinf(p50) else p50,
            "lateness_p99": None if p99 is None or math.isinf(p99) else p99,
        }


_SLOTS = {b"s": "succeeded", b"d": "discarded", b"r": "retried", b"x": "dead"}


def parse_fields(fields: dict[bytes, bytes], into: dict[int, Minute]) -> None:
    """Add a history hash's fields (``HGETALL``) to ``into``, by minute; a field delayq does
    not write is skipped."""
    for name, value in fields.items():
        minute, _, what = name.partition(b":")
        try:
            m, n = int(minute), int(value)
        except ValueError:
            continue
        got = into.get(m)
        if got is None:
            got = into[m] = Minute(m)
        slot = _SLOTS.get(what)
        if slot is not None:
            setattr(got, slot, getattr(got, slot) + n)
        elif what.isdigit():
            i = int(what)
            got.buckets[i] = got.buckets.get(i, 0) + n


@dataclass
class History:
    """A queue's history, every shard's merged: the minutes that had outcomes, oldest first."""

    now_ms: int
    minutes: list[Minute]

    @property
    def now_minute(self) -> int:
        return self.now_ms // 60_000

    def get(self, minute: int) -> Minute:
        """That minute (empty if nothing happened in it)."""
        for m in self.minutes:
            if m.minute == minute:
                return m
        return Minute(minute)

    def bars(self, minutes_per_bar: int, bars: int) -> list[Minute]:
        """``bars`` consecutive spans of ``minutes_per_bar`` minutes ending with the current
        minute, oldest first, each the sum of its minutes."""
        last = self.now_minute // minutes_per_bar
        out = [Minute((last - bars + 1 + i) * minutes_per_bar) for i in range(bars)]
        first = out[0].minute
        for m in self.minutes:
            j = (m.minute - first) // minutes_per_bar
            if 0 <= j < bars:
                out[j].add(m)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"now": self.now_ms / 1000, "minutes": [m.as_dict() for m in self.minutes]}


def history_of(now_ms: int, hashes: Iterable[dict[bytes, bytes]]) -> History:
    """A queue's history from the history hashes of its shards (``HGETALL`` of each)."""
    by: dict[int, Minute] = {}
    for fields in hashes:
        parse_fields(fields, by)
    return History(now_ms, [by[k] for k in sorted(by)])
