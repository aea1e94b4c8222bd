"""Payload codecs and the task record format. Pure: no I/O.

A record is one string in the queue's ``tasks`` hash, written once by the producer::

    {"k":"order.close","m":5,"c":1732900000000}\n<encoded payload>

The JSON header holds what the Lua scripts read (short keys keep a waiting task small); the
payload after the first newline is opaque to the scripts, so a float or a big integer inside
it is never re-encoded by Lua's cjson. Header keys:

    k  kind                  m  max attempts (0: handler's)    c  created (ms)
    f  payload format (absent for JSON)
    h  headers, an object of strings (absent when none), always last, after ``c``:
       ``{"k":"order.close","c":1732900000000,"h":{"traceparent":"00-..."}}``, so the
       fields before ``c`` still repeat across a kind's tasks (claim.lua decodes them once)

What changes with every claim (lease token, attempt number, due time of the current run) is
kept apart, in the ``attempts`` hash as ``"<token> <attempt> <due>"`` (see
QueueKeys.attempts). The two read apart as :class:`Record` and :class:`Attempt`; a claimed
task carries both, flat, as a :class:`Header`.
"""

from __future__ import annotations

import json
import json.encoder
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from delayq.errors import ConfigurationError, InvalidTaskError, PayloadTooLarge
from delayq.text import check as check_text

DEFAULT_MAX_PAYLOAD = 64 * 1024
DEFAULT_MAX_RESULT = 64 * 1024  # bytes of a handler's result, as JSON text
# What a done or aborted task keeps for the dedupe window: a tombstone (its state, finish time,
# attempts and kind), or its whole record, payload included.
KeepFinished = Literal["tombstone", "record"]
KEEP_FINISHED: tuple[KeepFinished, ...] = ("tombstone", "record")


def check_keep_finished(value: Any) -> KeepFinished:
    if value not in KEEP_FINISHED:
        raise ConfigurationError(
            f"keep_finished must be 'tombstone' (the default: a finished task keeps its state, "
            f"finish time, attempts and kind) or 'record' (its whole record, payload "
            f"included), got {value!r}"
        )
    return value  # type: ignore[no-any-return]


MAX_HEADERS = 4 * 1024  # bytes of a task's headers, as their JSON object


class Codec(Protocol):
    """Turns payloads into bytes and back. Nothing decoded is ever executed."""

    name: str

    def encode(self, payload: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


_DECODER = json.JSONDecoder()


def compact_json(ensure_ascii: bool = False) -> Callable[[Any], str]:
    """``JSONEncoder(separators=(",", ":"), ensure_ascii=..., allow_nan=False).encode``,
    made once: the same text and the same errors, in half the time.

    ``JSONEncoder.encode`` builds a C encoder and its bookkeeping on every call (half the
    cost of encoding a small payload); this one is built once, without the table of objects
    being encoded that finds a circular reference: such a value recurses until Python's
    limit instead, and is then encoded again by ``JSONEncoder.encode``, which raises what
    it always did (ValueError "Circular reference detected", or RecursionError for a value
    nested that deep)."""
    slow = json.JSONEncoder(separators=(",", ":"), ensure_ascii=ensure_ascii, allow_nan=False)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # (a Python without the _json accelerator)
        return slow.encode
    strings = (
        json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring
    )
    fast = make(None, slow.default, strings, None, ":", ",", False, False, False)

    def encode(value: Any) -> str:
        try:
            return "".join(fast(value, 0))
        except RecursionError:
            return slow.encode(value)

    return encode


# One encoder for every call: json.dumps with options builds a new JSONEncoder each time.
_encode_json = compact_json()


class JsonCodec:
    name = "json"

    def encode(self, payload: Any) -> bytes:
        try:
            text = _encode_json(payload)
        except (TypeError, ValueError) as e:
            raise InvalidTaskError(
                f"payload is not JSON-serialisable ({e}); pass dicts, lists, strings, "
                "finite numbers, booleans and None, or convert the value first"
            ) from None
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidTaskError(
                f"payload is not valid Unicode text: a string in it holds the lone surrogate "
                f"{text[e.start]!r} (often a file name decoded with os.fsdecode); pass text "
                "that encodes as UTF-8, e.g. decode the bytes with errors='replace'"
            ) from None

    def decode(self, data: bytes) -> Any:
        try:
            # What we write is UTF-8: skip json.loads's guessing of the encoding, a fifth
            # of the cost of decoding a small payload.
            text = data.decode("utf-8")
            value, end = _DECODER.raw_decode(text)  # ours has no whitespace around it
            if end == len(text):
                return value
        except ValueError:  # not UTF-8 JSON (UnicodeDecodeError is one): as json.loads reads it
            pass
        return json.loads(data)


class MsgpackCodec:
    name = "msgpack"

    def __init__(self) -> None:
        try:
            import msgpack
        except ImportError:
            raise InvalidTaskError(
                "the msgpack codec needs the msgpack package: pip install 'delayq[msgpack]'"
            ) from None
        self._msgpack = msgpack

    def encode(self, payload: Any) -> bytes:
        try:
            return bytes(self._msgpack.packb(payload, use_bin_type=True))
        except (TypeError, ValueError, OverflowError) as e:
            raise InvalidTaskError(f"payload is not msgpack-serialisable ({e})") from None

    def decode(self, data: bytes) -> Any:
        return self._msgpack.unpackb(data, raw=False)


def get_codec(name: str) -> Codec:
    if name == "json":
        return JsonCodec()
    if name == "msgpack":
        return MsgpackCodec()
    raise InvalidTaskError(f"unknown payload codec {name!r}: use 'json' or 'msgpack'")


def encode_payload(codec: Codec, payload: Any, max_payload: int) -> bytes:
    data = codec.encode(payload)
    if len(data) > max_payload:
        raise PayloadTooLarge(
            f"payload is {len(data)} bytes encoded, over the queue's limit of {max_payload}; "
            "store large data elsewhere and pass a reference, or raise the queue's max_payload "
            "(`delayq settings --max-payload`)"
        )
    return data


@dataclass(slots=True, frozen=True)
class Record:
    """A record's JSON header, from the ``tasks`` hash: what the task is, written once by the
    producer and never changed."""

    kind: str
    max_attempts: int
    created_ms: int
    fmt: str
    headers: dict[str, str] = field(default_factory=dict)  # {} for none (or written before)
    priority: int = 0  # (protocol 1.1) 1-9 when scheduled with one, else 0

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Record:
        h = raw.get("h")
        p = _lenient_int(raw.get("p", 0))
        return cls(
            kind=str(raw["k"]),
            max_attempts=_as_int(raw.get("m", 0)),
            created_ms=_lenient_int(raw.get("c", 0)),
            fmt=str(raw.get("f", "json")),
            headers={} if h is None else _as_headers(h),
            priority=p if 1 <= p <= 9 else 0,  # (what claim reads as a priority)
        )


@dataclass(slots=True, frozen=True)
class Attempt:
    """A task's entry in the ``attempts`` hash, ``"<token> <attempt> <due>"``: its current
    or last claim, rewritten by every claim. ``Attempt.NONE`` for a task never claimed."""

    token: int
    attempt: int
    due_ms: float | None  # to the microsecond when the task was scheduled with one

    NONE: ClassVar[Attempt]

    @classmethod
    def parse(cls, entry: bytes | None) -> Attempt:
        """The entry; no attempt when there is none, or it cannot be read."""
        if not entry:
            return cls.NONE
        try:
            token, attempt, due = entry.split(b" ")
            t, a = int(token), int(attempt)
            d: float | None = float(due) if due else None
        except ValueError:
            return cls.NONE
        if d is not None and not math.isfinite(d):  # nan or inf: no due time to show
            d = None
        return cls(t, a, int(d) if d is not None and d.is_integer() else d)


Attempt.NONE = Attempt(0, 0, None)


@dataclass(slots=True)
class Header:
    """A claimed task's :class:`Record` and :class:`Attempt`, flat in one object: claim.lua
    sends both, and the worker reads them per task with no indirection. (Not frozen: a
    worker makes one per task it claims, and a frozen dataclass pays a setattr call per
    field.)"""

    kind: str
    attempts: int
    max_attempts: int
    token: int
    created_ms: int
    due_ms: float | None
    fmt: str
    # The record's headers as claim.lua sends them: their JSON object, still encoded (b""
    # for none: a task without headers costs the worker nothing to decode).
    headers: bytes = b""

    @classmethod
    def of(cls, record: Record, attempt: Attempt) -> Header:
        return cls(
            record.kind,
            attempt.attempt,
            record.max_attempts,
            attempt.token,
            record.created_ms,
            attempt.due_ms,
            record.fmt,
            encode_headers(record.headers)[len(_HEADERS_KEY) :] if record.headers else b"",
        )

    @property
    def record(self) -> Record:
        return Record(
            self.kind, self.max_attempts, self.created_ms, self.fmt, decode_headers(self.headers)
        )

    @property
    def attempt(self) -> Attempt:
        return Attempt(self.token, self.attempts, self.due_ms)


def _as_int(value: Any) -> int:
    # cjson writes integers as floats only when they exceed 14 digits; accept both.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"not a number: {value!r}")
    if isinstance(value, float) and not math.isfinite(value):  # (an int may be too big for one)
        raise ValueError(f"not a number: {value!r}")
    return int(value)


def _lenient_int(value: Any) -> int:
    # Informational fields never make a task unrunnable.
    try:
        return _as_int(value)
    except ValueError:
        return 0


class RecordError(ValueError):
    """A stored record cannot be decoded; the task goes to the dead set with this reason."""


_HEADERS_KEY = b',"h":'


def encode_headers(headers: Any) -> bytes:
    """Validate a task's headers and encode them as the record's last header field,
    ``,"h":{...}`` (b"" for None or none): a dict of non-empty str keys to str values, valid
    UTF-8, at most MAX_HEADERS bytes as JSON. InvalidTaskError says what to fix."""
    if headers is None or (type(headers) is dict and not headers):
        return b""
    if not isinstance(headers, dict):
        raise InvalidTaskError(
            f"headers must be a dict of str to str, got {type(headers).__name__}: "
            f"{headers!r:.200}; pass e.g. headers={{'tenant': 'a'}}"
        )
    for k, v in headers.items():
        if not isinstance(k, str) or not k:
            raise InvalidTaskError(
                f"header names must be non-empty strings, got {k!r:.200}; "
                "convert the name with str() or drop it"
            )
        if not isinstance(v, str):
            raise InvalidTaskError(
                f"header {k!r:.200} has a {type(v).__name__} value {v!r:.200}; header values "
                "must be strings: convert it with str() (or json.dumps for structure)"
            )
        check_text(k, "header name")
        check_text(v, f"header {k!r:.200}")
    data = _encode_json(headers).encode("utf-8")
    if len(data) > MAX_HEADERS:
        raise InvalidTaskError(
            f"headers are {len(data)} bytes encoded, over the limit of {MAX_HEADERS}; keep "
            "headers for small context (trace ids, a tenant) and put data in the payload"
        )
    return _HEADERS_KEY + data


def decode_headers(raw: bytes | str) -> dict[str, str]:
    """A record's headers from their JSON object ({} for b""); RecordError if they are not
    an object of strings (a record not written by delayq)."""
    if not raw:
        return {}
    try:
        # What delayq writes is compact UTF-8 JSON: read as JsonCodec.decode reads a payload,
        # without json.loads's guessing of the encoding (a third of the cost for a traceparent),
        # and anything else as json.loads reads it.
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        value, end = _DECODER.raw_decode(text)
        if end != len(text):
            raise ValueError("not compact")
    except ValueError:  # (UnicodeDecodeError is one)
        try:
            value = json.loads(raw)
        except ValueError as e:
            raise RecordError(f"record headers cannot be decoded: {e}") from None
    try:
        return _as_headers(value)
    except ValueError as e:
        raise RecordError(f"record headers cannot be decoded: {e}") from None


def _as_headers(value: Any) -> dict[str, str]:
    if type(value) is dict:
        for v in value.values():  # (a JSON object's keys are strings)
            if type(v) is not str:
                break
        else:
            return value
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"headers are not an object of strings: {value!r:.200}")
    return value


def record_prefix(kind: str, *, max_attempts: int, fmt: str, priority: int = 0) -> bytes:
    """The part of a new record's header that depends on the kind and options only.

    Zero-valued fields are left out (readers default them to 0): every byte here is paid
    once per waiting task.
    """
    header: dict[str, Any] = {"k": kind}
    if max_attempts:
        header["m"] = max_attempts
    if fmt != "json":
        header["f"] = fmt
    if priority:
        header["p"] = priority
    return json.dumps(header, separators=(",", ":")).encode()[:-1] + b',"c":'


def header_end(created: bytes, headers: bytes = b"") -> bytes:
    """The rest of a record's header line after its :func:`record_prefix` (the kind's
    fields, up to ``"c":``): the created time (ms, as ASCII digits), the headers' field
    (:func:`encode_headers`, b"" for none), the header's end and its newline. With these
    two, the record format is written here alone: a record is ``record_prefix(...) +
    header_end(...) + payload`` (the encoded payload; a script given the header line alone
    appends the payload itself)."""
    return created + headers + b"}\n"


def encode_record(
    kind: str,
    payload: bytes,
    *,
    max_attempts: int,
    created_ms: int,
    fmt: str,
    headers: dict[str, str] | None = None,
    priority: int = 0,
) -> bytes:
    """A whole record from its parts (tests, and what seeds state)."""
    prefix = record_prefix(kind, max_attempts=max_attempts, fmt=fmt, priority=priority)
    return prefix + header_end(str(created_ms).encode(), encode_headers(headers)) + payload


def split_record(record: bytes) -> tuple[Record, bytes]:
    """Split a record into its header and the still-encoded payload."""
    head, sep, payload = record.partition(b"\n")
    if not sep:
        raise RecordError("record has no header line")
    try:
        raw = json.loads(head)
        if not isinstance(raw, dict):
            raise ValueError("header is not an object")
        return Record.from_json(raw), payload
    except (ValueError, KeyError, TypeError) as e:
        raise RecordError(f"record header cannot be decoded: {e}") from None


def decode_payload(header: Record | Header, payload: bytes, codecs: dict[str, Codec]) -> Any:
    codec = codecs.get(header.fmt)
    if codec is None:
        try:
            codec = get_codec(header.fmt)
        except InvalidTaskError as e:  # written by a newer delayq, or not by delayq at all
            raise RecordError(f"record has an unknown payload format: {e}") from None
        codecs[header.fmt] = codec
    try:
        return codec.decode(payload)
    except Exception as e:  # any codec error means the same thing: undecodable
        raise RecordError(f"payload cannot be decoded as {header.fmt}: {e}") from None


def encode_result(value: Any, max_result: int) -> str:
    """What a handler returned, as the JSON text kept beside its tombstone.

    Raises:
        InvalidTaskError: not JSON-encodable, or over ``max_result`` bytes (the task is then
            dead with this reason)."""
    try:
        text = _encode_json(value)
    except (TypeError, ValueError) as e:
        raise InvalidTaskError(
            f"the handler's result is not JSON-serialisable ({e}); return dicts, lists, "
            "strings, finite numbers, booleans or None"
        ) from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise InvalidTaskError(
            f"the handler's result is not valid Unicode text: a string in it holds the lone "
            f"surrogate {text[e.start]!r}; return text that encodes as UTF-8"
        ) from None
    if size > max_result:
        raise InvalidTaskError(
            f"the handler's result is {size} bytes as JSON, over the queue's max_result of "
            f"{max_result}; store large results elsewhere and return a reference, or raise "
            "Queue(..., max_result=)"
        )
    return text


def tombstone_prefix(attempt: int, due_ms: float | None, now_ms: float) -> str:
    """A tombstone's first two fields as the worker sends them with its ack, the script
    adding the kind's code: ``"<attempt> <ms from due to now> "`` (the middle empty for no
    due time, or one no delayq wrote)."""
    lag = now_ms - due_ms if due_ms is not None else math.nan
    if not -1e13 < lag < 1e13:  # none, or one another program wrote (nan, inf, 1e300)
        return f"{attempt}  "
    return f"{attempt} {round(lag)} "


@dataclass(slots=True, frozen=True)
class Tombstone:
    """What a done or aborted task keeps in place of its record (``keep_finished=
    "tombstone"``): ``"<attempts> <ms from its last due time to its finish> <kind>"``, e.g.
    ``"1 3 order.close"`` (the middle empty when it never ran). A record starts with ``{``;
    a tombstone with a digit."""

    attempts: int
    lag_ms: int | None
    kind: str

    @classmethod
    def parse(cls, value: bytes) -> Tombstone | None:
        """The tombstone, or None when ``value`` is not one (a record)."""
        if not value[:1].isdigit():
            return None
        attempts, sep, rest = value.partition(b" ")
        lag, sep2, kind = rest.partition(b" ")
        if not (sep and sep2) or not attempts.isdigit():
            return None
        try:
            lag_ms = int(lag) if lag else None
        except ValueError:
            return None
        return cls(int(attempts), lag_ms, kind.decode("utf-8", "backslashreplace"))
