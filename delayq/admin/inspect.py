"""Read-only inspection of queues, shared by the CLI, the dashboard and the metrics collector.

Nothing here changes a queue (the actions are in ``operate.py``). Each view is one script
call per queue, and views of several queues go out in one round trip. The builders for the
read-only scripts this module adds (``page``, ``timeline``, ``finished``) are pure, like
those in ``core.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayq.connection import redact, resolve_url, sync_client
from delayq.controls import Controls, RateLimit, backlog_s, merged
from delayq.controls import read as read_controls
from delayq.core import MAX_SEEK, ROWS, Op, QueueCore, check_page
from delayq.errors import ConfigurationError, InvalidTaskError
from delayq.history import READ_SPANS, SPAN_MS, History, history_of, span_of
from delayq.info import as_bytes, as_str
from delayq.keys import DEFAULT_PREFIX, Key, QueueKeys, validate_queue_name
from delayq.queue import Queue
from delayq.runner import SyncRunner, translate
from delayq.scripts import SCRIPTS
from delayq.shards import Shards, add_stats, stored_count
from delayq.task import QueueStats, TaskInfo, TaskPage, WorkerInfo
from delayq.timing import ms_to_datetime

MAX_PAGE = MAX_SEEK  # tasks per page: bounds the script's run time and its reply
MAX_BUCKETS = 500
DISCOVERY_SCAN_CALLS = 1000  # SCAN calls of COUNT 1000: discovery looks at <= 1M keys

PageState = Literal["scheduled", "active"]
# Every key of a queue's tag (not its wake-up channel, which is no key): what Admin.exists
# looks for.
_STORED_KEYS = tuple(
    name
    for name, attr in vars(QueueKeys).items()
    if isinstance(attr, Key) and not name.endswith("_channel")
)


# -- what the views return -------------------------------------------------------------------


@dataclass(frozen=True)
class QueueOverview:
    """One queue at a glance: counts per state, the schedule's head, registered workers."""

    stats: QueueStats
    workers: list[WorkerInfo]
    controls: Controls | None = None  # paused, the rate limit (None: not read)

    @property
    def name(self) -> str:
        return self.stats.queue

    @property
    def paused(self) -> bool:
        return self.controls is not None and self.controls.paused

    @property
    def rate_limit(self) -> RateLimit | None:
        return self.controls.limit if self.controls is not None else None

    @property
    def throttle_backlog(self) -> float | None:
        """Seconds the rate limit needs for the tasks due now (due / rate; None: no limit)."""
        return backlog_s(self.stats.due, self.rate_limit)

    @property
    def live_workers(self) -> list[WorkerInfo]:
        return [w for w in self.workers if w.alive]

    def as_dict(self) -> dict[str, Any]:
        limit = self.rate_limit
        return {
            **self.stats.as_dict(),
            "paused": self.paused,
            "rate_limit": None
            if limit is None
            else {"rate": limit.rate, "per_second": limit.per_second, "burst": limit.burst},
            "throttle_backlog_s": self.throttle_backlog,
            "workers_alive": len(self.live_workers),
            "workers": [w.as_dict() for w in self.workers],
        }


def _ts(when: datetime | None) -> float:
    return when.timestamp() if when is not None else 0.0


@dataclass(frozen=True)
class Timeline:
    """Waiting tasks per time bucket from now on (the dashboard's timeline)."""

    now: datetime
    bucket_seconds: float
    overdue: int
    counts: list[int]
    later: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "now": self.now.isoformat(),
            "bucket_seconds": self.bucket_seconds,
            "overdue": self.overdue,
            "counts": list(self.counts),
            "later": self.later,
        }


@dataclass(frozen=True)
class Finished:
    """A recently finished task: when its last run was due and when it finished."""

    kind: str
    due_at: datetime | None
    finished_at: datetime

    @property
    def due_to_done(self) -> float | None:
        """Seconds from due time to finish: the start's lateness plus the run time."""
        if self.due_at is None:
            return None
        return (self.finished_at - self.due_at).total_seconds()


# -- builders for the read-only scripts ----------------------------------------------------

# Their replies as the scripts declare them ("-- REPLY"), checked once, at import, against
# the names the parsers below unpack.
_PAGE, _TIMELINE, _FINISHED = (SCRIPTS[n].reply for n in ("page", "timeline", "finished"))
_PAGE.require_row(*ROWS)
_TIMELINE.require_row("count")
_NOW, _OVERDUE, _LATER = (_TIMELINE.at(n) for n in ("now", "overdue", "later"))
_FINISHED.require_row("kind", "due", "finished")


def page(
    core: QueueCore, state: PageState, offset: int = 0, limit: int = 100
) -> Op[list[TaskInfo]]:
    """Waiting tasks by due time, or running tasks by lease deadline."""
    if state not in ("scheduled", "active"):
        raise InvalidTaskError(f"page() shows 'scheduled' or 'active' tasks, not {state!r}")
    check_page(offset, limit)

    def parse(r: Any) -> list[TaskInfo]:
        return [
            core.task_info(as_str(id), state, float(score), as_bytes(record or b""), error, attempt)
            for id, score, record, error, attempt in _PAGE.rows(r)
        ]

    return core.op("page", {"state": state, "offset": offset, "limit": limit}, [], parse)


def timeline(
    core: QueueCore, bucket_seconds: float, buckets: int, now_ms: int | None = None
) -> Op[Timeline]:
    if not 1 <= buckets <= MAX_BUCKETS or bucket_seconds < 0.001:
        raise InvalidTaskError(f"a timeline needs 1 to {MAX_BUCKETS} buckets of at least 1 ms each")
    width = round(bucket_seconds * 1000)

    def parse(r: Any) -> Timeline:
        return Timeline(
            now=ms_to_datetime(float(r[_NOW])),
            bucket_seconds=width / 1000,
            overdue=int(r[_OVERDUE]),
            counts=[int(count) for (count,) in _TIMELINE.rows(r)],
            later=int(r[_LATER]),
        )

    now = "" if now_ms is None else int(now_ms)
    return core.op("timeline", {"now": now, "bucket_ms": width, "buckets": buckets}, [], parse)


def finished(core: QueueCore, limit: int = 500) -> Op[list[Finished]]:
    """The most recently finished tasks (kept only for the queue's dedupe window)."""
    check_page(0, limit)

    def parse(r: Any) -> list[Finished]:
        out = []
        for kind, due_ms, finished in _FINISHED.rows(r):
            due = float(due_ms)
            out.append(
                Finished(
                    as_str(kind),
                    ms_to_datetime(due) if due >= 0 else None,
                    ms_to_datetime(float(finished)),
                )
            )
        return out

    return core.op("finished", {"limit": limit}, [], parse)


def overview_ops(shards: Shards) -> list[Op[Any]]:
    """The script calls of a queue's overview (``delayq info``): every shard's stats and
    controls, and the workers (registered on shard 0); run them in one round trip (a sync
    or an asyncio runner's ``run_many``) and give the replies to :func:`overview_of`."""
    cores = shards.cores
    return [*(c.stats() for c in cores), shards.home.workers(), *map(read_controls, cores)]


def overview_of(shards: Shards, replies: Sequence[Any]) -> QueueOverview:
    """The overview from the replies of :func:`overview_ops`, in their order."""
    n = shards.n
    return QueueOverview(add_stats(replies[:n]), replies[n], merged(replies[n + 1 : 2 * n + 1]))


# -- the inspector -----------------------------------------------------------------------------


class Admin:
    """Inspection of the queues on one Redis, from blocking code.

    Args:
        url: Redis URL; default ``DELAYQ_REDIS_URL``, else ``REDIS_URL``, else localhost.
        queues: the queues to show; empty or None: every queue found on the server.
        client: an existing client (``decode_responses=False``) instead of ``url``.
        prefix: the key prefix the queues were created with.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        queues: Sequence[str] | None = None,
        client: redis.Redis | None = None,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        self.url = resolve_url(url)
        self.prefix = prefix
        self._owns_client = client is None
        self.client: redis.Redis = client if client is not None else sync_client(self.url)
        self.runner = SyncRunner(self.client)
        self.explicit = [validate_queue_name(q) for q in queues or []]
        self._queues: dict[str, Queue] = {}

    @property
    def where(self) -> str:
        return redact(self.url)

    def queue(self, name: str) -> Queue:
        """A Queue on this inspector's connection (cached; queues are cheap)."""
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = Queue(
                name,
                url=self.url,
                client=self.client,
                prefix=self.prefix,
                shards="stored",
            )
        return q

    def forget(self, name: str) -> None:
        """Drop the cached Queue of ``name``: the next use reads its shard count again (after
        ``operate.reshard`` changed it)."""
        self._queues.pop(name, None)

    def shard_count(self, name: str) -> int:
        """How many shards the queue is split into, as its first user stored it (1 if none
        did): an inspector reads every shard without being told."""
        return self.runner.run(stored_count(Shards(name, 1, prefix=self.prefix).root)).n

    # -- which queues ---------------------------------------------------------------------------

    def queue_names(self) -> list[str]:
        """The queues given at construction, else those found on the server."""
        return list(self.explicit) if self.explicit else self.discover()

    def discover(self) -> list[str]:
        """Queues that have keys on this server, found with SCAN (never KEYS).

        Looks at no more than about a million keys; on a larger keyspace name the queues.
        On Redis Cluster this sees one node only.
        """
        base = QueueKeys("*", self.prefix).base  # the key authority spells the pattern
        head, _, tail = base.partition("*")
        found: set[str] = set()
        cursor = 0
        try:
            for _ in range(DISCOVERY_SCAN_CALLS):
                cursor, keys = self.client.scan(cursor, match=base + ":*", count=1000)
                for key in keys:
                    name = as_str(key)[len(head) :].partition(tail)[0]
                    try:
                        found.add(validate_queue_name(name))
                    except ValueError:
                        continue  # a shard or another program's key
                if cursor == 0:
                    break
        except (RedisConnectionError, RedisTimeoutError) as e:
            raise translate(e, self.client) from None
        return sorted(found)

    def exists(self, name: str) -> bool:
        """Whether queue ``name`` has ever been written here: any key of its unsplit tag is
        on the server. A producer's first write and a worker's start store its shard count
        there, so a name no process has used is most often a typo (``delayq check`` and
        ``delayq info`` refuse it unless given ``--allow-empty``)."""
        keys = QueueKeys(validate_queue_name(name), self.prefix)
        names = keys.names(_STORED_KEYS)
        try:
            return bool(self.client.exists(*names))
        except (RedisConnectionError, RedisTimeoutError) as e:
            raise translate(e, self.client) from None

    # -- views --------------------------------------------------------------------------------

    def ping(self) -> None:
        """Raise ConnectionFailed if the server cannot be reached."""
        try:
            self.client.ping()
        except (RedisConnectionError, RedisTimeoutError) as e:
            raise translate(e, self.client) from None

    def overviews(self, names: Iterable[str] | None = None) -> list[QueueOverview]:
        """Stats, workers and controls of each queue, all in one round trip."""
        queues = [self.queue(n) for n in (self.queue_names() if names is None else names)]
        if not queues:
            return []
        ops: list[Op[Any]] = []
        for q in queues:
            ops += overview_ops(q.shards)
        replies = self.runner.run_many(ops)
        out, i = [], 0
        for q in queues:
            n = len(overview_ops(q.shards))
            out.append(overview_of(q.shards, replies[i : i + n]))
            i += n
        return out

    def overview(self, name: str) -> QueueOverview:
        return self.overviews([name])[0]

    def tasks(
        self, name: str, state: PageState, offset: int = 0, limit: int = 100
    ) -> list[TaskInfo]:
        """Waiting tasks (by due time) or running ones (by lease deadline). On a sharded
        queue each shard reads ``offset + limit`` (at most 1,000): page deep with
        :meth:`page`."""
        cores = self.queue(name).shards.cores
        if len(cores) == 1:
            return self.runner.run(page(cores[0], state, offset, limit))
        parts = self.runner.run_many([page(c, state, 0, offset + limit) for c in cores])

        def when(t: TaskInfo) -> float:
            return _ts(t.due_at if state == "scheduled" else t.lease_deadline)

        merged = sorted((t for p in parts for t in p), key=when)
        return merged[offset : offset + limit]

    def page(self, name: str, state: str, limit: int = 100, after: str | None = None) -> TaskPage:
        """A page of tasks in ``state`` after the cursor ``after`` (keyset paging): as cheap
        deep in a sharded queue as on its first page. See ``Queue.page``."""
        return self.queue(name).page(state, limit=limit, after=after)

    def dead(self, name: str, offset: int = 0, limit: int = 100) -> list[TaskInfo]:
        """Dead tasks, most recent first, with their reasons."""
        check_page(offset, limit)
        return self.queue(name).dead(offset, limit)

    def timeline(self, name: str, bucket_seconds: float = 60, buckets: int = 60) -> Timeline:
        cores = self.queue(name).shards.cores
        parts = self.runner.run_many([timeline(c, bucket_seconds, buckets) for c in cores])
        first = parts[0]
        return Timeline(
            now=max(p.now for p in parts),
            bucket_seconds=first.bucket_seconds,
            overdue=sum(p.overdue for p in parts),
            counts=[sum(c) for c in zip(*(p.counts for p in parts), strict=True)],
            later=sum(p.later for p in parts),
        )

    def finished(self, name: str, limit: int = 500) -> list[Finished]:
        cores = self.queue(name).shards.cores
        parts = self.runner.run_many([finished(c, limit) for c in cores])
        merged = sorted((f for p in parts for f in p), key=lambda f: f.finished_at, reverse=True)
        return merged[:limit]

    def history(self, name: str) -> History:
        """The queue's per-minute outcomes and lateness (every shard's summed), as workers
        wrote them over its ``history_window``: the dashboard's history charts."""
        cores = self.queue(name).shards.cores
        try:
            now_s, now_us = self.client.time()
            now_ms = now_s * 1000 + now_us // 1000
            step = SPAN_MS // 60_000
            last = span_of(now_ms) + step  # (a worker whose clock is ahead)
            pipe = self.client.pipeline(transaction=False)
            for core in cores:
                for span in range(last - (READ_SPANS - 1) * step, last + 1, step):
                    pipe.hgetall(core.keys.history(span))
            hashes = pipe.execute()
        except (RedisConnectionError, RedisTimeoutError) as e:
            raise translate(e, self.client) from None
        return history_of(now_ms, hashes)

    def task(self, name: str, task_id: str) -> TaskInfo | None:
        return self.queue(name).get(task_id)

    def find_task(self, task_id: str, names: Iterable[str] | None = None) -> list[TaskInfo]:
        """Look a task id up in several queues at once (one round trip). Looking in every
        queue found (``names`` None), one that cannot be opened (a shard count or protocol
        version no delayq wrote) is passed over, not a failure of the search."""
        queues = []
        for n in self.queue_names() if names is None else names:
            try:
                queues.append(self.queue(n))
            except ConfigurationError:
                if names is not None:
                    raise
        cores = [q.shards.of(task_id) for q in queues]
        if not cores:
            return []
        replies = self.runner.run_many([c.get(task_id) for c in cores])
        return [r for r in replies if r is not None]

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
