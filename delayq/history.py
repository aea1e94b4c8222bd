"""The dashboard's history: per-minute counts of outcomes and a lateness histogram. Pure.

Workers write it in the scripts that record outcomes (ack, retry, bury: ``lua/lib/
history.lua``), one update per script call whatever its batch: the script counts the tasks
it acked, retried or buried, and the worker sends the batch's lateness already bucketed
(:func:`encode_lateness`). Each shard keeps one hash (``QueueKeys.history``) of one field per
minute of the server's clock, ``"<succeeded> <discarded> <retried> <dead>[ <i>:<n>]..."``,
trimmed to the queue's ``history_window`` (24 h by default).

Lateness is a histogram of fixed buckets, not a list of values or a quantile sketch: a
minute's p50 and p99 are read from it when shown, and histograms add (the batches of a
minute, the shards of a queue, the minutes of a bar), so the worker sends one small text per
batch and the script merges it without knowing what a percentile is. The buckets grow by
√2 from 0.1 ms (bucket 0: at most 0.1 ms; bucket i: at most 0.1 ms x 2^(i/2); the last one
holds the rest), so a percentile is known within a factor of √2 from 0.1 ms to 30 h with at
most 62 buckets, of which a minute holds only those that occurred.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from delayq.errors import ConfigurationError
from delayq.timing import Duration, config_seconds

DEFAULT_HISTORY_WINDOW = 24 * 3600.0
MAX_HISTORY_WINDOW = 7 * 24 * 3600.0

FIRST_EDGE_S = 0.0001  # bucket 0's upper bound
LAST_BUCKET = 61  # holds everything above 0.1 ms x 2^30 (about 30 h)
_SCALE = 1 / FIRST_EDGE_S
_TOP_EDGE = FIRST_EDGE_S * 2 ** ((LAST_BUCKET - 1) / 2)  # the last bucket's lower bound

# The counters of a minute, in the order they are stored (lib/history.lua's slots).
COUNTERS = ("succeeded", "discarded", "retried", "dead")


def window_minutes(window: Duration) -> int:
    """``history_window`` as the whole minutes a shard keeps (0: none)."""
    s = config_seconds(window, "history_window")
    if s > MAX_HISTORY_WINDOW:
        raise ConfigurationError(
            f"history_window is at most 7 days ({MAX_HISTORY_WINDOW:.0f} s), got {s:g} s: each "
            "shard keeps a field per minute of it"
        )
    return math.ceil(s / 60)


def bucket(late_s: float) -> int:
    """The bucket of a lateness in seconds."""
    if late_s <= FIRST_EDGE_S:
        return 0
    if not late_s <= _TOP_EDGE:  # (infinity too)
        return LAST_BUCKET
    return math.ceil(2 * math.log2(late_s * _SCALE) - 1e-9)


def upper_edge(i: int) -> float:
    """Bucket ``i``'s upper bound in seconds (the last bucket's is infinite)."""
    return math.inf if i >= LAST_BUCKET else FIRST_EDGE_S * 2 ** (i / 2)


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
        bucket's upper bound (so within a factor of √2 above the truth); None if none."""
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


def parse_minute(minute: int, value: bytes | str) -> Minute:
    """A stored field's value (see the module docstring); what cannot be read counts 0."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    m = Minute(minute)
    words = text.split()
    counts = []
    for w in words[:4]:
        try:
            counts.append(int(w))
        except ValueError:
            counts.append(0)
    counts += [0] * (4 - len(counts))
    m.succeeded, m.discarded, m.retried, m.dead = counts
    for w in words[4:]:
        i, _, n = w.partition(":")
        try:
            m.buckets[int(i)] = m.buckets.get(int(i), 0) + int(n)
        except ValueError:
            continue
    return m


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


def merge(parts: Sequence[tuple[int, list[Minute]]]) -> History:
    """The history of a queue from its shards' ``(now_ms, minutes)``."""
    by: dict[int, Minute] = {}
    for _, minutes in parts:
        for m in minutes:
            if m.minute in by:
                by[m.minute].add(m)
            else:
                by[m.minute] = m
    now = max((now for now, _ in parts), default=0)
    return History(now, [by[k] for k in sorted(by)])
