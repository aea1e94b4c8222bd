"""A queue's settings: what every producer of a queue must share (the dedupe window, the
largest payload, the codec), stored with the queue beside its shard count (the fields
``dedupe_ms``, ``max_payload`` and ``codec`` of ``dq:{<queue>}:shards``, protocol 1.1).
Pure: the values, their checks, the rule that meets the stored ones with a process's
arguments, and the script call that stores them.

The rule (docs/configuration.md): a setting every process of a queue must share lives with
the queue; an argument a process is given must agree with the stored value (else
ConfigurationError naming both); one not given takes the stored value, else the default.
Read with the shard count, once per queue object (``shards.lua``'s reply), never per call;
``shards.py`` holds the script call that stores them (``settings.lua``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from delayq import check
from delayq.codec import DEFAULT_MAX_PAYLOAD, get_codec
from delayq.errors import ConfigurationError, InvalidTaskError
from delayq.info import as_str
from delayq.timing import Duration, seconds

DEFAULT_DEDUPE_WINDOW = 24 * 3600.0
DEFAULT_CODEC = "json"
CODECS = ("json", "msgpack")
# Redis refuses a string over 512 MB; a record is its payload and a header.
MAX_PAYLOAD_LIMIT = 512 * 1024 * 1024 - 64 * 1024
NAMES = ("dedupe_window", "max_payload", "codec")


@dataclass(frozen=True)
class QueueSettings:
    """The settings a queue's producers follow: each the stored one, else the process's
    argument, else the default. ``stored``: the names stored with the queue (``delayq
    settings``); the others are this process's."""

    dedupe_window: float  # seconds
    max_payload: int  # bytes, of the encoded payload
    codec: str
    stored: tuple[str, ...] = field(default=(), compare=False)

    @property
    def dedupe_ms(self) -> int:
        return round(self.dedupe_window * 1000)

    def as_dict(self) -> dict[str, Any]:
        """As ``delayq settings --json`` prints them."""
        return {
            "dedupe_window": self.dedupe_window,
            "max_payload": self.max_payload,
            "codec": self.codec,
            "stored": list(self.stored),
        }


DEFAULTS = QueueSettings(DEFAULT_DEDUPE_WINDOW, DEFAULT_MAX_PAYLOAD, DEFAULT_CODEC)


class Given(NamedTuple):
    """A process's arguments (``Queue(dedupe_window=..., ...)``), checked; None: not given."""

    dedupe_window: float | None = None
    max_payload: int | None = None
    codec: str | None = None

    def but_not(self, other: Given) -> Given:
        """These arguments, less those ``other`` gives (they are stored now)."""
        return Given(
            None if other.dedupe_window is not None else self.dedupe_window,
            None if other.max_payload is not None else self.max_payload,
            None if other.codec is not None else self.codec,
        )


class Stored(NamedTuple):
    """The settings as a script answers them (``shards.lua``, ``settings.lua``): each as
    stored, ``""`` when it is not."""

    dedupe_ms: str = ""
    max_payload: str = ""
    codec: str = ""

    def shown(self) -> str:
        """The fields as a message shows them."""
        return repr(dict(zip(("dedupe_ms", "max_payload", "codec"), self, strict=True)))


NOTHING_STORED = Stored()


def given(dedupe_window: Duration | None, max_payload: int | None, codec: str | None) -> Given:
    """Check a process's arguments (the errors ``Queue`` has always raised for them)."""
    return Given(
        None if dedupe_window is None else seconds(dedupe_window, "dedupe_window"),
        None
        if max_payload is None
        else check.whole(
            max_payload,
            "max_payload",
            1,
            MAX_PAYLOAD_LIMIT,
            error=InvalidTaskError,
            hint=" (bytes)",
        ),
        None if codec is None else get_codec(codec).name,
    )


def _max_payload(value: Any) -> int:
    return check.whole(
        value, "max_payload", 1, MAX_PAYLOAD_LIMIT, error=InvalidTaskError, hint=" (bytes)"
    )


NOT_GIVEN = Given()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def stored_of(values: Any) -> Stored:
    """The three values of a reply, as text."""
    return Stored(*(_text(v) for v in values))


def _shown(name: str, value: Any) -> str:
    if name == "dedupe_window":
        return f"{value:g}s"
    if name == "max_payload":
        return f"{value} bytes"
    return repr(value)


def _stored_values(queue: str, stored: Stored) -> dict[str, Any]:
    """The stored values, parsed; a value delayq did not write is refused."""
    out: dict[str, Any] = {}
    try:
        if stored.dedupe_ms:
            out["dedupe_window"] = seconds(int(stored.dedupe_ms) / 1000, "dedupe_window")
        if stored.max_payload:
            out["max_payload"] = int(stored.max_payload)
            if not 1 <= out["max_payload"] <= MAX_PAYLOAD_LIMIT:
                raise ValueError(stored.max_payload)
        if stored.codec:
            if stored.codec not in CODECS:
                raise ValueError(stored.codec)
            out["codec"] = stored.codec
    except (ValueError, InvalidTaskError):
        raise ConfigurationError(
            f"queue {queue!r} stores settings delayq did not write ({stored.shown()}): "
            f"set them again with `delayq settings -q {queue}`"
        ) from None
    return out


_FLAGS = {"dedupe_window": "--dedupe-window", "max_payload": "--max-payload", "codec": "--codec"}


def effective(queue: str, mine: Given, stored: Stored) -> QueueSettings:
    """The settings this process follows: the stored ones, where the queue has them (an
    argument given must be the same: ConfigurationError naming both), else its arguments,
    else the defaults."""
    found = _stored_values(queue, stored) if stored != NOTHING_STORED else {}
    values: dict[str, Any] = {}
    for name in NAMES:
        arg, default = getattr(mine, name), getattr(DEFAULTS, name)
        if name not in found:
            values[name] = default if arg is None else arg
            continue
        value = found[name]
        same = arg is None or (
            round(arg * 1000) == round(value * 1000) if name == "dedupe_window" else arg == value
        )
        if not same:
            raise ConfigurationError(
                f"queue {queue!r} stores {name}={_shown(name, value)} (`delayq settings -q "
                f"{queue}`), but was opened with {name}={_shown(name, arg)}: leave {name} out "
                "to follow the queue's, or change the queue's for every process with "
                f"`delayq settings -q {queue} {_FLAGS[name]} ...`"
            )
        values[name] = value
    return QueueSettings(stored=tuple(n for n in NAMES if n in found), **values)


# -- sizes as the CLI writes them ---------------------------------------------------------

_SIZE_RE = re.compile(r"^\s*(\d+)\s*(B|KB|KiB|MB|MiB|GB|GiB|k|K|M|G)?\s*$")
_UNIT_BYTES = {
    None: 1,
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "k": 1024,
    "K": 1024,
    "KiB": 1024,
    "M": 1024**2,
    "MiB": 1024**2,
    "G": 1024**3,
    "GiB": 1024**3,
}


def parse_size(text: str) -> int:
    """Human sizes for the CLI: ``1000``, ``1000B``, ``16KiB`` (or ``16K``), ``1MiB``,
    ``16KB`` (1000s). Raises InvalidTaskError naming the forms it takes."""
    m = _SIZE_RE.match(text)
    if not m:
        raise InvalidTaskError(
            f"cannot read size {text!r}: write a whole number of bytes with an optional unit "
            "(B, KiB, MiB, GiB; KB, MB, GB are powers of 1000), e.g. 1000, 16KiB, 1MiB"
        )
    return int(m.group(1)) * _UNIT_BYTES[m.group(2)]


class ShardCheck(NamedTuple):
    """What ``shards.lua`` answers: the stored shard count (0 when none is, -1 while the
    queue is being resharded), the queue's protocol version ("" when it has none) and its
    stored settings (delayq/settings.py)."""

    n: int
    protocol: str
    store: bool = False  # asked by a write: a queue with no version has been stamped
    settings: Stored = NOTHING_STORED


def shard_check(reply: Any, store: bool) -> ShardCheck:
    if isinstance(reply, list):
        count, protocol, *settings = reply  # shards.lua's head, checked above
        return ShardCheck(int(count), as_str(protocol), store, stored_of(settings))
    return ShardCheck(int(reply), "", store)  # the status: being resharded


def read_check(reply: Any) -> ShardCheck:
    return shard_check(reply, False)


def write_check(reply: Any) -> ShardCheck:  # (one function each: ops compare equal)
    return shard_check(reply, True)
