"""The bearer tokens of delayq's web servers, checked once when the server starts and then
on every request.

A token is written once (a flag, an environment variable, a file) and sent back by clients
in ``Authorization: Bearer TOKEN``. HTTP drops the spaces around a header's value, and a
client's library drops them around the token, so a token with spaces around it could never
match: they are stripped at start-up (as ``--token-file`` always stripped its line's). A
token that is nothing but spaces, too short, or holding a character no header can carry (a
control character) or that clients send in different ways (outside ASCII) is refused,
naming the fix.
"""

from __future__ import annotations

import hmac

from delayq.errors import ConfigurationError

MAKE_ONE = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def clean_token(token: object, *, least: int, what: str) -> str:
    """``token`` without the spaces around it, or ConfigurationError naming what is wrong
    and the fix (``what``: "the API token", say; ``least``: the fewest characters)."""
    if not isinstance(token, str):
        raise ConfigurationError(
            f"{what} must be a string, not {type(token).__name__}; make one with {MAKE_ONE}"
        )
    stripped = token.strip()
    if not stripped:
        raise ConfigurationError(
            f"{what} is empty or only whitespace: set it to a secret of at least {least} "
            f"characters; make one with {MAKE_ONE}"
        )
    odd = next((c for c in stripped if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if odd is not None:
        raise ConfigurationError(
            f"{what} holds a control character ({odd!r}), which no HTTP header can carry: "
            f"use ASCII letters, digits and punctuation; make one with {MAKE_ONE}"
        )
    odd = next((c for c in stripped if ord(c) > 0x7F), None)
    if odd is not None:  # curl sends UTF-8, Python's http.client Latin-1 or nothing at all
        raise ConfigurationError(
            f"{what} holds a character outside ASCII ({odd!r}), which HTTP clients send "
            f"in different ways or not at all: use ASCII letters, digits and punctuation; "
            f"make one with {MAKE_ONE}"
        )
    if len(stripped) < least:
        raise ConfigurationError(
            f"{what} must be at least {least} characters (it has {len(stripped)}); make one "
            f"with {MAKE_ONE}"
        )
    return stripped


def bearer(value: bytes | str | None) -> bytes | None:
    """The credentials of an ``Authorization`` header's value if its scheme is Bearer (in
    any case), without the spaces around them; None otherwise."""
    if value is None:
        return None
    raw = value.encode("latin-1") if isinstance(value, str) else value
    scheme, _, credentials = raw.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    return credentials.strip()


class Token:
    """A token checked by :func:`clean_token`, compared in constant time."""

    __slots__ = ("encoded", "text")

    def __init__(self, token: object, *, least: int, what: str) -> None:
        self.text = clean_token(token, least=least, what=what)
        self.encoded = self.text.encode()

    def matches(self, given: bytes | str | None) -> bool:
        """Whether ``given`` (a header's credentials, a query parameter) is the token."""
        if given is None:
            return False
        raw = given.encode() if isinstance(given, str) else given
        return hmac.compare_digest(raw, self.encoded)

    def matches_header(self, value: bytes | str | None) -> bool:
        """Whether an ``Authorization`` header's value is ``Bearer <the token>``."""
        return self.matches(bearer(value))
