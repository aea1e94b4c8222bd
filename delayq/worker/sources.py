"""The sources the claim loop claims from.

A worker serves one queue or several on one server. Each (queue, shard) pair is a
*source*; the claim loop rotates over the sources and splits its free room between those it
visits, so a busy queue cannot starve a quiet one.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

from delayq.core import QueueCore
from delayq.leasing import Claimed
from delayq.worker.lane import Lane


def interleave(batches: list[list[Claimed]]) -> list[Claimed]:
    """One from each batch in turn: [a1, b1, a2, b2, a3]."""
    return [c for row in itertools.zip_longest(*batches) for c in row if c is not None]


def interleave_lanes(
    batches: list[tuple[Lane, list[Claimed]]],
) -> tuple[list[Claimed], list[Lane]]:
    """:func:`interleave` of batches from several lanes, and each task's lane."""
    rows = itertools.zip_longest(*([(lane, c) for c in got] for lane, got in batches))
    pairs = [p for row in rows for p in row if p is not None]
    return [c for _, c in pairs], [lane for lane, _ in pairs]


class Source(NamedTuple):
    """What the claim loop claims from: one shard of one of the worker's queues."""

    lane: Lane
    shard: int
    core: QueueCore
