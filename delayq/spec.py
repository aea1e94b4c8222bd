"""What a producer schedules, and its checks: :class:`TaskSpec`, :class:`CheckedSpec`, the
options of ``schedule`` (:class:`ScheduleOptions`), task ids, the limits of kinds, ids
and attempts, and :class:`TaskType` (a kind with the type of its payload; its payloads
become JSON values by ``shapes.py``). Pure: no I/O. ``core.py`` encodes what passes
(``QueueCore.encode_tasks``).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypedDict, overload

from delayq import check
from delayq.backoff import Backoff, validate_backoff
from delayq.codec import encode_headers
from delayq.errors import InvalidTaskError
from delayq.shapes import Shape, ShapeError, shape_of
from delayq.text import check as check_text
from delayq.timing import Duration, config_seconds, due_spec

if TYPE_CHECKING:
    from typing_extensions import TypeVar  # (for the default: mypy's, not a dependency)

    P = TypeVar("P")  # a typed task's payload,
    R = TypeVar("R", default=None)  # and its result
else:
    from typing import TypeVar

    P = TypeVar("P")
    R = TypeVar("R")
X = TypeVar("X")  # a payload type, in one call


MAX_ID_LEN = 256
MAX_KIND_LEN = 200
# Attempts are counted in Lua numbers (doubles) and shown to people: a limit beyond this is
# a mistake, not a policy (at one attempt a second it is 11 days of retries).
MAX_ATTEMPTS = 1_000_000


class ScheduleOptions(TypedDict, total=False):
    """Keyword options of ``schedule`` (keyword-only, so they never clash with payloads)."""

    delay: Duration | None
    at: datetime | float | int | None
    task_id: str | None
    replace: bool
    max_attempts: int
    durable: bool
    headers: dict[str, str] | None
    priority: int | None


@dataclass(frozen=True, init=False)
class TaskSpec:
    """One task for ``schedule_many`` (and what ``before_schedule`` hooks are given).

    ``kind``: a kind, or a :class:`TaskType` and a payload of its type, kept as the plain
    kind and the JSON value the payload is written as (what a hook sees).

    ``headers``: context that travels with the task, as ``task.headers`` in its handler
    and ``TaskInfo.headers``: a dict of str to str (trace context, a tenant), at most 4 KiB
    as JSON; None or ``{}`` for none.

    ``priority``: 0-9, the higher claimed first among due tasks (docs/priorities.md); 0 is
    none; None (not given) is 0 for a new task, and keeps a replaced waiting task's.
    """

    kind: str
    payload: Any = None
    delay: Duration | None = None
    at: datetime | float | int | None = None
    task_id: str | None = None
    max_attempts: int = 0
    headers: dict[str, str] | None = None
    priority: int | None = None

    @overload
    def __init__(
        self,
        kind: TaskType[X, Any],
        payload: X,
        delay: Duration | None = None,
        at: datetime | float | int | None = None,
        task_id: str | None = None,
        max_attempts: int = 0,
        headers: dict[str, str] | None = None,
        priority: int | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self,
        kind: str,
        payload: Any = None,
        delay: Duration | None = None,
        at: datetime | float | int | None = None,
        task_id: str | None = None,
        max_attempts: int = 0,
        headers: dict[str, str] | None = None,
        priority: int | None = None,
    ) -> None: ...

    def __init__(
        self,
        kind: str | TaskType[Any, Any],
        payload: Any = None,
        delay: Duration | None = None,
        at: datetime | float | int | None = None,
        task_id: str | None = None,
        max_attempts: int = 0,
        headers: dict[str, str] | None = None,
        priority: int | None = None,
    ) -> None:
        if type(kind) is not str:  # a TaskType's is stored as its plain kind and JSON value
            kind, payload = _plain(kind, payload)
        # The fields go straight into the instance's dict: the __init__ a frozen dataclass
        # is given calls object.__setattr__ once per field, which made a TaskSpec cost more
        # than checking it (one per task scheduled, two for a task given no id).
        fields = self.__dict__
        fields["kind"], fields["payload"], fields["delay"], fields["at"] = kind, payload, delay, at
        fields["task_id"], fields["max_attempts"], fields["headers"] = (
            task_id,
            max_attempts,
            headers,
        )
        fields["priority"] = priority


def _plain(kind: Any, payload: Any) -> tuple[Any, Any]:
    if isinstance(kind, TaskType):
        return kind.kind, kind.dump(payload)
    return kind, payload  # (refused as a kind by the checks)


class CheckedSpec(TaskSpec):
    """A :class:`TaskSpec` checked as it is made: its kind, id (when given), delay or
    ``at``, max_attempts and headers pass the checks ``schedule_many`` makes, or
    InvalidTaskError is raised. ``schedule_many`` does not check them again (its payload is
    checked when it is encoded: that needs the queue's codec and limit). The HTTP API makes
    one per task it is sent; anything that checks tasks before it hands them on may too.

    It is still a TaskSpec (``dataclasses.replace`` of one checks the result again); a
    ``before_schedule`` hook is given a plain TaskSpec, and what it returns is checked.
    ``due`` and ``header_field`` are the script's due argument and the record's headers
    field, made by the check. It keeps a copy of the headers dict it is given, so later
    changes to the caller's dict do not reach it (nor, unwritten, the record)."""

    due: str
    header_field: bytes

    def __init__(
        self,
        kind: str,
        payload: Any = None,
        delay: Duration | None = None,
        at: datetime | float | int | None = None,
        task_id: str | None = None,
        max_attempts: int = 0,
        headers: dict[str, str] | None = None,
        priority: int | None = None,
    ) -> None:
        if type(headers) is dict:  # its own copy: what is written is what it holds
            headers = dict(headers)
        super().__init__(kind, payload, delay, at, task_id, max_attempts, headers, priority)
        # The order of encode_tasks' checks, so a task wrong twice is refused for the same
        # reason either way.
        if task_id is not None:
            validate_task_id(task_id)
        validate_kind(kind)
        validate_max_attempts(max_attempts)
        if priority is not None:
            validate_priority(priority)
        self.__dict__["header_field"] = encode_headers(headers)
        self.__dict__["due"] = due_spec(delay, at)

    @classmethod
    def many(cls, tasks: Iterable[Sequence[Any]]) -> list[CheckedSpec]:
        """A CheckedSpec of each (kind, payload, delay, at, task_id, max_attempts, headers[,
        priority]),
        with a new id for a task_id of None: the checks of one CheckedSpec, each kind, delay
        and ``at`` checked once per call (a batch repeats them; by value and type, so 1 and
        True are told apart). InvalidTaskError at the first task refused."""
        rows = list(tasks)
        fresh = iter(new_task_ids(sum(1 for row in rows if row[4] is None)))
        checked: dict[tuple[Any, ...], str] = {}  # kind, max_attempts, delay, at -> due
        out = []
        for row in rows:
            kind, payload, delay, at, task_id, max_attempts, headers = row[:7]
            priority = row[7] if len(row) > 7 else None
            if priority is not None:
                validate_priority(priority)
            if task_id is None:
                task_id = next(fresh)  # made here: nothing to check
            else:
                validate_task_id(task_id)
            key: tuple[Any, ...] | None = (
                kind,
                type(max_attempts),
                max_attempts,
                type(delay),
                delay,
                type(at),
                at,
            )
            try:
                due = checked.get(key)  # type: ignore[arg-type]
            except TypeError:  # an unhashable value: refused below
                due, key = None, None
            if due is None:  # (in CheckedSpec's order, so a task is refused for one reason)
                validate_kind(kind)
                validate_max_attempts(max_attempts)
                head = encode_headers(headers)
                due = due_spec(delay, at)
                if key is not None:
                    checked[key] = due
            else:
                head = b"" if headers is None else encode_headers(headers)
            if type(headers) is dict:
                headers = dict(headers)
            spec = cls.__new__(cls)
            TaskSpec.__init__(
                spec, kind, payload, delay, at, task_id, max_attempts, headers, priority
            )
            spec.__dict__["header_field"], spec.__dict__["due"] = head, due
            out.append(spec)
        return out


def new_task_ids(n: int) -> list[str]:
    """Ids of 96 random bits in 16 URL-safe characters: short, since every byte is kept per
    task. One read of the random source for the whole batch."""
    if n == 1:
        return [new_task_id()]
    raw = base64.urlsafe_b64encode(os.urandom(12 * n)).decode()
    # Never a leading "-": a command line (delayq task show ID) would read it as an option.
    return [
        ("_" + raw[i + 1 : i + 16]) if raw[i] == "-" else raw[i : i + 16]
        for i in range(0, 16 * n, 16)
    ]


def new_task_id() -> str:
    """One id as :func:`new_task_ids` makes them (a single schedule's): base64's URL-safe
    alphabet by one C call and a translate (``urlsafe_b64encode`` is two Python calls)."""
    raw = binascii.b2a_base64(os.urandom(12), newline=False).translate(_URLSAFE).decode()
    return "_" + raw[1:] if raw[0] == "-" else raw


_URLSAFE = bytes.maketrans(b"+/", b"-_")


def task_ids(specs: Sequence[TaskSpec]) -> list[str]:
    """Each task's id: its own, checked (a :class:`CheckedSpec`'s was checked when it was
    made), or a new one (made here: nothing to check). InvalidTaskError for a bad id, or an
    id given twice."""
    if len(specs) == 1:  # a single schedule
        (spec,) = specs
        if spec.task_id is None:
            return new_task_ids(1)
        return [spec.task_id if type(spec) is CheckedSpec else validate_task_id(spec.task_id)]
    fresh = iter(new_task_ids(sum(1 for s in specs if s.task_id is None)))
    ids = [
        next(fresh)
        if s.task_id is None
        else s.task_id
        if type(s) is CheckedSpec
        else validate_task_id(s.task_id)
        for s in specs
    ]
    if len(set(ids)) != len(ids):
        raise InvalidTaskError("the same task_id appears twice in one schedule_many call")
    return ids


# Control characters (below U+0020), refused in ids and kinds. A regex finds them in C: a
# generator over the characters was half the cost of schedule_many's validation.
_CONTROL = re.compile("[\x00-\x1f]")


def validate_task_id(task_id: Any) -> str:
    if (
        type(task_id) is str
        and 0 < len(task_id) <= MAX_ID_LEN
        and task_id.isascii()
        and not _CONTROL.search(task_id)
    ):
        return task_id  # the common case, once per task: the checks below, passed at once
    if not isinstance(task_id, str) or not task_id:
        raise InvalidTaskError(f"task_id must be a non-empty string, got {task_id!r}")
    if len(task_id) > MAX_ID_LEN:
        raise InvalidTaskError(
            f"task_id is {len(task_id)} characters, over the limit of {MAX_ID_LEN}; "
            "use a shorter business key such as 'order:42'"
        )
    if _CONTROL.search(task_id):
        raise InvalidTaskError(f"task_id {task_id!r} contains control characters")
    return check_text(task_id, "task_id")


def validate_kind(kind: Any) -> str:
    if (
        type(kind) is str
        and 0 < len(kind) <= MAX_KIND_LEN
        and kind.isascii()
        and not _CONTROL.search(kind)
    ):
        return kind  # the common case (as validate_task_id's)
    if not isinstance(kind, str) or not kind or len(kind) > MAX_KIND_LEN:
        raise InvalidTaskError(
            f"kind must be a non-empty string of at most {MAX_KIND_LEN} characters, got {kind!r}"
        )
    if _CONTROL.search(kind):
        raise InvalidTaskError(f"kind {kind!r} contains control characters")
    return check_text(kind, "kind")


MAX_PRIORITY = 9


def priority_due(priority: Any, due: str) -> tuple[int, str]:
    """A task given a priority: the priority (checked) and its due argument to schedule.lua,
    ``p<N>:<due>`` (protocol 1.1; ``p0`` says "none", so a replace drops one)."""
    p = validate_priority(priority)
    return p, f"p{p}:{due}"


def plain_dues(args: list[str]) -> list[str]:
    """schedule.lua's due arguments without the ``p<N>:`` of a priority given."""
    return [d[3:] if d[:1] == "p" else d for d in args]


def reschedule_due(delay: Duration | None, at: datetime | float | int | None) -> str:
    """``reschedule``'s due argument: ``delay`` or ``at``, one of them given."""
    if delay is None and at is None:
        raise InvalidTaskError("reschedule needs delay= or at=")
    return due_spec(delay, at)


def validate_priority(value: Any) -> int:
    """A task's priority: an int 0-9 (the higher claimed first; 0 none), else
    InvalidTaskError."""
    hint = " (0-9, the higher claimed first among due tasks; 0 is none)"
    return check.whole(value, "priority", 0, MAX_PRIORITY, error=InvalidTaskError, hint=hint)


def validate_max_attempts(value: Any) -> int:
    """0 (the handler's limit) or 1 .. MAX_ATTEMPTS."""
    hint = " (0: the handler's limit)"
    return check.whole(value, "max_attempts", 0, MAX_ATTEMPTS, error=InvalidTaskError, hint=hint)


# -- typed tasks --------------------------------------------------------------------------


class TaskType(Generic[P, R]):
    """A kind and the type of its payload: ``TaskType("order.close", CloseOrder)``.

    ``queue.schedule(close_order, CloseOrder(order_id=42), delay=900)`` takes only a
    ``CloseOrder`` (mypy checks it) and writes the JSON object a plain dict of its fields
    would give; ``@worker.handler(close_order)`` gets ``task.payload`` as a ``CloseOrder``.

    Args:
        kind: the kind it is written as, which producers in other languages use.
        payload: a dataclass, a ``TypedDict``, a pydantic model or a msgspec ``Struct``.
            A dataclass's or TypedDict's fields must be of the types docs/concepts.md
            lists ("Typed tasks"): any other is refused here, naming the field.
        result: the type of what its handler returns (default ``None``); kept for typing
            now (results are not stored yet).
        max_attempts, backoff, jitter, timeout: defaults of the handler's options
            (``Worker.handler``'s, which win when given).

    Raises:
        ConfigurationError: a payload type (or field) delayq cannot check, or a bad option.
    """

    __slots__ = ("_shape", "kind", "options", "payload_type", "result_type")

    kind: str
    payload_type: type[P]
    result_type: type[R] | None
    options: dict[str, Any]

    @overload
    def __init__(
        self: TaskType[P, None],
        kind: str,
        payload: type[P],
        *,
        max_attempts: int | None = None,
        backoff: Backoff | None = None,
        jitter: float | None = None,
        timeout: Duration | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self,
        kind: str,
        payload: type[P],
        *,
        result: type[R],
        max_attempts: int | None = None,
        backoff: Backoff | None = None,
        jitter: float | None = None,
        timeout: Duration | None = None,
    ) -> None: ...

    def __init__(
        self,
        kind: str,
        payload: type[P],
        *,
        result: type[R] | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | None = None,
        jitter: float | None = None,
        timeout: Duration | None = None,
    ) -> None:
        self.kind = validate_kind(kind)
        self._shape: Shape = shape_of(payload)
        self.payload_type = payload
        self.result_type = result
        options: dict[str, Any] = {}
        hint = f" (for {kind!r})"
        if max_attempts is not None:
            options["max_attempts"] = check.whole(
                max_attempts, "max_attempts", 1, MAX_ATTEMPTS, hint=hint
            )
        if backoff is not None:
            options["backoff"] = validate_backoff(backoff)
        if jitter is not None:
            options["jitter"] = check.real(jitter, "jitter", 0, 1, hint=hint)
        if timeout is not None:
            config_seconds(timeout, "timeout")
            options["timeout"] = timeout
        self.options = options

    def dump(self, payload: P) -> Any:
        """The JSON value ``payload`` is written as (what ``schedule`` encodes).

        Raises:
            InvalidTaskError: it is not of the payload type, or a field's value is not of
                its field's type (the message names the field).
        """
        try:
            return self._shape.dump(payload)
        except ShapeError as e:
            raise InvalidTaskError(f"payload of {self.kind!r} ({self._shape.name}): {e}") from None

    def load(self, data: Any) -> P:
        """A payload of the type from the JSON value a producer wrote (unknown fields are
        ignored). Raises ShapeError, naming the field, for one that does not match."""
        value: P = self._shape.load(data)
        return value

    def reason(self, error: Exception) -> str:
        """The dead reason of a payload ``load`` refused."""
        return f"payload does not match {self._shape.name} (the type of {self.kind!r}): {error}"

    def json_schema(self) -> dict[str, Any]:
        """The JSON Schema of the payload (pydantic's and msgspec's own for their types)."""
        return self._shape.schema()

    def __repr__(self) -> str:
        return f"TaskType({self.kind!r}, {self._shape.name})"
