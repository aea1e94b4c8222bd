"""What the scripts reply about tasks and workers, read: a value as text or bytes, a task
as a :class:`~delayq.task.TaskInfo` (an undecodable record still shows), a registration
as a :class:`~delayq.task.WorkerInfo` (whatever another program wrote there). Pure: no
I/O."""

from __future__ import annotations

import json
from typing import Any

from delayq.codec import Attempt, Codec, RecordError, Tombstone, decode_payload, split_record
from delayq.task import STATES, State, TaskInfo, WorkerInfo
from delayq.timing import ms_to_datetime


def as_str(value: Any) -> str:
    """A reply's value as text (replies come as bytes; tests may pass str). What delayq writes
    is UTF-8; bytes another program wrote that are not show as ``\\xNN`` (a dead task buried
    by its raw id, say), rather than fail the whole reply."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)


def as_bytes(value: Any) -> bytes:
    """A reply's value as bytes."""
    return value if isinstance(value, bytes) else str(value).encode()


def task_info(
    queue: str,
    codecs: dict[str, Codec],
    task_id: str,
    state: str,
    score: float,
    record: bytes,
    err: Any,
    attempt: Any,
    result: Any = None,
) -> TaskInfo:
    """A TaskInfo of ``queue`` from what the scripts return (record or tombstone, last error,
    attempt state, result: JSON text); an undecodable record still shows."""
    last_error = as_str(err) if err else None
    when = ms_to_datetime(score)
    value = _result(result)
    if state == "cancelled":  # a tombstone: the id and the time of the cancel, no record
        return TaskInfo(
            id=task_id,
            kind="",
            payload=None,
            state="cancelled",
            due_at=None,
            attempts=0,
            max_attempts=0,
            last_error=None,
            created_at=None,
            finished_at=when,
            queue=queue,
        )
    if state in ("done", "aborted"):
        tomb = Tombstone.parse(record)
        if tomb is not None:
            return TaskInfo(
                id=task_id,
                kind=tomb.kind,
                payload=None,
                state=_state(state),
                due_at=None if tomb.lag_ms is None else ms_to_datetime(score - tomb.lag_ms),
                attempts=tomb.attempts,
                max_attempts=0,
                last_error=last_error,
                created_at=None,
                finished_at=when,
                queue=queue,
                result=value,
            )
    try:
        header, data = split_record(record)
    except RecordError as e:
        # Still show what the sets know: when it died, is due, or its lease ends.
        return TaskInfo(
            id=task_id,
            kind="?",
            payload=None,
            state=_state(state),
            due_at=when if state == "scheduled" else None,
            attempts=0,
            max_attempts=0,
            last_error=last_error or str(e),
            created_at=None,
            lease_deadline=when if state == "active" else None,
            finished_at=when if state in ("done", "dead", "aborted") else None,
            queue=queue,
        )
    run = Attempt.parse(as_bytes(attempt) if attempt else None)
    try:
        payload = decode_payload(header, data, codecs)
    except RecordError as e:
        payload, last_error = None, last_error or str(e)
    return TaskInfo(
        id=task_id,
        kind=header.kind,
        payload=payload,
        state=_state(state),
        due_at=when
        if state == "scheduled"
        else (ms_to_datetime(run.due_ms) if run.due_ms is not None else None),
        attempts=run.attempt,
        max_attempts=header.max_attempts,
        last_error=last_error,
        created_at=ms_to_datetime(header.created_ms) if header.created_ms else None,
        lease_deadline=when if state == "active" else None,
        finished_at=when if state in ("done", "dead", "aborted") else None,
        queue=queue,
        headers=header.headers,
        result=value,
        priority=header.priority,
    )


def _result(text: Any) -> Any:
    """A stored result (JSON text) decoded; None for none, the text itself if it is not
    JSON (another program wrote it)."""
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return as_str(text)


def parse_worker(tid: str, seen_ms: float, info: Any, now_ms: float, queue: str) -> WorkerInfo:
    """A registration as stored by the worker (JSON), tolerant of missing fields and of
    whatever another program wrote there: a field that cannot be read keeps its default (a
    worker's cron pass reads every registration, and one must not stop it)."""
    try:
        data = json.loads(info) if info else {}
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    beat = _number(data.get("beat"), 10.0)
    started = _number(data.get("started"), 0.0)
    kinds = data.get("kinds")
    return WorkerInfo(
        id=tid,
        queue=queue,
        host=str(data.get("host", "?")),
        pid=int(_number(data.get("pid"), 0)),
        concurrency=int(_number(data.get("concurrency"), 0)),
        in_flight=int(_number(data.get("in_flight"), 0)),
        kinds=[str(k) for k in kinds] if isinstance(kinds, list) else [],
        started_at=ms_to_datetime(started * 1000) if started else None,
        last_seen=ms_to_datetime(seen_ms),
        alive=now_ms - seen_ms <= 3 * beat * 1000,
    )


def _number(value: Any, default: float) -> float:
    """A finite number of a registration (JSON), else ``default``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
        if number - number == 0:  # (not inf or nan)
            return number
    return default


def _state(state: str) -> State:
    if state not in STATES:
        raise ValueError(f"unknown task state {state!r}")
    return state
