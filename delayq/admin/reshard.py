"""Changing a queue's shard count, written once as a plan (``operate.reshard`` runs it).

A queue may change its count only while nothing is waiting (cron occurrences and watched
keys' tasks excepted), running or dead, and no worker is alive: those belong to the shard
their id hashes to under the old count. What the queue still remembers moves to where the
new count looks for it:

- finished tasks kept for the dedupe window (``done`` and ``aborted``, with their records) go
  to their new shards, so an id finished before the change is still not run again after it;
- when the home shard changes (an unsplit queue is split, or a split one joined back into
  one), its cron schedules, watched keys, the expiry watcher's mode, and the waiting cron
  occurrences and watched keys' tasks go to the new home shard.

While it moves, the stored count carries a "moving" marker (``reshard_mark.lua``): a process
that checks the count from then on is refused. A ``Queue`` object checks once, on its first
call, so producers, dashboards and exporters already running are not refused and could write
where neither count looks: stop them before a reshard (docs/operations.md says so). Each
script touches one shard, so a move across a cluster's slots is many calls, each batch put
on its new shard before it is dropped from its old one; a move cut short (a crash, a lost
connection) is finished by running it again with the same count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from delayq.core import Op, QueueCore, SeekRow
from delayq.keys import DEFAULT_PREFIX, HOME_ID_PREFIXES
from delayq.runner import Plan, batch_plan, call
from delayq.scripts import Arg
from delayq.shards import Shards, stored_count, validate_shards

BATCH = 500  # tasks or hash fields per script call


@dataclass(frozen=True)
class ReshardResult:
    ok: bool
    message: str
    old: int = 0
    new: int = 0
    done: int = 0  # finished (done or aborted) tasks moved, with their records
    waiting: int = 0  # waiting cron occurrences and watched keys' tasks moved
    fields: int = 0  # cron schedules, watched keys and expiry settings moved


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


# -- builders -----------------------------------------------------------------------------


def mark_op(root: QueueCore, action: str, move: str = "", count: int | str = "") -> Op[Any]:
    """The stored count and its "moving" marker (``reshard_mark.lua``; on the unsplit
    queue's core, where the count is kept)."""

    def parse(r: Any) -> Any:
        return (_text(r[0]), _text(r[1])) if action == "read" else int(r)

    return root.op("reshard_mark", {"action": action, "move": move, "count": count}, [], parse)


def put_tasks_op(core: QueueCore, state: str, rows: Sequence[SeekRow]) -> Op[int]:
    rest: list[Arg] = []
    for row in rows:
        rest += (
            row.id,
            row.score,
            row.record,
            _bytes(row.error or b""),
            _bytes(row.attempt or b""),
        )
    return core.op("move_tasks", {"mode": "put", "state": state}, rest, int)


def drop_tasks_op(core: QueueCore, state: str, ids: Sequence[str]) -> Op[int]:
    return core.op("move_tasks", {"mode": "drop", "state": state}, list(ids), int)


def fields_op(
    core: QueueCore, mode: str, which: str, items: Sequence[bytes | str | int] = ()
) -> Op[Any]:
    """Read (items: cursor, count; reply: next cursor, flat field, value pairs), put (pairs)
    or drop (fields) a home shard hash: ``cron``, ``xkeys`` or ``expiry``."""

    def parse(r: Any) -> Any:
        if mode == "read":
            return _text(r[0]), [_bytes(x) for x in r[1]]
        return int(r)

    return core.op("move_fields", {"mode": mode, "which": which}, list(items), parse)


# -- the plan -------------------------------------------------------------------------------


def reshard_plan(
    name: str, shards: int, *, prefix: str = DEFAULT_PREFIX, batch: int = BATCH
) -> Plan[ReshardResult]:
    """Move queue ``name`` to ``shards`` shards (see the module's docstring)."""
    want = validate_shards(shards)
    root = Shards(name, 1, prefix=prefix).home
    stored, moving = yield from call(stored_count(root))
    if moving:
        frm, _, to = moving.partition(">")
        if int(to) != want:
            return ReshardResult(
                False,
                f"queue {name!r} is being moved from {frm} to {to} shard(s): finish that "
                f"first (reshard with --shards {to})",
            )
        old_n, resuming = int(frm), True
    else:
        old_n, resuming = stored, False
        if old_n == want:
            return ReshardResult(True, f"queue {name!r} is already split into {want} shard(s)")
    old, new = Shards(name, old_n, prefix=prefix), Shards(name, want, prefix=prefix)
    move = f"{old_n}>{want}"
    if not resuming:
        left = yield from _left(old, batch)
        if left:
            return _refused(name, old_n, want, left)
        if not (yield from call(mark_op(root, "begin", move, old_n))):
            return ReshardResult(
                False, f"queue {name!r}: its shard count changed meanwhile; try again"
            )
    # Under the marker no process that checks the count writes: look again, for a write
    # that came between the first look and the marker.
    left = yield from _left(old, batch)
    if left:
        if not resuming:
            yield from call(mark_op(root, "abort", move))
        return _refused(name, old_n, want, left)
    done, waiting, fields = yield from _carry(old, new, batch)
    yield from call(mark_op(root, "end", move, want))
    return ReshardResult(
        True,
        f"queue {name!r} is split into {want} shard(s) (was {old_n}): moved {done} finished "
        f"task(s), {waiting} waiting cron occurrence(s) or watched key(s), {fields} cron, "
        "watched-key or expiry field(s)",
        old_n,
        want,
        done,
        waiting,
        fields,
    )


def _carry(old: Shards, new: Shards, batch: int) -> Plan[tuple[int, int, int]]:
    """Move what the queue remembers to the new layout: (finished tasks, waiting home tasks,
    home hash fields) moved."""
    done = waiting = fields = 0
    for src in old.cores:
        for ended in ("done", "aborted"):  # both remembered for the dedupe window
            done += yield from _move_tasks(src, new, ended, batch)
    if old.home.keys.cron != new.home.keys.cron:  # the home shard moves
        for src in old.cores:
            waiting += yield from _move_tasks(src, new, "scheduled", batch)
        for which in ("cron", "xkeys", "expiry"):
            fields += yield from _move_fields(old.home, new.home, which, batch)
    return done, waiting, fields


def _refused(name: str, old_n: int, want: int, left: list[str]) -> ReshardResult:
    return ReshardResult(
        False,
        f"queue {name!r} cannot go from {old_n} to {want} shard(s) while it has "
        f"{', '.join(left)}: stop every producer and worker, let the waiting tasks run (or "
        "cancel them), replay or purge the dead ones (delayq dead ...), then run this again",
        old_n,
        want,
    )


def _left(old: Shards, batch: int) -> Plan[list[str]]:
    """What keeps the queue from changing its count, as phrases ([] if nothing)."""
    ops: list[Op[Any]] = [c.stats() for c in old.cores]
    replies = yield from batch_plan([*ops, old.home.workers()])
    stats, workers = replies[:-1], replies[-1]
    left = []
    waiting = sum(s.scheduled for s in stats)
    elsewhere = waiting - stats[0].scheduled
    if elsewhere or (waiting and not (yield from _only_home_tasks(old.home, batch))):
        left.append(f"{waiting} waiting task(s)")
    if active := sum(s.active for s in stats):
        left.append(f"{active} running task(s)")
    if dead := sum(s.dead for s in stats):
        left.append(f"{dead} dead task(s)")
    if alive := sum(1 for w in workers if w.alive):
        left.append(f"{alive} live worker(s)")
    return left


def _only_home_tasks(home: QueueCore, batch: int) -> Plan[bool]:
    """Whether every task waiting on the home shard has a home id (cron occurrences and
    watched keys' tasks, which move with it); stops at the first that has not."""
    after: tuple[str, str] | None = None
    while True:
        rows = yield from call(home.seek("scheduled", after, batch))
        if any(not row.id.startswith(HOME_ID_PREFIXES) for row in rows):
            return False
        if len(rows) < batch:
            return True
        after = (rows[-1].score, rows[-1].id)


def _move_tasks(src: QueueCore, new: Shards, state: str, batch: int) -> Plan[int]:
    """Every task of ``src``'s ``state`` set whose shard under the new count is another,
    moved there: page by page (a cursor, so the tasks that stay are passed over), each page
    put on its new shards, then dropped from this one."""
    moved = 0
    after: tuple[str, str] | None = None
    while True:
        rows = yield from call(src.seek(state, after, batch))
        going: dict[int, list[SeekRow]] = {}
        for row in rows:
            dst = new.of(row.id)
            if dst.keys.tasks != src.keys.tasks:
                going.setdefault(dst.shard, []).append(row)
        if going:
            yield from batch_plan([put_tasks_op(new.cores[i], state, g) for i, g in going.items()])
            ids = [row.id for g in going.values() for row in g]
            moved += yield from call(drop_tasks_op(src, state, ids))
        if len(rows) < batch:
            return moved
        after = (rows[-1].score, rows[-1].id)


def _move_fields(src: QueueCore, dst: QueueCore, which: str, batch: int) -> Plan[int]:
    pairs: dict[bytes, bytes] = {}  # HSCAN may return a field twice
    cursor = "0"
    while True:
        cursor, step = yield from call(fields_op(src, "read", which, [cursor, batch]))
        pairs.update(zip(step[0::2], step[1::2], strict=True))
        if cursor == "0":
            break
    items = [x for pair in pairs.items() for x in pair]
    for i in range(0, len(items), 2 * batch):
        yield from call(fields_op(dst, "put", which, items[i : i + 2 * batch]))
    fields = items[0::2]
    for i in range(0, len(fields), batch):
        yield from call(fields_op(src, "drop", which, fields[i : i + batch]))
    return len(fields)
