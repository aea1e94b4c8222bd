"""The API's problems: validation errors and what the Python API's exceptions mean.

Every refusal the API makes is a :class:`~delayq.web.problems.Problem` (RFC 9457, shared
with the dashboard's serving layer): a type, a title, the status, a ``detail`` that names
the fix, and for validation errors an ``errors`` list (a JSON pointer into the request body
and a detail each; a batch's entries also carry their ``index``). The exceptions of the
Python API map to problems in one place, :func:`from_error`.
"""

from __future__ import annotations

from typing import Any

from delayq.errors import (
    ConfigurationError,
    ConnectionFailed,
    DurabilityError,
    InvalidTaskError,
    PayloadTooLarge,
    ProtocolVersionError,
)
from delayq.web.problems import MEDIA_TYPE, TYPE_BASE, TYPES, Problem

__all__ = [
    "MEDIA_TYPE",
    "TYPES",
    "TYPE_BASE",
    "Problem",
    "field_error",
    "from_error",
    "invalid",
    "unavailable",
]


# What a 413 for a payload adds: the limit is the queue's, as this process read it.
RESTART = (
    " (this API reads the queue's max_payload when it first serves the queue and keeps it "
    "until restarted: restart it after changing the setting)"
)


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
        detail = str(e) + RESTART
        return Problem("too-large", detail, errors=[field_error(pointer or "/payload", detail)])
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
