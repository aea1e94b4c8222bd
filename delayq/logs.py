"""Logs that say which task they are about.

:class:`JsonFormatter` writes a record as JSON, one object per line: ``delayq worker
--log-format json``, or ``handler.setFormatter(JsonFormatter())`` in a program that serves a
worker itself. Each line holds ``time`` (UTC, ISO 8601 with milliseconds), ``level``,
``logger``, ``message`` and ``process``; the fields given as ``extra`` (the worker's records
about an attempt carry ``task_id``, ``kind``, ``attempt`` and ``queue``) when present; the
same four of the task whose handler is running when a record is made without them (any
logger's: the handler's own lines too); and ``exception``, the formatted traceback, when
the record has ``exc_info``.

:class:`TaskFilter`, added to a logging handler, gives every record the running task's
fields as attributes a format string can name: ``%(delayq_task_id)s``, ``%(delayq_kind)s``,
``%(delayq_attempt)s``, ``%(delayq_queue)s``, and ``%(delayq_task)s``, which is
`` [KIND ID #ATTEMPT]`` in a task and empty outside one.

The worker sets :data:`CURRENT` around each attempt (in the attempt's own context, which
the handler threads copy), so what a handler logs, on the loop or in its thread, is known
to be about its task.
"""

from __future__ import annotations

import contextvars
import json
import logging
from datetime import UTC, datetime
from typing import Any

from delayq.task import Task

# The attributes every LogRecord has: anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


# The task whose handler runs in this context: set by the worker's executor in each
# attempt's own context (worker/execute.py), None outside an attempt.
CURRENT: contextvars.ContextVar[Task | None] = contextvars.ContextVar("delayq_task", default=None)

_NO_TASK = {
    "delayq_task_id": "",
    "delayq_kind": "",
    "delayq_attempt": "",
    "delayq_queue": "",
    "delayq_task": "",
}


class TaskFilter(logging.Filter):
    """Gives each record the fields of the task running where it was made (see the module
    docstring): add it to a handler, ``handler.addFilter(TaskFilter())``, and name them in
    its format, ``%(delayq_task_id)s``. It never drops a record. ``delayq worker`` adds it
    to its own handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        current = CURRENT.get()
        if current is None:
            record.__dict__.update(_NO_TASK)
        else:
            d = record.__dict__
            d["delayq_task_id"], d["delayq_kind"] = current.id, current.kind
            d["delayq_attempt"], d["delayq_queue"] = current.attempt, current.queue
            d["delayq_task"] = f" [{current.kind} {current.id} #{current.attempt}]"
        return True


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
            if key not in _STANDARD and not key.startswith(("_", "delayq_")) and key not in out:
                out[key] = value
        current = CURRENT.get()
        if current is not None and "task_id" not in out:  # a line the handler logged
            out["task_id"], out["kind"] = current.id, current.kind
            out["attempt"], out["queue"] = current.attempt, current.queue
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
