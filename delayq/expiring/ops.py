"""Expiring keys with a guaranteed callback: ``queue.expiring.set/touch/delete``.

A watched key is an ordinary Redis key with a TTL, and delayq also records it as a task
due at the key's deadline, carrying the key's value. The engine fires that task at the
deadline (the worker checks the key is really gone, which makes Redis expire it), so the
callback runs on time and gets the value, however lazily Redis deletes the key.

Each call is two writes: delayq's record (one script on the queue's keys) and the key
itself (one command on the key). They cannot be one script on Redis Cluster, where the
key and the queue live in different slots, so the order is chosen so that a crash between
them never loses an expiry: ``set`` records first (a crash leaves a record whose key was
never written: its callback still fires, at the deadline); ``touch`` moves the record first,
then the key's TTL (a crash leaves the record later than the key: the bell, or the check at
the record's deadline, fires it); ``delete`` drops the record first, then the key.

An expiry that happened is always delivered: ``set``, ``touch`` and ``delete`` change only a
key whose deadline is still ahead and never attempted (docs/expiring.md, "The lifecycle").
"""

from __future__ import annotations

from typing import Any

from delayq.codec import JsonCodec, encode_payload, header_end, record_prefix
from delayq.core import Op, QueueCore
from delayq.errors import InvalidTaskError
from delayq.scripts import SCRIPTS, Arg
from delayq.spec import new_task_id
from delayq.text import check as check_text
from delayq.timing import Duration, seconds

EXPIRE_KIND = "delayq.expire"
MAX_KEY_LEN = 200
FOREIGN_GATE_MS = 5000  # every subscriber hears a bell within this; one of them acts on it
_JSON = JsonCodec()


def validate_key(key: Any) -> str:
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LEN:
        raise InvalidTaskError(
            f"watched key must be a non-empty string of at most {MAX_KEY_LEN} characters, "
            f"got {key!r}"
        )
    if any(ord(c) < 32 for c in key):
        raise InvalidTaskError(f"watched key {key!r} contains control characters")
    return check_text(key, "watched key")


def ttl_ms(ttl: Duration) -> int:
    """A watched key's TTL in ms: at least 1 (InvalidTaskError naming the bound). The bound
    is on the seconds given, as the HTTP API's schema states it (``minimum: 0.001``): a TTL
    just under it is refused, not rounded up to 1 ms."""
    s = seconds(ttl, "ttl")
    if s < 0.001:
        raise InvalidTaskError(f"ttl must be at least 1 ms (0.001 s), got {ttl!r}")
    return max(round(s * 1000), 1)


_PREFIX = record_prefix(EXPIRE_KIND, max_attempts=0, fmt="json")


def _header(core: QueueCore) -> bytes:
    """A watched key's record's header line (its payload, JSON, follows)."""
    return _PREFIX + header_end(str(core.wall_ms()).encode())


def task_id_for(key: str) -> str:
    """Each set of a key gets its own task, so a new set never disturbs a firing one. The
    scripts read the key back from the id (lua/lib/expire.lua): ids have no ':'."""
    return f"x:{new_task_id()}:{key}"


# -- builders (pure) ---------------------------------------------------------------------


def set_op(
    core: QueueCore, key: str, value: bytes, ttl: Duration, *, now_ms: int | None = None
) -> Op[int]:
    return core.op(
        "expire_set",
        {
            "now": core.now_arg(now_ms),
            "channel": core.keys.wake_channel,
            "key": validate_key(key),
            "id": task_id_for(key),
            "ttl_ms": ttl_ms(ttl),
            "header": _header(core),
            "value": value,
        },
        [],
        int,
    )


def touch_op(core: QueueCore, key: str, ttl: Duration, *, now_ms: int | None = None) -> Op[int]:
    args = {
        "now": core.now_arg(now_ms),
        "channel": core.keys.wake_channel,
        "key": validate_key(key),
    }
    return core.op("expire_touch", {**args, "ttl_ms": ttl_ms(ttl)}, [], int)


def delete_op(core: QueueCore, key: str, *, now_ms: int | None = None) -> Op[bool]:
    args: dict[str, Arg] = {"now": core.now_arg(now_ms), "key": validate_key(key)}
    return core.op("expire_delete", args, [], lambda r: int(r) == 1)


def notice_op(core: QueueCore, key: str, *, foreign: bool, now_ms: int | None = None) -> Op[int]:
    """The bell for ``key``; ``foreign``: it matches a pattern, so an unwatched key counts."""
    record = b""
    if foreign:
        payload = b'{"k":' + _JSON.encode(key) + b',"v":null,"foreign":true}'
        record = _header(core) + payload
    return core.op(
        "expire_notice",
        {
            "now": core.now_arg(now_ms),
            "channel": core.keys.wake_channel,
            "key": key,
            "id": task_id_for(key),
            "record": record,
            "gate_ms": FOREIGN_GATE_MS,
        },
        [],
        int,
        dynamic={"gate": core.keys.expire_gate(key)},
    )


# What expire_confirm answers a worker about to deliver a watched key's expiry.
LOST, EARLY, CURRENT, MOVED = "lost", "early", "current", "moved"
SCRIPTS["expire_confirm"].reply.require_head("status", "ms")


def confirm_op(
    core: QueueCore, key: str, task_id: str, token: int, *, now_ms: int | None = None
) -> Op[tuple[str, int]]:
    """Before a callback (or a re-arm): is this claim still the key's expiry to deliver?
    ``(LOST, 0)`` revoked or lease gone; ``(EARLY, ms)`` the deadline is ``ms`` away on the
    server's clock; ``(CURRENT, 0)`` still the key's task; ``(MOVED, 0)`` the key was set
    again after this expiry happened."""

    def parse(reply: Any) -> tuple[str, int]:
        status, ms = reply  # expire_confirm's head, checked above
        return (status.decode() if isinstance(status, bytes) else str(status)), int(ms)

    args: dict[str, Arg] = {"now": core.now_arg(now_ms), "key": key, "id": task_id, "token": token}
    return core.op("expire_confirm", args, [], parse)


def delivered_op(core: QueueCore, key: str) -> Op[int]:
    """After a watched key's callback succeeded: shut its gate (see expire/delivered.lua)."""
    return core.op(
        "expire_delivered",
        {"gate_ms": FOREIGN_GATE_MS},
        [],
        int,
        dynamic={"gate": core.keys.expire_gate(key)},
    )


def encode_value(core: QueueCore, value: Any) -> bytes:
    """Values are JSON whatever the queue's codec: other programs read the key."""
    return encode_payload(_JSON, value, core.max_payload)
