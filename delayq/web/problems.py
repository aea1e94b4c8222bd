"""Errors as RFC 9457 problem details (``application/problem+json``).

Every refusal the HTTP API makes is a :class:`Problem`: a type, a title, the status, a
``detail`` that names the fix, and for validation errors an ``errors`` list. The serving
layer (``serve.py``) answers a request that is too slow, or one over the connection limit,
with a problem too, for the API and the dashboard alike. ``TYPES`` is the one table of the
types, which the API's OpenAPI document lists.
"""

from __future__ import annotations

import json
from typing import Any

MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "urn:delayq:problem:"

# type name -> (status, title); the OpenAPI document lists the same table.
TYPES: dict[str, tuple[int, str]] = {
    "bad-request": (400, "Malformed request"),
    "unauthorized": (401, "Missing or wrong token"),
    "not-found": (404, "Not found"),
    "method-not-allowed": (405, "Method not allowed"),
    "request-timeout": (408, "Request not received in time"),
    "conflict": (409, "Conflict with the task's state"),
    "in-flight": (409, "Idempotency-Key still being answered"),
    "too-large": (413, "Request too large"),
    "unsupported-media-type": (415, "Unsupported media type"),
    "invalid": (422, "Invalid request"),
    "internal": (500, "Internal error"),
    "unavailable": (503, "Redis unavailable"),
    "not-durable": (503, "Durability not confirmed"),
    "overloaded": (503, "Too many connections"),
}


class Problem(Exception):
    """A refusal, raised anywhere in a request and answered as problem+json."""

    def __init__(
        self,
        name: str,
        detail: str,
        *,
        errors: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status, self.title = TYPES[name]
        self.name = name
        self.detail = detail
        self.errors = errors
        self.headers = headers or {}
        self.extra = extra

    def body(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "type": TYPE_BASE + self.name,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if self.errors is not None:
            doc["errors"] = self.errors
        doc.update(self.extra)
        return doc

    def encode(self) -> bytes:
        return json.dumps(self.body()).encode()
