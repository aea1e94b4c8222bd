"""Every Redis key and channel name delayq uses, in one place.

All keys of one queue shard share the hash tag ``{<shard>}`` so every Lua script touches
keys of a single Cluster slot. Nothing outside this module spells a key.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import overload

DEFAULT_PREFIX = "dq"

_NAME_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,100}$")


def validate_queue_name(name: str) -> str:
    """Refuse names that would break the hash tag or be unreadable in ``redis-cli``."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"invalid queue name {name!r}: use 1-100 characters from letters, digits and "
            "'_.:-' (braces and '#' are reserved for hash tags and shards)"
        )
    return name


MAX_SHARDS = 1024
# Ids that stay on shard 0 of a sharded queue: a cron occurrence writes its successor, and a
# watched key's task its bookkeeping, in the same script, so they share shard 0's slot.
HOME_ID_PREFIXES = ("cron:", "x:")


def shard_name(queue: str, index: int, shards: int) -> str:
    """The hash tag of shard ``index``: the queue's own name when it is not split."""
    return queue if shards == 1 else f"{queue}#{index}"


def shard_of(task_id: str, shards: int) -> int:
    """A task's shard: a stable hash of its id (CRC-32), the same in every process."""
    if shards == 1 or task_id.startswith(HOME_ID_PREFIXES):
        return 0
    return zlib.crc32(task_id.encode()) % shards


class Key:
    """One key of a queue shard, named after its attribute: ``QueueKeys(...).scheduled`` is
    ``dq:{orders}:scheduled``. The Lua headers name keys by attribute (``-- KEYS[1]
    scheduled``), and the script loader checks each name is a ``Key`` of ``QueueKeys``."""

    def __init__(self, doc: str, *, suffix: str | None = None) -> None:
        self.__doc__ = doc
        self.suffix = suffix

    def __set_name__(self, owner: type, name: str) -> None:
        self.suffix = self.suffix or name
        self.name = name

    @overload
    def __get__(self, keys: None, owner: type) -> Key: ...
    @overload
    def __get__(self, keys: QueueKeys, owner: type) -> str: ...
    def __get__(self, keys: QueueKeys | None, owner: type) -> Key | str:
        if keys is None:
            return self
        # Made once per QueueKeys: kept in its __dict__, which is read before this
        # descriptor from then on (several keys are read on every call).
        name = keys.__dict__[self.name] = f"{keys.base}:{self.suffix}"
        return name


@dataclass(frozen=True)
class QueueKeys:
    """Key names of one queue shard.

    Attribute names are what the Lua headers refer to (``-- KEYS[1] scheduled``), so the
    script loader can build each script's KEYS list from its header.
    """

    shard: str
    prefix: str = DEFAULT_PREFIX

    def names(self, attributes: tuple[str, ...]) -> list[str]:
        """Key names for a script's KEYS header, cached: this runs on every call."""
        cache: dict[tuple[str, ...], list[str]] = self.__dict__.setdefault("_names", {})
        names = cache.get(attributes)
        if names is None:
            names = cache[attributes] = [getattr(self, a) for a in attributes]
        return list(names)

    @property
    def base(self) -> str:
        return f"{self.prefix}:{{{self.shard}}}"

    scheduled = Key("ZSET task id -> due time (ms, server clock).")
    active = Key("ZSET task id -> lease deadline (ms).")
    dead = Key("ZSET task id -> time it died (ms).")
    done = Key("ZSET task id -> time it finished (ms); kept for the dedupe window.")
    aborted = Key(
        "ZSET task id -> time it was aborted (ms; queue.abort); kept for the dedupe window, "
        "forgotten by later aborts. Absent until a task is aborted."
    )
    cancelled = Key(
        "ZSET task id -> time it was cancelled (ms; queue.cancel): a tombstone, no record, "
        "kept for the dedupe window and forgotten by later cancels; dropped when the id is "
        "scheduled again. Absent until a task is cancelled."
    )
    tasks = Key("HASH task id -> record (JSON header, newline, encoded payload).")
    attempts = Key(
        "HASH task id -> '<token> <attempt> <due>' of its current or last claim; apart from the "
        "record so that a claim writes these few bytes instead of rewriting the record."
    )
    errors = Key("HASH task id -> last error text (only for tasks that failed at least once).")
    results = Key(
        "HASH task id -> what its handler returned (JSON text), beside its done tombstone for "
        "the dedupe window; only tasks whose handler returned something other than None."
    )
    kinds = Key(
        "HASH of the codes finished tasks' tombstones name their kinds by: ``k:<kind>`` -> "
        "code, ``c:<code>`` -> kind, ``n`` the last code given. One entry per kind ever "
        "finished on the shard."
    )
    waits = Key(
        "ZSET task id -> until when (ms) someone waits for it to finish (queue.wait); a script "
        "that finishes a task publishes on the finished channel only when its id is here."
    )
    stats = Key(
        "HASH of counters (scheduled, succeeded, retried, dead, ...) and the claim sequence."
    )
    shards = Key(
        "HASH on the unsplit queue's tag, field ``n``: into how many shards the queue is split, "
        "stored by the first process to use it, so one opening it with another number is "
        "refused instead of writing where the others do not look; field ``protocol``: the "
        "protocol version the queue speaks (delayq.protocol.version), stamped by the first "
        "write; field ``moving``: set while ``delayq reshard`` moves the queue."
    )
    workers = Key("HASH worker id -> JSON (host, pid, concurrency, in flight, started ...).")
    workers_seen = Key("ZSET worker id -> when it last claimed or heartbeat (ms).")
    control = Key(
        "HASH of the shard's admission controls, read by every claim: ``paused``; the rate "
        "limit's share of this shard (``rate`` tokens per ms, ``burst``) and its bucket "
        "(``tokens`` at ``ts``); the queue-wide limit as set (``limit``, ``limit_burst``); "
        "``prio``: set while the ``prio`` index may hold tasks. "
        "Absent when none of these is set."
    )
    prio = Key(
        "ZSET task id -> (10 - priority) * 1e13 + due time (ms): the waiting tasks scheduled "
        "with a priority (1-9), an index beside ``scheduled`` (which stays the truth of what "
        "waits and until when; claim repairs an entry that disagrees). Absent while no task "
        "has one; the control hash's field ``prio`` says when it may hold any."
    )
    cron = Key("HASH schedule name -> JSON: definition, next and last occurrence, last outcome.")
    xkeys = Key("HASH watched key -> id of the task that fires when it expires.")
    expiry = Key("HASH describing the expiry watcher (mode: notifications on, or timer and scan).")
    wake_channel = Key(
        "Pub/sub channel on which producers announce a new earliest due time.",
        suffix="wake",
    )
    finished_channel = Key(
        "Pub/sub channel on which a task someone waits for (``waits``) is announced when it "
        "finishes (done, dead or aborted): its id. Workers do not listen to it.",
        suffix="finished",
    )

    def idempotency(self, digest: str) -> str:
        """STRING of one ``Idempotency-Key`` sent to the HTTP API (``digest``: the key's
        SHA-256, hex): ``p`` and the body's digest while its request runs (60 s at most),
        then ``d``, the digest and the first answer, kept for the dedupe window. Written
        only by the idem_begin and idem_end scripts, on the queue's (shard 0's) tag."""
        return f"{self.base}:idem:{digest}"

    def history(self, minute: int) -> str:
        """HASH of the dashboard's history for the ten minutes from ``minute`` (since the
        epoch, by the writing worker's clock): fields ``<minute>:s``, ``:d``, ``:r`` and
        ``:x`` (succeeded, discarded, retried, dead) and ``<minute>:<bucket>`` (starts per
        lateness bucket, delayq/history.py), counted by ack, retry and bury; it expires the
        queue's ``history_window`` after its ten minutes end. Absent until a worker writes
        one."""
        return f"{self.base}:history:{minute}"

    def expire_gate(self, key: str) -> str:
        """Short-lived marker that lets one worker of many act on a foreign key's expiry."""
        return f"{self.base}:xgate:{key}"
