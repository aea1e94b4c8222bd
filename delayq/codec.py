"""Payload codecs and the task record format. Pure: no I/O.

A record is one string in the queue's ``tasks`` hash, written once by the producer::

    {"k":"order.close","m":5,"c":1732900000000}\n<encoded payload>

The JSON header holds what the Lua scripts read (short keys keep a waiting task small); the
payload after the first newline is opaque to the scripts, so a float or a big integer inside
it is never re-encoded by Lua's cjson. Header keys:

    k  kind                  m  max attempts (0: handler's)    c  created (ms)
    f  payload format (absent for JSON)

What changes with every claim (lease token, attempt number, due time of the current run) is
kept apart, in the ``attempts`` hash as ``"<token> <attempt> <due>"`` (see
QueueKeys.attempts). The two read apart as :class:`Record` and :class:`Attempt`; a claimed
task carries both, flat, as a :class:`Header`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from delayq.errors import InvalidTaskError, PayloadTooLarge

DEFAULT_MAX_PAYLOAD = 64 * 1024


class Codec(Protocol):
    """Turns payloads into bytes and back. Nothing decoded is ever executed."""

    name: str

    def encode(self, payload: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


# One encoder for every call: json.dumps with options builds a new JSONEncoder each time,
# which was a fifth of the cost of encoding a small task.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_DECODER = json.JSONDecoder()


class JsonCodec:
    name = "json"

    def encode(self, payload: Any) -> bytes:
        try:
            text = _ENCODER.encode(payload)
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
            "store large data elsewhere and pass a reference, or raise max_payload"
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

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Record:
        return cls(
            kind=str(raw["k"]),
            max_attempts=_as_int(raw.get("m", 0)),
            created_ms=_lenient_int(raw.get("c", 0)),
            fmt=str(raw.get("f", "json")),
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
        )

    @property
    def record(self) -> Record:
        return Record(self.kind, self.max_attempts, self.created_ms, self.fmt)

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


def record_prefix(kind: str, *, max_attempts: int, fmt: str) -> bytes:
    """The part of a new record's header that depends on the kind and options only.

    Zero-valued fields are left out (readers default them to 0): every byte here is paid
    once per waiting task.
    """
    header: dict[str, Any] = {"k": kind}
    if max_attempts:
        header["m"] = max_attempts
    if fmt != "json":
        header["f"] = fmt
    return json.dumps(header, separators=(",", ":")).encode()[:-1] + b',"c":'


def encode_record(
    kind: str, payload: bytes, *, max_attempts: int, created_ms: int, fmt: str
) -> bytes:
    prefix = record_prefix(kind, max_attempts=max_attempts, fmt=fmt)
    return prefix + str(created_ms).encode() + b"}\n" + payload


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
