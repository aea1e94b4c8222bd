"""Errors as RFC 9457 problem details (``application/problem+json``).

Every refusal the API makes is a :class:`Problem`: a type, a title, the status, a ``detail``
that names the fix, and for validation errors an ``errors`` list (a JSON pointer into the
request body and a detail each; a batch's entries also carry their ``index``). The
exceptions of the Python API map to problems in one place, :func:`from_error`.
"""

from __future__ import annotations

import json
from typing import Any

from delayq.errors import (
    ConfigurationError,
    ConnectionFailed,
    DurabilityError,
    InvalidTaskError,
    PayloadTooLarge,
    ProtocolVersionError,
)

MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "urn:delayq:problem:"

# type name -> (status, title); the OpenAPI document lists the same table.
TYPES: dict[str, tuple[int, str]] = {
    "unauthorized": (401, "Missing or wrong token"),
    "not-found": (404, "Not found"),
    "method-not-allowed": (405, "Method not allowed"),
    "conflict": (409, "Conflict with the task's state"),
    "too-large": (413, "Request too large"),
    "unsupported-media-type": (415, "Unsupported media type"),
    "invalid": (422, "Invalid request"),
    "internal": (500, "Internal error"),
    "unavailable": (503, "Redis unavailable"),
    "not-durable": (503, "Durability not confirmed"),
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


def invalid(errors: list[dict[str, Any]]) -> Problem:
    """422 listing each error; its detail is the first one's, and how many there are."""
    first = errors[0]["detail"]
    more = f" (and {len(errors) - 1} more: see errors)" if len(errors) > 1 else ""
    return Problem("invalid", f"{first}{more}", errors=errors)


def field_error(pointer: str, detail: str, index: int | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"pointer": pointer, "detail": detail}
    if index is not None:
        entry["index"] = index
    return entry


def unavailable(e: ConnectionFailed, **extra: Any) -> Problem:
    return Problem(
        "unavailable",
        f"{e}. Nothing was written unless listed otherwise; try again once Redis is back "
        "(a task sent with the same id is never scheduled twice)",
        headers={"retry-after": "1"},
        **extra,
    )


def from_error(e: Exception, pointer: str = "", **extra: Any) -> Problem:
    """The problem an exception of the Python API means (``pointer``: the body field it
    concerns, for validation errors); an unknown exception is re-raised."""
    if isinstance(e, Problem):
        return e
    if isinstance(e, PayloadTooLarge):
        return Problem("too-large", str(e), errors=[field_error(pointer or "/payload", str(e))])
    if isinstance(e, InvalidTaskError):
        return invalid([field_error(pointer, str(e))])
    if isinstance(e, ConnectionFailed):
        return unavailable(e, **extra)
    if isinstance(e, DurabilityError):
        return Problem(
            "not-durable",
            f"{e}. Sending the task again with the same id is safe: an id already waiting "
            "is left as it is",
            **extra,
        )
    if isinstance(e, ProtocolVersionError):
        return Problem("unavailable", str(e))
    if isinstance(e, ConfigurationError):
        # A queue being resharded, or split differently since it was opened.
        return Problem(
            "unavailable",
            f"{e}. The API reads the queue's shard count again on the next request",
            headers={"retry-after": "1"},
        )
    raise e
