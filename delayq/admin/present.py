"""Showing tasks and times to people: shared by the CLI, the demo and the dashboard. Pure,
but for :func:`console`, which makes (and does not use) a terminal's console."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime
from typing import Any

from rich.console import Console

from delayq.task import TaskInfo

# The width of a console that is not a terminal: no limit that a table or a line reaches, so
# a pipe or a file gets every line whole (rich pads nothing to the width).
UNLIMITED = 100_000
COLUMNS_ENV = "COLUMNS"  # a width asked for, which rich reads too

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def safe(text: str) -> str:
    """Text from Redis (errors, ids) with control characters shown, not obeyed."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def one_line(text: str) -> str:
    """A header's name or value on one line: newlines and tabs written as \\n and \\t, other
    control characters as in :func:`safe`."""
    return safe(text.replace("\n", "\\n").replace("\t", "\\t"))


# Each unit of a duration over a minute, largest first, with the one shown after it.
_UNITS = ((86400.0, "d", 3600.0, "h"), (3600.0, "h", 60.0, "m"), (60.0, "m", 1.0, "s"))


def human_seconds(s: float, *, exact: bool = False) -> str:
    """A duration for people: 0.0123 -> '12ms', 95 -> '1m35s', 7300 -> '2h01m'. ``exact``:
    in its largest unit alone, as precise as it is (a chart's spans: 300 -> '5m', 5400 ->
    '1.5h', 0.0005 -> '0.5ms')."""
    if s < 1:
        return f"{s * 1000:{'g' if exact else '.0f'}}ms"
    if s < 60:
        return f"{s:{'g' if exact else '.1f'}}s"
    for size, unit, part, after in _UNITS:
        if s >= size:
            if exact:
                return f"{s / size:g}{unit}"
            return f"{int(s // size)}{unit}{int(s % size // part):02d}{after}"
    raise AssertionError("unreachable: s >= 60 is at least a minute")


def controls_text(paused: bool, limit: Any, backlog: float | None) -> str:
    """A queue's admission controls on one line: 'paused', '100/s (burst 100), 9.0s behind'
    (the time the rate limit needs for what is due now), or '-'."""
    parts = ["paused"] if paused else []
    if limit is not None:
        text = f"{limit.rate} (burst {limit.burst})"
        if backlog:
            text += f", {human_seconds(backlog)} behind"
        parts.append(text)
    return "; ".join(parts) or "-"


def relative(when: datetime | None, now: datetime) -> str:
    """'in 5m00s' / '3.0s ago' / '-'."""
    if when is None:
        return "-"
    delta = (when - now).total_seconds()
    return f"in {human_seconds(delta)}" if delta >= 0 else f"{human_seconds(-delta)} ago"


def payload_text(payload: Any) -> str:
    """A payload as indented JSON (control characters escaped by the encoder)."""
    try:
        return safe(json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=True))
    except (TypeError, ValueError):
        return safe(repr(payload))


def _iso(when: datetime | None) -> str | None:
    return when.isoformat() if when else None


def task_dict(info: TaskInfo) -> dict[str, Any]:
    return {
        "id": info.id,
        "queue": info.queue,
        "state": info.state,
        "kind": info.kind,
        "payload": info.payload,
        "headers": dict(info.headers),
        "attempts": info.attempts,
        "max_attempts": info.max_attempts,
        "priority": info.priority,
        "due_at": _iso(info.due_at),
        "created_at": _iso(info.created_at),
        "lease_deadline": _iso(info.lease_deadline),
        "finished_at": _iso(info.finished_at),
        "last_error": info.last_error,
        "result": info.result,
    }


def preview(payload: Any, limit: int = 120) -> str:
    """A payload on one line, cut to ``limit`` characters."""
    try:
        text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), default=repr)
    except (TypeError, ValueError):
        text = repr(payload)
    text = safe(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def first_line(text: str | None) -> str:
    """The line of an error that says most: a traceback's last line, else the first."""
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    return safe(lines[-1] if lines[0].startswith(("Traceback", "attempt ")) else lines[0])


def timestamp(when: datetime | None) -> str:
    """'2026-11-29 21:24:32.472 UTC' (milliseconds are what due times carry)."""
    if when is None:
        return "-"
    return when.strftime("%Y-%m-%d %H:%M:%S.") + f"{when.microsecond // 1000:03d} UTC"


def console(*, stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr): a terminal's own width, and on a pipe or a file
    no width at all (rich would cut tables and wrap lines at 80 columns), so that what is
    piped is laid out as a wide terminal shows it; ``$COLUMNS`` still sets one."""
    out = Console(stderr=stderr)
    if out.is_terminal or os.environ.get(COLUMNS_ENV):
        return out
    return Console(stderr=stderr, width=UNLIMITED)
