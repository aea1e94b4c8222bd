"""Who may use the dashboard: a token, a session cookie, CSRF tokens, security headers.

- A request is let in with ``Authorization: Bearer <token>`` or the session cookie.
- ``GET ...?token=<token>`` (the link printed at start) sets the session cookie (HttpOnly,
  SameSite=Strict) and redirects to the same page without the token, so it does not stay
  in the address bar.
- Anything else gets 401. Every response carries a strict Content-Security-Policy (no
  inline script), and pages are never cached.

The cookie and the CSRF token are HMACs of the token: stateless, valid across restarts and
replicas, and worthless once the token changes.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlsplit

from starlette.datastructures import URL, Headers, MutableHeaders
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from delayq.web.tokens import Token

COOKIE = "delayq_session"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


def _mac(token: str, purpose: str) -> str:
    return hmac.new(
        token.encode(), f"delayq-dashboard:{purpose}".encode(), hashlib.sha256
    ).hexdigest()


MIN_TOKEN = 8


class Secrets:
    """The token (checked as the API's is, spaces around it dropped) and what is derived
    from it."""

    def __init__(self, token: str) -> None:
        self.checked = Token(token, least=MIN_TOKEN, what="the dashboard token")
        self.token = self.checked.text
        self.session = _mac(self.token, "session")
        self.csrf = _mac(self.token, "csrf")

    def is_token(self, value: str | None) -> bool:
        return self.checked.matches(value)

    def is_session(self, value: str | None) -> bool:
        return value is not None and hmac.compare_digest(value.encode(), self.session.encode())

    def is_csrf(self, value: str | None) -> bool:
        return value is not None and hmac.compare_digest(value.encode(), self.csrf.encode())


def same_origin(request: Request) -> bool:
    """A browser's POST names its origin; refuse one from another site. (Compared by host
    only: behind a TLS proxy the scheme we see differs from the browser's.)"""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host", "")


def local_path(target: object) -> str | None:
    """``target`` if it is a path of this site (``/queues/x?after=...``), else None.

    Only printable ASCII, no space or backslash, is taken, then parsed: browsers drop tabs
    and newlines anywhere in a URL and controls and spaces around it, and read a backslash
    as a slash, so ``/\\t/evil.example`` or ``/\\evil.example`` would reach another
    site; ``urlsplit`` drops the tab as well, after a check for ``//`` has passed. What
    remains must have no scheme or host and a path that starts with one slash only.
    """
    if not isinstance(target, str) or not target.isascii() or not target.isprintable():
        return None
    if " " in target or "\\" in target or not target.startswith("/"):
        return None
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/"):
        return None
    if parts.path.startswith("//"):
        return None
    return target


class TokenAuth:
    """ASGI middleware in front of the whole app (pages, static files, /metrics)."""

    def __init__(self, app: ASGIApp, secrets: Secrets) -> None:
        self.app = app
        self.secrets = secrets

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secure(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        response = self.gate(scope)
        if response is None:
            await self.app(scope, receive, send_secure)
        else:
            await response(scope, receive, send_secure)

    def gate(self, scope: Scope) -> Response | None:
        """None to let the request in, else the response that refuses or redirects it."""
        headers = Headers(scope=scope)
        if self.secrets.checked.matches_header(headers.get("authorization")):
            return None
        request = Request(scope)
        if self.secrets.is_session(request.cookies.get(COOKIE)):
            return None
        offered = request.query_params.get("token")
        if offered is not None and scope["method"] in ("GET", "HEAD"):
            if not self.secrets.is_token(offered):
                return _refuse("wrong token")
            url = URL(scope=scope).remove_query_params("token")
            target = url.path + (f"?{url.query}" if url.query else "")
            response = RedirectResponse(target, status_code=303)
            response.set_cookie(
                COOKIE,
                self.secrets.session,
                httponly=True,
                samesite="strict",
                secure=scope.get("scheme") == "https",
                path="/",
            )
            return response
        return _refuse("token required")


def _refuse(why: str) -> Response:
    return PlainTextResponse(
        f"401 {why}: open the link `delayq dashboard` printed (…/?token=TOKEN), "
        "or send the header Authorization: Bearer TOKEN\n",
        status_code=401,
        headers={"www-authenticate": 'Bearer realm="delayq"'},
    )
