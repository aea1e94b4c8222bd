"""The protocol version: the one this delayq speaks, and what it does on meeting another.

A queue records the version of the first process that wrote to it (the field ``protocol``
of its ``shards`` hash, stored by ``lua/shards.lua`` with the shard count). Versions are
``"<major>.<minor>"``: within a major, keys, records and the producers' scripts change only
additively, so any minor of the same major is used as is; a different major is refused.
A queue with no stamp was made before stamping existed, and speaks protocol 1.
"""

from __future__ import annotations

import re

from delayq.errors import ProtocolVersionError

PROTOCOL_VERSION = "1.1"
UNSTAMPED = "1.0"  # what a queue written before stamping existed speaks

_VERSION_RE = re.compile(r"^(\d+)(?:\.(\d+))?$")


def parse(version: str) -> tuple[int, int] | None:
    """(major, minor) of ``"1.0"`` (``"1"`` is ``1.0``); None if it is not a version."""
    m = _VERSION_RE.match(version)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


MAJOR, MINOR = parse(PROTOCOL_VERSION) or (0, 0)


def check(queue: str, stored: str) -> None:
    """Refuse a queue whose stored version is not compatible with this delayq's
    (ProtocolVersionError naming both); ``stored`` is ``""`` for an unstamped queue."""
    version = parse(stored) if stored else (1, 0)
    if version is not None and version[0] == MAJOR:
        return
    ours = PROTOCOL_VERSION
    if version is None:
        reason = (
            f"queue {queue!r} carries the protocol version {stored!r}, which is not one "
            f"(this delayq speaks {ours}): the queue's keys were not written by delayq; "
            "check the queue name and prefix"
        )
    elif version[0] > MAJOR:
        reason = (
            f"queue {queue!r} speaks delayq protocol {stored}; this delayq speaks {ours}: "
            f"upgrade delayq to a release that speaks protocol {version[0]} (see "
            "CHANGELOG.md) on every process that uses this queue"
        )
    else:
        reason = (
            f"queue {queue!r} speaks delayq protocol {stored}, an older major than this "
            f"delayq's {ours}: drain it with the delayq that wrote it, or move its tasks "
            "as the CHANGELOG.md of this release describes"
        )
    raise ProtocolVersionError(reason, queue=queue, stored=stored, ours=ours)
