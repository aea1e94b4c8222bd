"""What a caller gives, checked where it enters: one checker per type of value, written once.

Each checker takes the value, the name of the parameter (every message names it, so the
caller knows which one to fix) and the call's error for bad input: ``ConfigurationError``
(the default) for a setting — a queue's, a worker's, a handler's, a test clock's —
``InvalidTaskError`` for what a task is given (``schedule``'s options, ids, pages). It
returns the value, checked (``many``: as a list). Nothing is converted by truthiness or
coerced: ``replace="no"`` is refused, not taken as True, and a bool is not a number here.

Durations are :func:`delayq.timing.seconds` and :func:`~delayq.timing.config_seconds`;
kinds, task ids and attempts are ``delayq.core``'s ``validate_*``; these are the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from delayq.errors import ConfigurationError, DelayqError

T = TypeVar("T")
Error = type[DelayqError]


def shown(value: Any) -> str:
    """A value as a message shows it: its repr, cut to 200 characters."""
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def flag(value: Any, name: str, error: Error = ConfigurationError) -> bool:
    """True or False, and nothing read as either (``"no"``, 0, None)."""
    if value is True or value is False:
        return bool(value)
    raise error(f"{name} must be True or False, got {shown(value)}")


def whole(
    value: Any,
    name: str,
    low: int,
    high: int | None = None,
    *,
    error: Error = ConfigurationError,
    hint: str = "",
) -> int:
    """An int (not a bool) from ``low`` to ``high`` (None: no upper bound). ``hint`` follows
    the bounds in the message (what the number is)."""
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and low <= value
        and (high is None or value <= high)
    ):
        return int(value)
    bounds = f">= {low:,}" if high is None else f"from {low:,} to {high:,}"
    raise error(f"{name} must be a whole number {bounds}{hint}, got {shown(value)}")


def real(
    value: Any,
    name: str,
    low: float,
    high: float,
    *,
    error: Error = ConfigurationError,
    hint: str = "",
) -> float:
    """A finite int or float (not a bool) from ``low`` to ``high``."""
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and low <= value <= high
    ):
        return float(value)
    raise error(f"{name} must be a number from {low:g} to {high:g}{hint}, got {shown(value)}")


def text(value: Any, name: str, *, error: Error = ConfigurationError, hint: str = "") -> str:
    """A non-empty str."""
    if isinstance(value, str) and value:
        return value
    raise error(f"{name} must be a non-empty string{hint}, got {shown(value)}")


def function(value: T, name: str, *, error: Error = ConfigurationError, hint: str = "") -> T:
    """Something callable (``hint``: what it is called with)."""
    if callable(value):
        return value
    raise error(f"{name} must be a function{hint}, got {shown(value)}")


def instance(
    value: Any,
    name: str,
    kinds: type[T] | tuple[type[T], ...],
    what: str,
    *,
    error: Error = ConfigurationError,
) -> T:
    """An instance of ``kinds`` (``what`` names them for the message)."""
    if isinstance(value, kinds):
        return value
    raise error(f"{name} must be {what}, got {shown(value)}")


def many(
    value: Any, name: str, *, error: Error = ConfigurationError, what: str = "items"
) -> list[Any]:
    """An iterable of ``what``, as a list: a list, tuple, set or generator, never a str or
    bytes (whose characters would be taken as the items) nor a mapping."""
    if type(value) is list:
        return value  # (the common case: no copy)
    if isinstance(value, Iterable) and not isinstance(value, str | bytes | bytearray | Mapping):
        return list(value)
    raise error(f"{name} must be a list (or another iterable) of {what}, got {shown(value)}")


def optional(check: Callable[..., T], value: Any, *args: Any, **kwargs: Any) -> T | None:
    """None, or ``check(value, *args, **kwargs)``."""
    return None if value is None else check(value, *args, **kwargs)
