"""The pure core of a queue: one builder per operation. No I/O.

Every public operation is one script call. A builder validates its input and returns an
:class:`Op` — script, keys, arguments and a reply parser — that the sync and asyncio
runners execute, so the logic exists once for both clients. What is scheduled, and its
checks, is ``spec.py``'s; reading what the scripts reply about tasks, ``info.py``'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, NamedTuple, TypeVar, cast

from delayq import check
from delayq.codec import (
    DEFAULT_MAX_PAYLOAD,
    DEFAULT_MAX_RESULT,
    Codec,
    KeepFinished,
    check_keep_finished,
    encode_headers,
    encode_payload,
    get_codec,
    header_end,
    record_prefix,
)
from delayq.errors import ConfigurationError, InvalidTaskError
from delayq.history import DEFAULT_HISTORY_WINDOW, window_ms
from delayq.info import as_bytes, as_str, parse_worker, task_info
from delayq.keys import DEFAULT_PREFIX, QueueKeys, shard_name, validate_queue_name
from delayq.protocol.version import PROTOCOL_VERSION
from delayq.scripts import SCRIPTS, Arg, Script
from delayq.settings import (
    DEFAULT_DEDUPE_WINDOW,
    QueueSettings,
    ShardCheck,
    read_check,
    write_check,
)
from delayq.spec import (
    CheckedSpec,
    TaskSpec,
    plain_dues,
    priority_due,
    reschedule_due,
    task_ids,
    validate_kind,
    validate_max_attempts,
    validate_task_id,
)
from delayq.task import QueueStats, Scheduled, TaskInfo, WorkerInfo
from delayq.timing import Clock, Duration, due_spec, ms_to_datetime, seconds, stored_due_ms

T = TypeVar("T")

REPLY_BATCH = 1000  # ids per call for bulk operations on the dead set
# dead() has always taken long pages (a test harness reads 10,000 ids at once); the views'
# pages and seek() take at most MAX_SEEK.
MAX_DEAD_PAGE = 10_000
MAX_SEEK = 1000  # tasks per page of seek(): bounds the script's run time and its reply
SEEK_STATES = ("scheduled", "active", "done", "dead", "aborted")
# Each abort (cancel) forgets up to this many aborted records (tombstones) past the window.
ABORT_TRIM = 100


# The replies of the scripts read here, as their headers declare them ("-- REPLY"), checked
# once at import against the names the decoders below unpack.
ROWS = ("id", "score", "record", "error", "attempt")  # a task as the views read it
SCRIPTS["schedule"].reply.require_row("status")  # one code per task: Scheduled.from_replies
if SCRIPTS["schedule"].reply.tails != ("now",):  # then the now it ran at
    raise ValueError("schedule.lua's reply ends with something else than {now}")
_NEW = SCRIPTS["schedule_new"]  # its call is laid out by hand (QueueCore.schedule_new):
if _NEW.arg_names != ("now", "channel", "id", "due", "record") or _NEW.variadic:
    raise ValueError(f"schedule_new.lua takes ARGV {_NEW.arg_names}; core.py sends others")
_NEW.reply.require_head("status", "now")
_RESCHEDULE = SCRIPTS["reschedule"].reply
if _RESCHEDULE.scalars != ("moved",):
    raise ValueError(f"reschedule.lua replies {_RESCHEDULE.text!r}; core.py reads moved")
_RESCHEDULE.require_head("moved", "now")
_GET = SCRIPTS["get"].reply
_GET.require_head("state", "score", "record", "error", "attempt", "result")
_STATS = SCRIPTS["stats"].reply
_STATS_HEAD = "now scheduled due active dead done head_due next_lease expiry_mode aborted"
_STATS.require_head(*_STATS_HEAD.split())
_STATS.require_row("name", "value")
SCRIPTS["shards"].reply.require_head("count", "protocol", "dedupe_ms", "max_payload", "codec")
SCRIPTS["settings"].reply.require_head("dedupe_ms", "max_payload", "codec")
_WORKERS = SCRIPTS["workers"].reply
_WORKERS.require_row("id", "seen", "info")
_WORKERS_NOW = _WORKERS.at("now")
_DEAD, _SEEK = SCRIPTS["dead"].reply, SCRIPTS["seek"].reply
for _reply in (_DEAD, _SEEK, SCRIPTS["page"].reply):
    _reply.require_row(*ROWS)


@dataclass(frozen=True, init=False)
class Op(Generic[T]):
    """One script call: what to run and how to read its reply."""

    script: Script
    keys: list[str]
    args: list[Arg]
    parse: Callable[[Any], T]

    def __init__(
        self, script: Script, keys: list[str], args: list[Arg], parse: Callable[[Any], T]
    ) -> None:
        # One per call made: the fields set as TaskSpec sets its own (no setattr per field).
        fields = self.__dict__
        fields["script"], fields["keys"] = script, keys
        fields["args"], fields["parse"] = args, parse


class SeekRow(NamedTuple):
    """One task of a ``seek`` page as the script returned it: the score exactly as replied
    (a cursor carries it back), the rest undecoded."""

    id: str
    score: str
    record: bytes
    error: Any
    attempt: Any


def check_page(offset: Any, limit: Any, most: int = MAX_SEEK) -> None:
    """A page by offset: offset >= 0 and 1 <= limit <= ``most``, so a script's run time and
    its reply stay bounded (page deeper with a cursor: Queue.page)."""
    for name, value, low, high in (("offset", offset, 0, None), ("limit", limit, 1, most)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < low
            or (high is not None and value > high)
        ):
            raise InvalidTaskError(
                f"a page needs offset >= 0 and 1 <= limit <= {most}, got {name}={value!r}; "
                "walk a longer list with Queue.page(state, after=cursor)"
            )


def _ms_or_none(value: Any) -> datetime | None:
    v = float(value)
    return None if v < 0 else ms_to_datetime(v)


VIRTUAL_KEY_GRACE_MS = 86_400_000  # see QueueCore.server_ms


class QueueCore:
    """Validates input and builds the script calls of one queue shard."""

    def __init__(
        self,
        name: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        codec: str = "json",
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        dedupe_window: Duration = DEFAULT_DEDUPE_WINDOW,
        history_window: Duration = DEFAULT_HISTORY_WINDOW,
        shard: int = 0,
        shards: int = 1,
        clock: Clock | None = None,
        keep_finished: KeepFinished = "tombstone",
        max_result: int = DEFAULT_MAX_RESULT,
    ) -> None:
        try:
            self.name = validate_queue_name(name)
        except ValueError as e:  # (keys.py knows no delayq error: errors.py needs it)
            raise ConfigurationError(str(e)) from None
        self.shard = shard
        self.keys = QueueKeys(shard_name(name, shard, shards), check.text(prefix, "prefix"))
        self.codec: Codec = get_codec(codec)
        self.codecs: dict[str, Codec] = {self.codec.name: self.codec}
        self.max_payload = check.whole(
            max_payload, "max_payload", 1, error=InvalidTaskError, hint=" (bytes)"
        )
        self.dedupe_ms = round(seconds(dedupe_window, "dedupe_window") * 1000)
        self.keep_finished = check_keep_finished(keep_finished)
        self.max_result = check.whole(
            max_result, "max_result", 1, error=ConfigurationError, hint=" (bytes)"
        )
        self.history_ms = window_ms(history_window)  # the dashboard's, past its 10 minutes
        self._prefixes: dict[tuple[Any, ...], bytes] = {}  # (kind, max_attempts[, priority])
        self._schedule_heads: dict[tuple[bool, bool], Op[Any]] = {}
        self._new_keys: list[str] | None = None
        self.clock = clock

    def adopt(self, settings: QueueSettings) -> None:
        """Follow the queue's settings (read with its shard count: ``Shards.verify``): the
        codec, the payload limit and the dedupe window of every call built from now on."""
        self.codec = self.codecs.get(settings.codec) or get_codec(settings.codec)
        self.codecs[self.codec.name] = self.codec
        self.max_payload = settings.max_payload
        self.dedupe_ms = settings.dedupe_ms
        self._prefixes.clear()  # (they name the codec)
        self._schedule_heads.clear()  # (they carry the dedupe window)

    def now_arg(self, now_ms: int | None = None) -> str | int:
        """A script's ``now`` argument: the given ms, else the queue's clock when it has one
        (a test's virtual clock), else empty: the server's TIME."""
        if now_ms is not None:
            return int(now_ms)
        clock = self.clock
        return "" if clock is None else clock.now_ms()

    def wall_ms(self) -> int:
        """Now as Python takes it (a record's created time): the queue's clock, else this
        machine's."""
        clock = self.clock
        return int(time.time() * 1000) if clock is None else clock.now_ms()

    def server_ms(self, ms: int) -> int:
        """A watched key's deadline as its PXAT on the server's clock: the same, unless the
        queue has a virtual clock. Then the key is expired by ``drain()`` when the virtual
        clock reaches its deadline, never by Redis in real time (a test may take longer
        than a short TTL): Redis only removes it a day after its virtual TTL would have
        ended in real time, so a test server does not keep it for ever."""
        clock = self.clock
        if clock is None:
            return ms
        return ms - clock.now_ms() + int(time.time() * 1000) + VIRTUAL_KEY_GRACE_MS

    def op(
        self,
        name: str,
        args: dict[str, Arg],
        rest: list[Arg],
        parse: Callable[[Any], T],
        dynamic: dict[str, str] | None = None,
    ) -> Op[T]:
        script = SCRIPTS[name]
        keys, argv = script.keys_and_args(self.keys, args, rest, dynamic)
        return Op(script, keys, argv, parse)

    # -- producing ---------------------------------------------------------------------

    def _prefix(self, kind: str, max_attempts: int, priority: int = 0) -> bytes:
        """Validated kind -> cached header prefix (most queues have a handful of kinds)."""
        key = (kind, max_attempts, priority) if priority else (kind, max_attempts)
        # Looked up only for an int: True == 1 and 1.0 == 1 hash alike, and must be refused.
        prefix = self._prefixes.get(key) if type(max_attempts) is int else None
        if prefix is None:
            validate_kind(kind)
            validate_max_attempts(max_attempts)
            if len(self._prefixes) > 1000:
                self._prefixes.clear()
            fmt = self.codec.name
            prefix = record_prefix(kind, max_attempts=max_attempts, fmt=fmt, priority=priority)
            self._prefixes[key] = prefix
        return prefix

    def encode_tasks(
        self, specs: Sequence[TaskSpec], ids: Sequence[str] | None = None
    ) -> tuple[list[str], list[Arg]]:
        """Validate and encode tasks: (ids, flat id/due/record triples). Raises on the first
        bad task, before anything is sent.

        ``ids``: each task's id, from :func:`task_ids` (``schedule_many`` makes them before
        it groups tasks by shard); without them, the same is done here. A
        :class:`CheckedSpec` is not checked again: only its payload, by encoding it."""
        if ids is None:
            ids = task_ids(specs)
        created = str(self.wall_ms()).encode()
        # A record is its kind's prefix, the rest of its header line and its payload: the
        # format is codec.py's (record_prefix, header_end). The end of a task's without
        # headers is made once per call, for the first such task.
        end = b""
        encode, limit, prefixes = self.codec.encode, self.max_payload, self._prefixes
        rest: list[Arg] = []
        for spec, tid in zip(specs, ids, strict=True):
            attempts = spec.max_attempts
            prefix = (
                type(attempts) is int and prefixes.get((spec.kind, attempts))
            ) or self._prefix(spec.kind, attempts)
            data = encode(spec.payload)
            if len(data) > limit:  # (encode_payload's check, and its error)
                encode_payload(self.codec, spec.payload, limit)
            if type(spec) is CheckedSpec:  # (exactly: a subclass may check nothing)
                head, due = spec.header_field, spec.due
            else:
                head = b"" if spec.headers is None else encode_headers(spec.headers)
                due = due_spec(spec.delay, spec.at)
            if spec.priority is not None:  # its record's "p" (1-9) and due "p<N>:<due>"
                p, due = priority_due(spec.priority, due)
                prefix = self._prefix(spec.kind, attempts, p) if p else prefix
            if head:
                rest += (tid, due, prefix + header_end(created, head) + data)
            else:
                rest += (tid, due, prefix + (end or (end := header_end(created))) + data)
        return ids if type(ids) is list else list(ids), rest  # (a caller's list is its own)

    def schedule(
        self,
        specs: Sequence[TaskSpec],
        *,
        replace: bool = False,
        durable: bool = False,
        now_ms: int | None = None,
        ids: Sequence[str] | None = None,
    ) -> Op[list[str]]:
        """Parses to a :class:`Scheduled` per task, or to the bare ids when there is no
        reply (a round trip that failed: ConnectionFailed lists them as unconfirmed).
        ``ids``: as :meth:`encode_tasks` takes them."""
        ids, rest = self.encode_tasks(specs, ids)

        def parse(reply: Any) -> list[str]:
            if reply is None:
                return ids
            n = len(ids)  # (the statuses, then the now the script ran at)
            dues = plain_dues(cast(list[str], rest[1::3]))  # (each task's due_spec)
            scheduled = Scheduled.from_replies(ids, reply[:n], dues, reply[n])
            return cast(list[str], scheduled)  # each one is a str

        now = self.now_arg(now_ms)
        head = self._schedule_heads.get((replace, durable)) if now == "" else None
        if head is None:
            # The keys and the arguments before the tasks, laid out by the script's header.
            # On the server's clock (no "now" given) they are the same on every call, so
            # they are made once per (replace, durable).
            head = self.op(
                "schedule",
                {
                    "now": now,
                    "dedupe_ms": self.dedupe_ms,
                    "replace": "1" if replace else "0",
                    "channel": self.keys.wake_channel,
                    "durable": "1" if durable else "0",
                },
                [],
                parse,
            )
            if now == "":
                self._schedule_heads[(replace, durable)] = head
        return Op(head.script, list(head.keys), head.args + rest, parse)

    def schedule_new(
        self, spec: TaskSpec, task_id: str, *, now_ms: int | None = None
    ) -> Op[Scheduled]:
        """One task whose id ``task_id`` was just made (:func:`new_task_id`), checked and
        encoded by :meth:`encode_tasks`: ``schedule_new.lua``, what ``schedule.lua`` does
        for a task new to the queue. Parses to its :class:`Scheduled`."""
        _, (_, arg, record) = self.encode_tasks((spec,), [task_id])
        due = cast(str, arg)  # (due_spec's)
        # (now_arg's common case inline: the server's clock)
        now = "" if now_ms is None and self.clock is None else self.now_arg(now_ms)
        keys = self._new_keys
        if keys is None:
            keys = self._new_keys = self.keys.names(_NEW.key_names)
        # (in _NEW.arg_names's order, checked at import)
        args: list[Arg] = [now, self.keys.wake_channel, task_id, arg, record]

        def parse(reply: Any) -> Scheduled:
            code, now = reply  # _NEW's head: {status, now}; created: due as stored
            return Scheduled.of_code(task_id, code, stored_due_ms(due, now) if code == 1 else None)

        return Op(_NEW, list(keys), args, parse)

    def cancel(self, task_id: str, *, now_ms: int | None = None) -> Op[bool]:
        """Remove a waiting task, leaving a tombstone for the dedupe window (True: it was),
        and tell whoever waits for it (queue.wait)."""
        args: dict[str, Arg] = {"id": validate_task_id(task_id), "now": self.now_arg(now_ms)}
        args["dedupe_ms"], args["trim_limit"] = self.dedupe_ms, ABORT_TRIM
        args["finished"] = self.keys.finished_channel
        return self.op("cancel", args, [], lambda r: int(r) == 1)

    def abort(self, task_id: str, *, now_ms: int | None = None) -> Op[bool]:
        """End a waiting or running task for good (abort.lua); parses to True if it was
        waiting or running."""
        return self.op(
            "abort",
            {
                "now": self.now_arg(now_ms),
                "dedupe_ms": self.dedupe_ms,
                "trim_limit": ABORT_TRIM,
                "channel": self.keys.wake_channel,
                "keep": "1" if self.keep_finished == "record" else "",
                "finished": self.keys.finished_channel,
                "id": validate_task_id(task_id),
            },
            [],
            lambda r: int(r) > 0,
        )

    def reschedule(
        self,
        task_id: str,
        *,
        delay: Duration | None = None,
        at: datetime | float | int | None = None,
        now_ms: int | None = None,
    ) -> Op[bool]:
        due = reschedule_due(delay, at)
        return self._reschedule(task_id, due, now_ms, "", lambda r: int(r) == 1)

    def reschedule_due(
        self,
        task_id: str,
        *,
        delay: Duration | None = None,
        at: datetime | float | int | None = None,
        now_ms: int | None = None,
    ) -> Op[float | None]:
        """:meth:`reschedule`, parsed to the due time the script stored (ms on the server's
        clock, what ``get`` reads back), or None when the task was not waiting."""
        due = reschedule_due(delay, at)

        def parse(reply: Any) -> float | None:
            moved, now = reply  # _RESCHEDULE's head: {moved, now}
            return stored_due_ms(due, now) if int(moved) == 1 else None

        return self._reschedule(task_id, due, now_ms, "now", parse)

    def _reschedule(
        self, task_id: str, due: str, now_ms: int | None, reply: str, parse: Callable[[Any], T]
    ) -> Op[T]:
        args: dict[str, Arg] = {
            "now": self.now_arg(now_ms),
            "channel": self.keys.wake_channel,
            "id": validate_task_id(task_id),
            "due": due,
            "reply": reply,
        }
        return self.op("reschedule", args, [], parse)

    # -- inspecting ----------------------------------------------------------------------

    def get(self, task_id: str) -> Op[TaskInfo | None]:
        tid = validate_task_id(task_id)
        return self.op("get", {"id": tid}, [], self.lookup_parser(tid))

    def lookup_parser(self, tid: str) -> Callable[[Any], TaskInfo | None]:
        def parse(reply: Any) -> TaskInfo | None:
            if not reply:
                return None
            state, score, record, error, attempt, *rest = reply  # _GET's head
            return self.task_info(
                tid, as_str(state), float(score), as_bytes(record), error, attempt, *rest[:1]
            )

        return parse

    def task_info(
        self, task_id: str, state: str, score: float, record: bytes, *rest: Any
    ) -> TaskInfo:
        """What the scripts return about a task (record or tombstone; then ``rest``: last
        error, attempt state, result) as a TaskInfo of this queue (``info.task_info``): an
        undecodable record still shows."""
        return task_info(self.name, self.codecs, task_id, state, score, record, *rest)

    def stats(self, now_ms: int | None = None) -> Op[QueueStats]:
        def parse(r: Any) -> QueueStats:
            (
                now_ms,
                scheduled,
                due,
                active,
                dead,
                done,
                head_due,
                next_lease,
                expiry_mode,
                aborted,
            ) = r[: _STATS.head]
            now, head = float(now_ms), float(head_due)
            counters = {as_str(name): int(value) for name, value in _STATS.rows(r)}
            counters.pop("claim_seq", None)
            return QueueStats(
                queue=self.name,
                scheduled=int(scheduled),
                due=int(due),
                active=int(active),
                dead=int(dead),
                done=int(done),
                oldest_due_age=max(0.0, (now - head) / 1000) if head >= 0 else 0.0,
                next_due_at=_ms_or_none(head),
                next_lease_deadline=_ms_or_none(next_lease),
                counters=counters,
                now=ms_to_datetime(now),
                expiry_mode=as_str(expiry_mode) or None,
                aborted=int(aborted),
            )

        return self.op("stats", {"now": self.now_arg(now_ms)}, [], parse)

    def shard_count(self, want: int, *, store: bool = True) -> Op[ShardCheck]:
        """The queue's stored shard count, storing ``want`` if none is and nothing waits
        (``store=False``: only read; 0 when none is stored); -1 while it is being resharded
        (call it on the unsplit queue's core; see shards.py). With it, the queue's protocol
        version, stamped by a write when it has none (delayq.protocol.version)."""
        args: dict[str, Arg] = {
            "want": want,
            "store": "1" if store else "0",
            "protocol": PROTOCOL_VERSION,
        }
        return self.op("shards", args, [], write_check if store else read_check)

    def dead(self, offset: int = 0, limit: int = 100) -> Op[list[TaskInfo]]:
        check_page(offset, limit, MAX_DEAD_PAGE)

        def parse(r: Any) -> list[TaskInfo]:
            return [
                self.task_info(
                    as_str(id), "dead", float(died), as_bytes(record or b""), error, attempt
                )
                for id, died, record, error, attempt in _DEAD.rows(r)
            ]

        return self.op("dead", {"offset": offset, "limit": limit}, [], parse)

    def seek(
        self, state: str, after: tuple[str, str] | None = None, limit: int = 100
    ) -> Op[list[SeekRow]]:
        """A page of tasks in ``state`` after the cursor ``after`` = (score as a reply gave
        it, id): keyset paging, as cheap deep as on the first page (scheduled, active and
        done oldest first, dead most recent first). Rows stay undecoded (see
        :meth:`seek_info`): a sharded queue's merge decodes only the rows it keeps."""
        if state not in SEEK_STATES:
            raise InvalidTaskError(
                f"a page shows one of {', '.join(SEEK_STATES)}: state={state!r:.200} is none "
                "of them"
            )
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_SEEK:
            raise InvalidTaskError(f"a page needs 1 <= limit <= {MAX_SEEK}, got {limit!r}")
        score, tid = after if after is not None else ("", "")

        def parse(r: Any) -> list[SeekRow]:
            return [
                SeekRow(as_str(id), as_str(score), as_bytes(record or b""), error, attempt)
                for id, score, record, error, attempt in _SEEK.rows(r)
            ]

        args: dict[str, Arg] = {"state": state, "score": score, "id": tid, "limit": limit}
        return self.op("seek", args, [], parse)

    def seek_info(self, state: str, row: SeekRow) -> TaskInfo:
        return self.task_info(row.id, state, float(row.score), row.record, row.error, row.attempt)

    def replay(
        self,
        ids: Iterable[str] | None = None,
        *,
        limit: int = REPLY_BATCH,
        now_ms: int | None = None,
    ) -> Op[int]:
        rest: list[Arg] = [validate_task_id(i) for i in ids] if ids is not None else []
        return self.op(
            "replay",
            {"now": self.now_arg(now_ms), "channel": self.keys.wake_channel, "limit": limit},
            rest,
            int,
        )

    def purge_dead(
        self,
        ids: Iterable[str] | None = None,
        *,
        before_ms: int | None = None,
        limit: int = REPLY_BATCH,
    ) -> Op[int]:
        rest: list[Arg] = [validate_task_id(i) for i in ids] if ids is not None else []
        return self.op(
            "purge",
            {"before_ms": "" if before_ms is None else before_ms, "limit": limit},
            rest,
            int,
        )

    def workers(self, limit: int = 100, now_ms: int | None = None) -> Op[list[WorkerInfo]]:
        def parse(r: Any) -> list[WorkerInfo]:
            now = float(r[_WORKERS_NOW])
            return [
                parse_worker(as_str(id), float(seen), info, now, self.name)
                for id, seen, info in _WORKERS.rows(r)
            ]

        return self.op("workers", {"now": self.now_arg(now_ms), "limit": limit}, [], parse)

    def reap(self, *, limit: int = 1000, now_ms: int | None = None) -> Op[int]:
        return self.op(
            "reap",
            {"now": self.now_arg(now_ms), "limit": limit, "channel": self.keys.wake_channel},
            [],
            int,
        )
