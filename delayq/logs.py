"""Log records as JSON, one object per line: ``delayq worker --log-format json``, or
``handler.setFormatter(JsonFormatter())`` in a program that serves a worker itself.

Each line holds ``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``,
``message`` and ``process``; the fields given as ``extra`` (the worker's records about an
attempt carry ``task_id``, ``kind``, ``attempt`` and ``queue``) when present; and
``exception``, the formatted traceback, when the record has ``exc_info``.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

# The attributes every LogRecord has: anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        for key, value in vars(record).items():  # an extra never replaces a field above
            if key not in _STANDARD and not key.startswith("_") and key not in out:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        try:
            return json.dumps(out, default=repr, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):  # NaN, a dict with tuple keys ...: still one line
            plain = (str, int, bool, type(None))
            safe = {k: v if isinstance(v, plain) else repr(v) for k, v in out.items()}
            return json.dumps(safe, ensure_ascii=False)
