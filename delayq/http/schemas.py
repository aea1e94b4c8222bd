"""The request bodies: their fields, read and checked at the edge.

Each body is a table of :class:`Field`: its JSON type, whether it is required, what it
means, and the Python API's own check of its value (``delayq.core``'s validators, the
timing and header rules), so the API refuses exactly what ``Queue.schedule`` refuses, and
says where. ``openapi.py`` builds the request schemas from the same tables.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from delayq.codec import MAX_HEADERS, encode_headers
from delayq.errors import InvalidTaskError
from delayq.expiring.ops import MAX_KEY_LEN, ttl_ms
from delayq.http.problems import field_error, invalid
from delayq.spec import (
    MAX_ATTEMPTS,
    MAX_ID_LEN,
    MAX_KIND_LEN,
    MAX_PRIORITY,
    CheckedSpec,
    new_task_ids,
    validate_kind,
    validate_max_attempts,
    validate_priority,
    validate_task_id,
)
from delayq.timing import MAX_DELAY_S, at_ms, parse_duration, seconds

MAX_BATCH = 1000
NO_CONTROL = "^[^\\u0000-\\u001f]+$"  # JSON Schema's spelling of "no control characters"

# RFC 3339 date-time: a full date, "T" (or a space), a time with seconds and an offset.
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})"
)
_JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    type(None): "null",
}


def rfc3339(text: str) -> datetime:
    """An RFC 3339 date-time (``2030-01-02T03:04:05.678Z``, ``...+02:00``) as an aware
    datetime; InvalidTaskError naming the form otherwise."""
    m = _RFC3339.fullmatch(text)
    if m is None:
        raise InvalidTaskError(
            f"at {text[:64]!r} is not an RFC 3339 date-time: write e.g. "
            "'2030-01-02T03:04:05Z' or '2030-01-02T03:04:05.250+02:00' (date, 'T', time with "
            "seconds, then 'Z' or an offset)"
        )
    year, month, day, hour, minute, second, frac, offset = m.groups()
    if second == "60":
        raise InvalidTaskError(f"at {text!r} is a leap second: use :59 or the next minute")
    micros = int((frac[1:] + "000000")[:6]) if frac else 0
    try:
        when = datetime.fromisoformat(f"{year}-{month}-{day}T{hour}:{minute}:{second}+00:00")
    except ValueError:
        raise InvalidTaskError(f"at {text!r} is not a real date and time") from None
    if offset not in ("Z", "z"):
        sign = 1 if offset[0] == "+" else -1
        hours, minutes = int(offset[1:3]), int(offset[4:6])
        if hours > 23 or minutes > 59:
            raise InvalidTaskError(f"at {text!r} has an offset out of range (+/-23:59 at most)")
        try:
            when -= sign * timedelta(hours=hours, minutes=minutes)
        except OverflowError:  # past what datetime holds (year 1 or 9999 in UTC): its end
            return (datetime.max if sign < 0 else datetime.min).replace(tzinfo=UTC)
    return when.replace(microsecond=micros)


_FIRST = datetime(1970, 1, 1, tzinfo=UTC)
_LAST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


def _at(value: str) -> datetime:
    """``at``: an RFC 3339 time whose year is 1970 to 9999 (the Python API's range). Such a
    time that is still before the epoch in UTC (by its offset) is taken as the epoch (due
    now); one after 9999-12-31T23:59:59Z, the latest due time stored, is refused (clamped, it
    would be due up to a second before the time asked for)."""
    when = rfc3339(value)
    if not 1970 <= int(value[:4]) <= 9999:
        raise InvalidTaskError(
            f"at {value!r} is outside the years 1970 to 9999; is the year right?"
        )
    if when > _LAST:
        raise InvalidTaskError(
            f"at {value!r} is after 9999-12-31T23:59:59Z (in UTC), the latest due time delayq "
            "stores: send that time or an earlier one"
        )
    when = max(when, _FIRST)
    at_ms(when)  # the Python API's own check
    return when


def _duration(value: float | str) -> float:
    """Seconds, or a duration as the CLI writes it (``90s``, ``15m``, ``2h``, ``1d``,
    ``250ms``), read by the CLI's own parser (its errors too)."""
    return parse_duration(value) if isinstance(value, str) else value


def _delay(value: float | str) -> float:
    return seconds(_duration(value), "delay")


def _ttl(value: float | str) -> float:
    ttl = _duration(value)
    ttl_ms(ttl)  # at least 1 ms, as the Python API checks it
    return seconds(ttl, "ttl")


def _headers(value: dict[str, Any]) -> dict[str, str]:
    encode_headers(value)
    return value


@dataclass(frozen=True)
class Field:
    """One field of a body: its JSON Schema, and the Python API's check of its value
    (raising InvalidTaskError; returns the value to use)."""

    name: str
    schema: dict[str, Any]
    check: Callable[[Any], Any] | None = None
    required: bool = False

    @property
    def json_types(self) -> tuple[str, ...]:
        """The JSON types the field takes (none: any)."""
        t = self.schema.get("type")
        return (t,) if isinstance(t, str) else tuple(t or ())

    @property
    def types(self) -> tuple[type, ...] | None:
        """The Python types json.loads gives for the JSON types (None: any)."""
        if not self.json_types:
            return None
        return tuple(p for t in self.json_types for p in _PYTHON_TYPES[t])


class Body:
    """A body's fields by name, with their types, ready for :func:`read_fields`."""

    def __init__(self, *fields: Field) -> None:
        self.fields = fields
        self.by_name = {f.name: (f, f.types, f.check) for f in fields}
        self.required = [f.name for f in fields if f.required]
        self.names = ", ".join(f.name for f in fields)


# The exact types (bool is not a number here, though it is an int in Python).
_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


KIND = Field(
    "kind",
    {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_KIND_LEN,
        "pattern": NO_CONTROL,
        "description": "Which handler runs the task (`@worker.handler(kind)`).",
    },
    validate_kind,
    required=True,
)
PAYLOAD = Field(
    "payload",
    {
        "description": "The handler's `task.payload`: any JSON value (default null), at most "
        "the queue's max_payload (its setting, `delayq settings`; 64 KiB when it stores none) "
        "encoded; a larger one is 413 naming the limit."
    },
)
# Durations as the CLI writes them, read by its parser (timing.parse_duration): a number
# and a unit (ms, s, m, h, d; none: seconds). The pattern documents the common forms, whole
# numbers under about three years whatever the unit (so that whatever it allows is taken,
# as a schema-driven client or test expects); the API also takes fractions, spaces and up
# to ten years, as the CLI does.
DURATION_PATTERN = (
    "^([1-9][0-9]{0,10}ms|[1-9][0-9]{0,7}s?|[1-9][0-9]{0,5}m|[1-9][0-9]{0,3}h|[1-9][0-9]{0,2}d)$"
)
DELAY = Field(
    "delay",
    {
        "type": ["number", "string"],
        "minimum": 0,
        "maximum": MAX_DELAY_S,
        "pattern": DURATION_PATTERN,
        "description": "Seconds from now (on the Redis server's clock), or a duration as "
        "`delayq schedule --delay` takes it: `90s`, `15m`, `2h`, `1d`, `250ms`, `1.5h` (a "
        "number alone is seconds). At most ten years. Not with `at`.",
    },
    _delay,
)
AT = Field(
    "at",
    {
        "type": "string",
        "format": "date-time",
        "pattern": "^(19[7-9][0-9]|[2-9][0-9]{3})-",
        "description": "When the task is due, an RFC 3339 date-time from 1970 to 9999. "
        "Not with `delay`. With neither, the task is due now.",
    },
    _at,
)
ID = Field(
    "id",
    {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_ID_LEN,
        "pattern": NO_CONTROL,
        "description": "The task's id, a business key such as `order-close:42` (default: a "
        "new random id). An id already waiting, running, finished within the dedupe window "
        "or dead is not scheduled again (`created: false`) unless `replace` is true.",
    },
    validate_task_id,
)
MAX_ATTEMPTS_FIELD = Field(
    "max_attempts",
    {
        "type": "integer",
        "minimum": 0,
        "maximum": MAX_ATTEMPTS,
        "description": "This task's limit of attempts (0, the default: the handler's).",
    },
    validate_max_attempts,
)
PRIORITY = Field(
    "priority",
    {
        "type": "integer",
        "minimum": 0,
        "maximum": MAX_PRIORITY,
        "description": "0-9: among the tasks due, the higher is claimed first; never before "
        "its due time (0, the default, is none). A `replace` without it keeps a waiting "
        "task's.",
    },
    validate_priority,
)
REPLACE = Field(
    "replace",
    {
        "type": "boolean",
        "description": "Move a waiting task with this id, or re-create a finished or dead "
        "one (a running task is never replaced).",
    },
)
DURABLE = Field(
    "durable",
    {
        "type": "boolean",
        "description": "Answer only once the server's append-only file is fsynced.",
    },
)
HEADERS = Field(
    "headers",
    {
        "type": "object",
        "propertyNames": {"minLength": 1},
        "additionalProperties": {"type": "string"},
        "description": f"Strings that travel with the task (`task.headers`): trace context, "
        f"a tenant. At most {MAX_HEADERS} bytes as JSON.",
    },
    _headers,
)
TTL = Field(
    "ttl",
    {
        "type": ["number", "string"],
        "minimum": 0.001,
        "maximum": MAX_DELAY_S,
        "pattern": DURATION_PATTERN,
        "description": "Seconds until the key expires (at least 0.001), or a duration as "
        "for `delay`: `30m`, `1d`.",
    },
    _ttl,
    required=True,
)
VALUE = Field(
    "value",
    {"description": "The key's value, any JSON value: the `on_expire` callback gets it."},
)
TASKS = Field(
    "tasks",
    {"type": "array", "minItems": 1, "maxItems": MAX_BATCH},
    required=True,
)

# The bodies (openapi.py names its schemas after these).
BATCH_TASK = Body(KIND, PAYLOAD, DELAY, AT, ID, MAX_ATTEMPTS_FIELD, HEADERS, PRIORITY)
TASK = Body(*BATCH_TASK.fields, REPLACE, DURABLE)
BATCH = Body(TASKS, REPLACE, DURABLE)
RESCHEDULE = Body(DELAY, AT)
EXPIRING_SET = Body(VALUE, TTL)
EXPIRING_TOUCH = Body(TTL)

# Path parameters: the same rules as the Python API's.
QUEUE_PATTERN = "^[A-Za-z0-9_.:\\-]{1,100}$"
KEY_MAX = MAX_KEY_LEN


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


# One decoder for every request (json.loads with an option builds a new one each call).
# NaN and Infinity, which Python's json would take, are not JSON.
_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def parse_json(body: bytes) -> Any:
    """The body as JSON (UTF-8, as RFC 8259 has it); 422 naming what is wrong when it is
    not."""
    if not body.strip():
        raise invalid([field_error("", "the body is empty: send a JSON object")])
    try:
        return _DECODER.decode(body.decode("utf-8"))
    except RecursionError:
        raise invalid([field_error("", "the JSON is nested too deeply")]) from None
    except ValueError as e:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        raise invalid(
            [field_error("", f"the body is not valid JSON ({e}): send one JSON object in UTF-8")]
        ) from None


def _type_error(f: Field, value: Any) -> str:
    names = f.json_types or ("?",)
    got = _JSON_TYPES.get(type(value), type(value).__name__)
    if names == ("integer",) and isinstance(value, float):
        got = f"the fraction {value!r}"
    want = " or ".join(f"{'an' if t[0] in 'aeiou' else 'a'} {t}" for t in names)
    return f"{f.name} must be {want}, got {got}"


def read_fields(
    data: Any,
    body: Body,
    errors: list[dict[str, Any]],
    base: str = "",
    index: int | None = None,
    moved: dict[str, str] | None = None,
    memo: dict[tuple[str, Any], Any] | None = None,
) -> dict[str, Any]:
    """The body's fields, checked: type, unknown and missing fields, then each value by the
    Python API's rules. Errors are appended (pointer ``base/field``); the fields that passed
    are returned. ``memo``: checks passed already in this request, by (field, value): a
    batch's tasks repeat their kinds and times."""
    if type(data) is not dict:
        got = _JSON_TYPES.get(type(data), type(data).__name__)
        errors.append(
            field_error(base, f"expected a JSON object with {body.names}, got {got}", index)
        )
        return {}
    by_name = body.by_name
    out: dict[str, Any] = {}
    for name, value in data.items():
        entry = by_name.get(name)
        if entry is None:
            hint = (moved or {}).get(name) or f"the fields are {body.names}"
            where = f"{base}/{_escape(name)}"
            errors.append(field_error(where, f"unknown field {name!r}: {hint}", index))
            continue
        try:
            out[name] = _value(entry, value, memo)
        except InvalidTaskError as e:
            errors.append(field_error(f"{base}/{name}", str(e), index))
    for name in body.required:
        if name not in data:
            errors.append(field_error(f"{base}/{name}", f"{name} is required", index))
    if "at" in out and out.get("delay") is not None and out["at"] is not None:
        errors.append(field_error(f"{base}/at", "pass either delay or at, not both", index))
        out.pop("at")
    return out


def _value(
    entry: tuple[Field, tuple[type, ...] | None, Callable[[Any], Any] | None],
    value: Any,
    memo: dict[tuple[str, Any], Any] | None,
) -> Any:
    """One field's value, checked (InvalidTaskError saying what is wrong)."""
    f, types, check = entry
    if types is not None and type(value) not in types:
        if types == (int,) and _whole(value):
            value = int(value)  # 3.0 is an integer in JSON
        else:
            raise InvalidTaskError(_type_error(f, value))
    if check is None:
        return value
    if memo is None or type(value) not in _MEMO_TYPES:
        return check(value)
    key = (f.name, value)
    if key not in memo:
        memo[key] = check(value)
    return memo[key]


_MEMO_TYPES = (str, int, float)


def _whole(value: Any) -> bool:
    return isinstance(value, float) and value.is_integer()


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")[:200]


def check_fields(data: Any, body: Body) -> dict[str, Any]:
    """One body's fields, or 422 with every error found."""
    errors: list[dict[str, Any]] = []
    out = read_fields(data, body, errors)
    if errors:
        raise invalid(errors)
    return out


def spec_of(fields: dict[str, Any], task_id: str) -> CheckedSpec:
    """A task of checked fields, as a spec ``schedule_many`` does not check again."""
    return CheckedSpec(
        fields["kind"],
        fields.get("payload"),
        delay=fields.get("delay"),
        at=fields.get("at"),
        task_id=task_id,
        max_attempts=fields.get("max_attempts", 0),
        headers=fields.get("headers"),
        priority=fields.get("priority"),
    )


_MOVED = {
    "replace": "replace applies to the whole batch: put it beside tasks",
    "durable": "durable applies to the whole batch: put it beside tasks",
}


def check_batch(data: Any) -> tuple[list[dict[str, Any]], bool, bool]:
    """(each task's fields, replace, durable), or 422 listing every error by index."""
    errors: list[dict[str, Any]] = []
    top = read_fields(data, BATCH, errors)
    tasks = top.get("tasks")
    if isinstance(tasks, list) and len(tasks) > MAX_BATCH:
        raise invalid(
            [
                field_error(
                    "/tasks",
                    f"the batch has {len(tasks)} tasks, over the limit of {MAX_BATCH}: send "
                    f"them in batches of at most {MAX_BATCH}",
                )
            ]
        )
    if isinstance(tasks, list) and not tasks:
        errors.append(field_error("/tasks", "tasks is empty: send at least one task"))
    out: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    memo: dict[tuple[str, Any], Any] = {}
    for i, item in enumerate(tasks or []):
        fields = read_fields(item, BATCH_TASK, errors, f"/tasks/{i}", i, _MOVED, memo)
        tid = fields.get("id")
        if tid is not None:
            if tid in seen:
                errors.append(
                    field_error(
                        f"/tasks/{i}/id",
                        f"id {tid!r} is also task {seen[tid]}'s: each task of a batch needs "
                        "its own id",
                        i,
                    )
                )
            seen.setdefault(tid, i)
        out.append(fields)
    if errors:
        raise invalid(errors)
    return out, bool(top.get("replace", False)), bool(top.get("durable", False))


def batch_specs(data: Any) -> tuple[list[CheckedSpec], bool, bool]:
    """A batch's tasks as specs checked once (a new id for a task sent without one),
    replace, durable; or 422 listing every error by index (:func:`check_batch`'s)."""
    fast = _batch_specs(data)
    if fast is not None:
        return fast
    tasks, replace, durable = check_batch(data)  # raises unless only the fast path balked
    fresh = iter(new_task_ids(sum(1 for t in tasks if "id" not in t)))
    return [spec_of(t, t["id"] if "id" in t else next(fresh)) for t in tasks], replace, durable


_TASK_TYPES = {name: types for name, (_, types, _) in BATCH_TASK.by_name.items()}
_BATCH_KEYS = frozenset(BATCH.by_name)


def _once(cache: dict[str, Any], text: str, read: Callable[[str], Any]) -> Any:
    """``read(text)``, read once per text (InvalidTaskError as ``read`` raises it)."""
    if text not in cache:
        cache[text] = read(text)
    return cache[text]


def _batch_specs(data: Any) -> tuple[list[CheckedSpec], bool, bool] | None:
    """The batch of a well-formed body: each task's JSON types looked at and its values
    checked once, by CheckedSpec.many (the checks read_fields makes field by field); None at the
    first thing wrong, or anything read_fields would read rather than refuse (a count given
    as 3.0), for check_batch to name every error."""
    if type(data) is not dict or not data.keys() <= _BATCH_KEYS:
        return None
    tasks = data.get("tasks")
    replace, durable = data.get("replace", False), data.get("durable", False)
    if type(tasks) is not list or not 0 < len(tasks) <= MAX_BATCH:
        return None
    if type(replace) is not bool or type(durable) is not bool:  # (null is refused too)
        return None
    types = _TASK_TYPES
    rows = []
    times: dict[str, Any] = {}  # a batch's tasks repeat their times
    delays: dict[str, Any] = {}  # and their delays
    try:
        for task in tasks:
            if type(task) is not dict or "kind" not in task:
                return None
            for name, value in task.items():
                want = types.get(name, ())  # (an unknown name: no type is one of none)
                if want is not None and type(value) not in want:
                    return None
            at = task.get("at")
            if at is not None:
                at = _once(times, at, _at)
            delay = task.get("delay")
            if type(delay) is str:
                delay = _once(delays, delay, _delay)
            rows.append(
                (
                    task["kind"],
                    task.get("payload"),
                    delay,
                    at,
                    task.get("id"),
                    task.get("max_attempts", 0),
                    task.get("headers"),
                    task.get("priority"),
                )
            )
        specs = CheckedSpec.many(rows)
    except InvalidTaskError:
        return None
    if len({s.task_id for s in specs}) != len(specs):
        return None  # an id given twice
    return specs, replace, durable
