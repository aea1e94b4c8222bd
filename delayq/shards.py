"""A queue split over N shards, each under its own hash tag, so a Redis Cluster spreads its
load over the primaries. Pure: which shard holds a task, grouping by shard, adding up.

A task's shard is a stable hash of its id (keys.shard_of), so every process finds it without
asking. Shard 0 is the home shard: worker registrations, cron schedules and watched keys
live there. With one shard (the default) the keys are those of an unsplit queue.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Literal, NamedTuple, TypeVar

from delayq import check
from delayq.core import Op, QueueCore, SeekRow
from delayq.errors import ConfigurationError, InvalidTaskError, raise_for
from delayq.keys import MAX_SHARDS, shard_of
from delayq.protocol import version as protocol
from delayq.scripts import Arg
from delayq.settings import (
    NOT_GIVEN,
    NOTHING_STORED,
    Given,
    QueueSettings,
    ShardCheck,
    Stored,
    effective,
)
from delayq.spec import validate_task_id
from delayq.task import QueueStats, TaskInfo, TaskPage

T = TypeVar("T")


STORED: Literal["stored"] = "stored"  # shards=STORED: the count the queue stored


class StoredCount(NamedTuple):
    """A queue's shard count as stored, 1 when none is (a queue no process stored a count
    for is an unsplit queue), and the move under way (``"<from>><to>"``, or ``""``): while
    ``delayq reshard`` moves it, ``n`` is still the count it moves from."""

    n: int
    moving: str


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def stored_count(root: QueueCore) -> Op[StoredCount]:
    """Read the stored shard count (``reshard_mark.lua``'s read, on the unsplit queue's core:
    ``Shards.root``). The one lookup of it: ``Queue(shards="stored")``, ``Admin`` and
    ``delayq reshard`` use it."""

    def parse(r: Any) -> StoredCount:
        n = _text(r[0])
        if n and not (n.isdigit() and 1 <= int(n) <= MAX_SHARDS):  # (as the Node client says)
            raise ConfigurationError(
                f"queue {root.name!r} stored a shard count of {n}, not one from 1 to the "
                f"protocol's max_shards ({MAX_SHARDS}): no delayq process opens it; its key "
                f"{root.keys.shards} was not written by delayq"
            )
        return StoredCount(int(n) if n else 1, _text(r[1]))

    return root.op("reshard_mark", {"action": "read", "move": "", "count": ""}, [], parse)


def validate_shards(shards: Any) -> int:
    return check.whole(shards, "shards", 1, MAX_SHARDS, hint=' (or "stored", for a Queue)')


def update_op(root: QueueCore, new: Given) -> Op[Stored | int]:
    """Store the settings given (checked by ``settings.given``; None: leave it) with the
    queue (``settings.lua``, on the unsplit queue's core: ``Shards.root``;
    delayq/settings.py). Parses to the settings stored after it, or to the status -1 while
    the queue is being resharded."""
    if new == NOT_GIVEN:
        raise ConfigurationError(
            "update_settings needs at least one of dedupe_window, max_payload and codec"
        )
    args: dict[str, Arg] = {
        "dedupe_ms": "" if new.dedupe_window is None else round(new.dedupe_window * 1000),
        "max_payload": "" if new.max_payload is None else new.max_payload,
        "codec": new.codec or "",
    }

    def parse(reply: Any) -> Stored | int:
        return Stored(*(_text(v) for v in reply)) if isinstance(reply, list) else int(reply)

    return root.op("settings", args, [], parse)


class Shards:
    """A queue's shards, and the settings its calls are built with (delayq/settings.py):
    ``given``, this process's arguments, until the queue's stored ones are read with its
    shard count (:meth:`verify`)."""

    def __init__(
        self, name: str, shards: int, *, given: Given = NOT_GIVEN, **core_options: Any
    ) -> None:
        self.n = validate_shards(shards)
        self.given = given
        self.settings: QueueSettings = effective(name, given, NOTHING_STORED)
        core_options.update(
            codec=self.settings.codec,
            max_payload=self.settings.max_payload,
            dedupe_window=self.settings.dedupe_window,
        )
        self.cores = [
            QueueCore(name, shard=i, shards=self.n, **core_options) for i in range(self.n)
        ]
        self.home = self.cores[0]
        # The unsplit queue's core: where the shard count is kept (the home core if n == 1).
        self.root = self.home if self.n == 1 else QueueCore(name, **core_options)
        # Reads skip the check once a count is stored; writes once the queue is also
        # stamped with its protocol version (a queue from before stamping is stamped by
        # the first write of each queue object, even if a read checked it first).
        self.checked = False
        self.write_checked = False

    def of(self, task_id: str) -> QueueCore:
        if self.n == 1:  # (once per schedule: no hash to take)
            return self.home
        return self.cores[shard_of(task_id, self.n)]

    def group(
        self, items: Iterable[T], task_id: Callable[[T], str]
    ) -> list[tuple[QueueCore, list[T]]]:
        """Items by shard, in shard order; shards with no items left out."""
        if self.n == 1:  # the common case, on the worker's per-task path
            items = list(items)
            return [(self.home, items)] if items else []
        by: dict[int, list[T]] = {}
        for item in items:
            by.setdefault(shard_of(task_id(item), self.n), []).append(item)
        return [(self.cores[i], by[i]) for i in sorted(by)]

    def check_op(self, *, store: bool = True) -> Op[ShardCheck]:
        """Read (or, with ``store``, set once) the stored shard count and the queue's
        protocol version; see :meth:`verify`. Writes store them; reads (get, cancel,
        reschedule) only compare."""
        return self.root.shard_count(self.n, store=store)

    def verify(self, stored: ShardCheck) -> None:
        """Refuse a queue of another protocol major (ProtocolVersionError), then a count
        other than the stored one. Remembered once a count is stored, so each queue object
        pays the check's round trip once (twice when a read checks a queue from before
        protocol versions were stored: the first write stamps it); a read that finds none
        stored (0) passes and checks again next time."""
        protocol.check(self.home.name, stored.protocol)
        if stored.n >= 0:  # (-1, being resharded, answers no settings: refused below)
            self.adopt(stored.settings)
        count = stored.n
        if count == 0:
            return
        raise_for("shards", count, queue=self.home.name, key=self.root.keys.shards)
        if count != self.n:
            name = self.home.name
            raise ConfigurationError(
                f"queue {name!r} is split into {count} shard(s), but was opened with "
                f"shards={self.n}: open it with shards={count}. Every process must use the "
                "same number; to change it, stop them all, drain the queue and run "
                f"`delayq reshard -q {name} --shards N`"
            )
        self.checked = True
        self.write_checked = stored.store or bool(stored.protocol)

    def adopt(self, stored: Stored) -> None:
        """Follow the queue's stored settings (an argument given that disagrees is refused:
        ConfigurationError naming both). Calls built from now on use them; ``settings``
        changes (a new object) only when they differ from those the calls were built with."""
        new = effective(self.home.name, self.given, stored)
        if new != self.settings:
            for core in {id(c): c for c in (*self.cores, self.root)}.values():
                core.adopt(new)
        self.settings = new

    def follow(self, stored: Stored | int, updated: Given) -> QueueSettings:
        """After this process stored settings (``update_settings``: ``updated``, None where
        it left one): follow the queue's from now on, the ones it set included (its
        arguments no longer apply to them). Refuses the status -1 (being resharded)."""
        if isinstance(stored, int):
            raise_for("settings", stored, queue=self.home.name, key=self.root.keys.shards)
            raise ValueError(f"settings.lua answered {stored}")  # (no other status)
        self.given = self.given.but_not(updated)
        self.adopt(stored)
        return self.settings


def add_stats(parts: Sequence[QueueStats]) -> QueueStats:
    """The shards' stats as one queue's."""
    if len(parts) == 1:
        return parts[0]
    counters: dict[str, int] = {}
    for p in parts:
        for k, v in p.counters.items():
            counters[k] = counters.get(k, 0) + v
    heads = [p.next_due_at for p in parts if p.next_due_at is not None]
    leases = [p.next_lease_deadline for p in parts if p.next_lease_deadline is not None]
    return replace(
        parts[0],
        scheduled=sum(p.scheduled for p in parts),
        due=sum(p.due for p in parts),
        active=sum(p.active for p in parts),
        dead=sum(p.dead for p in parts),
        done=sum(p.done for p in parts),
        aborted=sum(p.aborted for p in parts),
        oldest_due_age=max(p.oldest_due_age for p in parts),
        next_due_at=min(heads) if heads else None,
        next_lease_deadline=min(leases) if leases else None,
        counters=counters,
        now=max(p.now for p in parts),
    )


def merge_dead(parts: Sequence[list[TaskInfo]], offset: int, limit: int) -> list[TaskInfo]:
    """Pages of each shard's dead set (each most recent first) as one page of the queue's."""
    if len(parts) == 1:
        return parts[0][offset : offset + limit]
    merged = sorted(
        (t for p in parts for t in p),
        key=lambda t: t.finished_at.timestamp() if t.finished_at else 0.0,
        reverse=True,
    )
    return merged[offset : offset + limit]


# -- keyset paging: a cursor is the (score, id) of a page's last task ------------------------


def encode_cursor(score: str, task_id: str) -> str:
    """A page's cursor as text (for ``after=`` and the dashboard's links): the score exactly
    as the server replied it, so the server reads back the very same number."""
    return f"{score}:{task_id}"


_SCORE_RE = re.compile(r"^-?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$|^-?inf$")


def decode_cursor(cursor: str) -> tuple[str, str]:
    """(score, id) of a cursor :func:`encode_cursor` made; InvalidTaskError if it is not one."""
    score, sep, task_id = cursor.partition(":") if isinstance(cursor, str) else ("", "", "")
    if not sep or not _SCORE_RE.match(score):
        raise InvalidTaskError(
            f"not a page cursor: {str(cursor)[:80]!r} (after= takes a page's next)"
        )
    return score, validate_task_id(task_id)


def merge_page(
    parts: Sequence[list[SeekRow]], state: str, limit: int, info: Callable[[SeekRow], TaskInfo]
) -> TaskPage:
    """Each shard's page after one cursor, as the queue's page: the ``limit`` first in the
    sets' own order ((score, id bytes); the dead set backwards). Each shard gave at most
    ``limit`` rows, whatever the depth; only those kept are decoded (``info``)."""
    if len(parts) == 1:
        merged = parts[0]
    else:
        merged = sorted(
            (row for p in parts for row in p),
            key=lambda row: (float(row.score), row.id.encode()),
            reverse=state == "dead",
        )
    more = len(merged) > limit or any(len(p) == limit for p in parts)
    rows = merged[:limit]
    following = encode_cursor(rows[-1].score, rows[-1].id) if rows and more else None
    return TaskPage([info(row) for row in rows], following)
