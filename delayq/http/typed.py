"""Typed tasks in the HTTP API: the task types it is given (``create_app(task_types=...)``,
``delayq api --task-types MODULE``) put each kind's payload schema in the OpenAPI document,
and a payload sent for one of those kinds is checked against its type, as the worker will
read it: one that does not match is a 422 naming the field, unwritten.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from delayq.errors import ConfigurationError
from delayq.http.problems import field_error, invalid
from delayq.spec import TaskSpec, TaskType

Types = Mapping[str, TaskType[Any, Any]]


def by_kind(task_types: Iterable[Any]) -> dict[str, TaskType[Any, Any]]:
    """Kind -> TaskType; ConfigurationError for something else, or a kind given twice."""
    out: dict[str, TaskType[Any, Any]] = {}
    for t in task_types:
        if not isinstance(t, TaskType):
            raise ConfigurationError(f"task_types takes TaskType objects, got {t!r}")
        if t.kind in out and out[t.kind] is not t:
            raise ConfigurationError(f"two task types of the kind {t.kind!r}")
        out[t.kind] = t
    return out


def check(specs: Sequence[TaskSpec], types: Types, batch: bool) -> None:
    """Raise a 422 listing every payload of a typed kind that does not match its type."""
    if not types:
        return
    errors = []
    for i, spec in enumerate(specs):
        t = types.get(spec.kind)
        if t is None:
            continue
        try:
            t.load(spec.payload)
        except Exception as e:  # ShapeError, or what a type's own validation raised
            pointer = f"/tasks/{i}/payload" if batch else "/payload"
            errors.append(field_error(pointer, t.reason(e), i if batch else None))
    if errors:
        raise invalid(errors)


def _component(kind: str) -> str:
    """A component name OpenAPI allows (``^[a-zA-Z0-9.-_]+$``) for a kind's payload."""
    return "Payload." + re.sub(r"[^A-Za-z0-9._-]", "_", kind)


def _rewrite(schema: Any, defs: Mapping[str, str]) -> Any:
    """``schema`` with its ``#/$defs/X`` references pointed at the components."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return {**schema, "$ref": f"#/components/schemas/{defs[ref[8:]]}"}
        return {k: _rewrite(v, defs) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_rewrite(v, defs) for v in schema]
    return schema


def add_to(document: dict[str, Any], types: Types) -> None:
    """Put each kind's payload schema in ``document``'s components (its ``$defs`` beside it,
    prefixed by the kind's name), and in the Task and BatchTask bodies, a rule per kind:
    ``if`` the kind is this one, ``then`` the payload is of its schema."""
    components = document["components"]["schemas"]
    rules = []
    for kind, t in sorted(types.items()):
        name = _component(kind)
        schema = dict(t.json_schema())
        local = schema.pop("$defs", {})
        defs = {d: f"{name}.{d}" for d in local}
        for d, body in local.items():
            components[defs[d]] = _rewrite(body, defs)
        components[name] = dict(_rewrite(schema, defs), description=f"The payload of {kind!r}.")
        rules.append(
            {
                "if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
                "then": {"properties": {"payload": {"$ref": f"#/components/schemas/{name}"}}},
            }
        )
    for body in ("Task", "BatchTask"):
        components[body] = dict(components[body], allOf=rules)
