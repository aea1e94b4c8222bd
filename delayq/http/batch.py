"""A batch's payloads refused, each named by its index."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from delayq.codec import encode_payload
from delayq.errors import InvalidTaskError, PayloadTooLarge
from delayq.http.problems import RESTART, Problem, field_error, invalid
from delayq.http.schemas import MAX_BATCH
from delayq.queue import AsyncQueue
from delayq.spec import TaskSpec


def refused_payloads(q: AsyncQueue, specs: Sequence[TaskSpec], e: InvalidTaskError) -> Problem:
    """A batch's payloads refused, each named by its index: 413 if one is over the queue's
    max_payload (as a single task's is), else 422."""
    errors: list[dict[str, Any]] = []
    large: list[str] = []
    for i, spec in enumerate(specs):
        try:
            q.core.encode_tasks([spec])
        except InvalidTaskError as bad:
            errors.append(field_error(f"/tasks/{i}/payload", str(bad), i))
            if isinstance(bad, PayloadTooLarge):
                large.append(f"task {i}'s {bad}")
    if not large:
        return invalid(errors or [field_error("/tasks", str(e))])
    more = f" (and {len(errors) - 1} more: see errors)" if len(errors) > 1 else ""
    return Problem("too-large", large[0] + RESTART + more, errors=errors)


def with_large_payloads(q: AsyncQueue, data: Any, p: Problem) -> Problem:
    """A batch's 422 (``p``: its fields' errors) with each payload over the queue's
    max_payload among its errors too, by index: one answer lists every error."""
    tasks = data.get("tasks") if isinstance(data, dict) else None
    if p.errors is None or not isinstance(tasks, list) or len(tasks) > MAX_BATCH:
        return p
    errors = list(p.errors)
    for i, task in enumerate(tasks):
        if isinstance(task, dict) and "payload" in task:
            try:
                encode_payload(q.core.codec, task["payload"], q.core.max_payload)
            except PayloadTooLarge as e:
                errors.append(field_error(f"/tasks/{i}/payload", str(e), i))
            except (InvalidTaskError, ValueError, TypeError, OverflowError):
                pass  # (not a size: the codec's refusal is named once the fields are valid)
    if len(errors) == len(p.errors):
        return p
    errors.sort(key=lambda e: int(e.get("index", -1)))
    return invalid(errors)
