"""The OpenAPI 3.1 description of the HTTP API, written as data.

The request schemas are built from the field tables the API validates with
(``schemas.py``); the problem types from ``problems.TYPES``. ``GET /openapi.json`` serves
this document without a token: it describes the product's API, not any data.
"""

from __future__ import annotations

from typing import Any

from delayq.http import schemas, typed
from delayq.http.problems import MEDIA_TYPE, TYPE_BASE, TYPES
from delayq.task import STATES

VERSION = "1.0.0"

_ISO = {"type": "string", "format": "date-time"}
_NULLABLE_ISO = {"type": ["string", "null"], "format": "date-time"}


def _body(body: schemas.Body, **extra: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {f.name: dict(f.schema) for f in body.fields},
        "required": list(body.required),
        **extra,
    }


_NOT_BOTH = {"not": {"required": ["delay", "at"]}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _problem(name: str, description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {MEDIA_TYPE: {"schema": _ref("Problem")}},
    }


# A queue outside queues= is a 404 on every route naming one; so is an unknown task or key.
_NOT_FOUND = {
    "404": _problem(
        "not-found",
        "A queue this API does not serve (`queues=`, `delayq api -q`); on a task's or a "
        "watched key's route, no such task (or watched key).",
    )
}
# The errors every route under /v1 can answer.
_COMMON = {
    **_NOT_FOUND,
    "401": _problem("unauthorized", "No token, or a wrong one."),
    "422": _problem("invalid", "Invalid input: the errors list says where and how to fix it."),
    "500": _problem("internal", "The API failed (its log has the traceback)."),
    "503": _problem("unavailable", "Redis is unreachable; nothing was written."),
}
_BODY_ERRORS = {
    "400": _problem(
        "bad-request",
        "Not valid HTTP/1.1; or, the API mounted in an application under uvicorn's own "
        "protocol, a request offering `Upgrade: h2c` whose body the server dropped.",
    ),
    "413": _problem("too-large", "The body, a payload or the batch is over its limit."),
    "415": _problem("unsupported-media-type", "The body is not JSON."),
}
_CONFLICT = {"409": _problem("conflict", "The task is running or finished.")}
_IN_FLIGHT = {
    "409": _problem(
        "in-flight",
        "A request with this Idempotency-Key is still being answered: send it again later "
        "(Retry-After: 1) to get that request's answer.",
    )
}
_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
    "description": "Send the request again with the same key and body, within the queue's "
    "dedupe window, and it answers the first result again (with `Idempotent-Replayed: "
    "true`) instead of scheduling again; the same key with another body is a 422. A task "
    "sent without an id gets one derived from the key (in a batch, from the key and its "
    "index).",
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _request(name: str) -> dict[str, Any]:
    media: dict[str, Any] = {"schema": _ref(name)}
    if name in _EXAMPLES:
        media["example"] = _EXAMPLES[name]
    return {"required": True, "content": {"application/json": media}}


# The bodies the interactive page fills in (Swagger UI's "Try it out"): each one succeeds as
# it is (without them, it made one from the schema: delay and at both, a random kind).
_EXAMPLES: dict[str, Any] = {
    "Task": {"kind": "order.close", "payload": {"order_id": 42}, "delay": "15m"},
    "Batch": {
        "tasks": [
            {"kind": "order.close", "payload": {"order_id": 42}, "delay": "15m"},
            {"kind": "order.close", "payload": {"order_id": 43}, "delay": "1h"},
        ]
    },
    "Reschedule": {"delay": "30m"},
    "ExpiringSet": {"value": {"session": 7}, "ttl": "30m"},
    "ExpiringTouch": {"ttl": "30m"},
}


def _op(
    op_id: str,
    summary: str,
    responses: dict[str, Any],
    *,
    body: str | None = None,
    secured: bool = True,
    params: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": op_id, "summary": summary, "responses": responses}
    if body is not None:
        op["requestBody"] = _request(body)
    if params:
        op["parameters"] = params
    op["security"] = [{"bearer": []}] if secured else []
    return op


def _path_param(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": schema,
        "description": description,
    }


_QUEUE = _path_param(
    "queue",
    {"type": "string", "pattern": schemas.QUEUE_PATTERN},
    "The queue's name (1-100 of letters, digits and `_.:-`).",
)
_ID = _path_param(
    "id",
    dict(schemas.ID.schema, description=None) | {"description": "The task's id."},
    "The task's id (percent-encode `/` as `%2F`).",
)
_KEY = _path_param(
    "key",
    {"type": "string", "minLength": 1, "maxLength": schemas.KEY_MAX, "pattern": schemas.NO_CONTROL},
    "The watched key (percent-encode `/` as `%2F`).",
)

_SCHEDULED = {
    "type": "object",
    "required": ["id", "due_at", "created", "status"],
    "properties": {
        "id": {"type": "string"},
        "due_at": dict(
            _NULLABLE_ISO,
            description="When the task is due, as stored on the Redis server's clock (what GET "
            "answers); for a task left as it was, its own due time.",
        ),
        "created": {"type": "boolean", "description": "False when the id existed already."},
        "status": {"type": "string", "enum": ["created", "replaced", "unchanged", "running"]},
    },
}

_TASK = {
    "type": "object",
    "required": [
        "id",
        "queue",
        "state",
        "kind",
        "payload",
        "headers",
        "attempts",
        "max_attempts",
        "priority",
        "due_at",
        "created_at",
        "lease_deadline",
        "finished_at",
        "last_error",
        "result",
    ],
    "properties": {
        "id": {"type": "string"},
        "queue": {"type": "string"},
        "state": {"type": "string", "enum": list(STATES)},
        "kind": {"type": "string"},
        "payload": {},
        "headers": {"type": "object", "additionalProperties": {"type": "string"}},
        "attempts": {"type": "integer"},
        "max_attempts": {"type": "integer"},
        "priority": {"type": "integer", "minimum": 0, "maximum": 9},
        "due_at": _NULLABLE_ISO,
        "created_at": _NULLABLE_ISO,
        "lease_deadline": _NULLABLE_ISO,
        "finished_at": _NULLABLE_ISO,
        "last_error": {"type": ["string", "null"]},
        "result": {
            "description": "What a done task's handler returned (null: nothing); a done or "
            "aborted task's payload is null unless its queue keeps whole records"
        },
    },
}

_WORKER = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "queue": {"type": "string"},
        "host": {"type": "string"},
        "pid": {"type": "integer"},
        "concurrency": {"type": "integer"},
        "in_flight": {"type": "integer"},
        "kinds": {"type": "array", "items": {"type": "string"}},
        "started_at": _NULLABLE_ISO,
        "last_seen": _ISO,
        "alive": {"type": "boolean"},
    },
}

_STATS = {
    "type": "object",
    "required": [
        "queue",
        "scheduled",
        "due",
        "active",
        "dead",
        "done",
        "oldest_due_age",
        "next_due_at",
        "next_lease_deadline",
        "counters",
        "now",
        "expiry_mode",
        "workers_alive",
        "workers",
        "paused",
        "rate_limit",
        "throttle_backlog_s",
    ],
    "properties": {
        "queue": {"type": "string"},
        "scheduled": {"type": "integer", "description": "Tasks waiting (due or not)."},
        "due": {"type": "integer", "description": "Waiting tasks already due."},
        "active": {"type": "integer", "description": "Tasks running."},
        "dead": {"type": "integer"},
        "done": {"type": "integer", "description": "Finished, within the dedupe window."},
        "aborted": {"type": "integer", "description": "Aborted, within the dedupe window."},
        "oldest_due_age": {
            "type": "number",
            "description": "Seconds the oldest due task has waited.",
        },
        "next_due_at": _NULLABLE_ISO,
        "next_lease_deadline": _NULLABLE_ISO,
        "counters": {"type": "object", "additionalProperties": {"type": "integer"}},
        "now": _ISO,
        "expiry_mode": {"type": ["string", "null"]},
        "paused": {"type": "boolean", "description": "No task is claimed while paused."},
        "rate_limit": {
            "type": ["object", "null"],
            "properties": {
                "rate": {"type": "string"},
                "per_second": {"type": "number"},
                "burst": {"type": "number"},
            },
        },
        "throttle_backlog_s": {
            "type": ["number", "null"],
            "description": "Seconds the rate limit needs for the tasks due now.",
        },
        "workers_alive": {"type": "integer"},
        "workers": {"type": "array", "items": _WORKER},
    },
}

_PROBLEM = {
    "type": "object",
    "description": "RFC 9457 problem details.",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "enum": [TYPE_BASE + name for name in TYPES]},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string", "description": "What went wrong and how to fix it."},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["pointer", "detail"],
                "properties": {
                    "pointer": {
                        "type": "string",
                        "description": "JSON pointer into the body (empty: the request itself).",
                    },
                    "detail": {"type": "string"},
                    "index": {"type": "integer", "description": "The batch's task."},
                },
            },
        },
        "id": {"type": "string", "description": "The task id tried (send it again)."},
        "state": {"type": "string", "description": "The task's state (409)."},
        "scheduled": {"type": "array", "items": {"type": "object"}},
        "unconfirmed": {"type": "array", "items": {"type": "object"}},
    },
}


_READY_QUEUE = {
    "name": "queue",
    "in": "query",
    "required": False,
    "schema": {"type": "string", "pattern": schemas.QUEUE_PATTERN},
}


def _head(responses: dict[str, Any]) -> dict[str, Any]:
    """A GET's responses as HEAD answers them: the same status and headers, no body."""
    return {code: {"description": r["description"]} for code, r in responses.items()}


def document(task_types: typed.Types | None = None) -> dict[str, Any]:
    """The OpenAPI document ``GET /openapi.json`` serves; with ``task_types`` (kind ->
    TaskType), each of those kinds' payload schema too."""
    task_paths = {
        "/v1/queues/{queue}": {
            "get": _op(
                "queueStats",
                "The queue's counts, schedule head and workers (as `delayq info --json`).",
                {"200": _json(_STATS, "The queue's stats."), **_COMMON},
                params=[_QUEUE],
            ),
        },
        "/v1/queues/{queue}/tasks": {
            "post": _op(
                "scheduleTask",
                "Schedule a task.",
                {
                    "201": _json(_SCHEDULED, "Created."),
                    "200": _json(_SCHEDULED, "The id existed: left as it was (or replaced)."),
                    **_COMMON,
                    **_BODY_ERRORS,
                    **_IN_FLIGHT,
                },
                body="Task",
                params=[_QUEUE, _IDEMPOTENCY_KEY],
            ),
        },
        "/v1/queues/{queue}/tasks/batch": {
            "post": _op(
                "scheduleBatch",
                f"Schedule up to {schemas.MAX_BATCH} tasks: all are checked first, and on any "
                "error nothing is written.",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["tasks"],
                            "properties": {"tasks": {"type": "array", "items": _SCHEDULED}},
                        },
                        "Each task's result, in the order sent.",
                    ),
                    **_COMMON,
                    **_BODY_ERRORS,
                    **_IN_FLIGHT,
                },
                body="Batch",
                params=[_QUEUE, _IDEMPOTENCY_KEY],
            ),
        },
        "/v1/queues/{queue}/tasks/{id}": {
            "get": _op(
                "getTask",
                "The task's state.",
                {"200": _json(_TASK, "The task."), **_NOT_FOUND, **_COMMON},
                params=[_QUEUE, _ID],
            ),
            "delete": _op(
                "cancelTask",
                "Cancel a waiting task.",
                {"204": {"description": "Cancelled."}, **_NOT_FOUND, **_CONFLICT, **_COMMON},
                params=[_QUEUE, _ID],
            ),
            "patch": _op(
                "rescheduleTask",
                "Move a waiting task to a new due time.",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["id", "due_at"],
                            "properties": {
                                "id": {"type": "string"},
                                "due_at": dict(
                                    _ISO,
                                    description="The new due time, as stored (what GET answers).",
                                ),
                            },
                        },
                        "Rescheduled.",
                    ),
                    **_NOT_FOUND,
                    **_CONFLICT,
                    **_COMMON,
                    **_BODY_ERRORS,
                },
                body="Reschedule",
                params=[_QUEUE, _ID],
            ),
        },
        "/v1/queues/{queue}/expiring/{key}": {
            "put": _op(
                "setExpiringKey",
                "Set a watched key with a TTL; its `on_expire` callback runs when it expires.",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["key", "deadline"],
                            "properties": {"key": {"type": "string"}, "deadline": _ISO},
                        },
                        "Set; `deadline` is on the server's clock.",
                    ),
                    **_COMMON,
                    **_BODY_ERRORS,
                },
                body="ExpiringSet",
                params=[_QUEUE, _KEY],
            ),
            "delete": _op(
                "deleteExpiringKey",
                "Delete a watched key without a callback.",
                {
                    "204": {"description": "Deleted before it expired."},
                    **_NOT_FOUND,
                    **_COMMON,
                },
                params=[_QUEUE, _KEY],
            ),
        },
        "/v1/queues/{queue}/expiring/{key}/touch": {
            "post": _op(
                "touchExpiringKey",
                "Give a watched key a new TTL.",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["key", "touched"],
                            "properties": {
                                "key": {"type": "string"},
                                "touched": {"type": "boolean", "const": True},
                            },
                        },
                        "Its deadline moved.",
                    ),
                    **_NOT_FOUND,
                    **_COMMON,
                    **_BODY_ERRORS,
                },
                body="ExpiringTouch",
                params=[_QUEUE, _KEY],
            ),
        },
    }
    probes = {
        "/healthz": {
            "get": _op(
                "healthz",
                "The process is up (no token needed).",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["status"],
                            "properties": {"status": {"const": "ok"}},
                        },
                        "Up.",
                    )
                },
                secured=False,
            ),
            "head": _op(
                "healthzHead",
                "The process is up: GET's answer without its body (for probes that send HEAD).",
                {"200": {"description": "Up."}},
                secured=False,
            ),
        },
        "/readyz": {
            "get": _op(
                "readyz",
                "Redis answers; with `queue`, that queue's protocol version too.",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["status"],
                            "properties": {
                                "status": {"const": "ready"},
                                "queue": {"type": "string"},
                                "protocol_version": {
                                    "type": "string",
                                    "description": "With `queue`: its protocol version "
                                    "(empty: none stored yet, protocol 1).",
                                },
                            },
                        },
                        "Ready.",
                    ),
                    **_COMMON,
                },
                params=[_READY_QUEUE],
            ),
            "head": _op(
                "readyzHead",
                "Ready: GET's answer without its body (for probes that send HEAD).",
                {"200": {"description": "Ready."}, **_head(_COMMON)},
                params=[_READY_QUEUE],
            ),
        },
        "/openapi.json": {
            "get": _op(
                "openapi",
                "This document (no token needed).",
                {"200": _json({"type": "object"}, "The OpenAPI document.")},
                secured=False,
            )
        },
    }
    doc = {
        "openapi": "3.1.0",
        "info": {
            "title": "delayq HTTP API",
            "version": VERSION,
            "description": "Schedule delayed tasks and watch expiring keys from any service. "
            "Errors are RFC 9457 problem details (application/problem+json).",
        },
        "paths": {**task_paths, **probes},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Task": _body(schemas.TASK, **_NOT_BOTH),
                "BatchTask": _body(schemas.BATCH_TASK, **_NOT_BOTH),
                "Batch": _body(
                    schemas.BATCH,
                    properties={
                        "tasks": dict(
                            schemas.TASKS.schema,
                            items=_ref("BatchTask"),
                            description="The tasks; each `id` given must differ from the "
                            "others' (a repeated one is a 422).",
                        ),
                        "replace": dict(schemas.REPLACE.schema),
                        "durable": dict(schemas.DURABLE.schema),
                    },
                ),
                "Reschedule": _body(
                    schemas.RESCHEDULE,
                    oneOf=[{"required": ["delay"]}, {"required": ["at"]}],
                ),
                "ExpiringSet": _body(schemas.EXPIRING_SET),
                "ExpiringTouch": _body(schemas.EXPIRING_TOUCH),
                "Problem": _PROBLEM,
            },
        },
        "security": [{"bearer": []}],
    }
    if task_types:
        typed.add_to(doc, task_types)
    return doc
