"""The ASGI side of the HTTP API: the request and reply a handler sees, routing on the raw
path, and reading a body with a cap.

Requests are routed on the raw path, each segment percent-decoded, so a task id or a watched
key may hold a ``/`` (sent as ``%2F``).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from json.encoder import encode_basestring_ascii
from typing import Any
from urllib.parse import parse_qs, unquote

from starlette.types import Receive, Scope

from delayq.codec import compact_json
from delayq.http import schemas
from delayq.http.problems import MEDIA_TYPE, Problem, field_error, invalid

DRAIN = 4 * 1024 * 1024  # bytes of a refused body read and dropped, past its limit
JSON_MEDIA = b"application/json"
PROBLEM_MEDIA = MEDIA_TYPE.encode()
_encode_json = compact_json(ensure_ascii=True)


class Request:
    """What a handler is given: the route's parameters, the query, and the body."""

    __slots__ = ("body", "params", "query", "scope")

    def __init__(self, scope: Scope, params: dict[str, str], body: bytes) -> None:
        self.scope = scope
        self.params = params
        self.body = body

    def json(self) -> Any:
        return schemas.parse_json(self.body)

    def query_param(self, name: str) -> str | None:
        query = self.scope.get("query_string", b"").decode("latin-1")
        values = parse_qs(query, keep_blank_values=True).get(name)
        return values[-1] if values else None


class Reply:
    __slots__ = ("body", "headers", "media", "status")

    def __init__(self, status: int, data: Any = None, headers: dict[str, str] | None = None):
        self.status = status
        self.body = b"" if data is None else encode(data)
        self.headers = headers
        self.media = JSON_MEDIA


def encoded(status: int, body: bytes, headers: dict[str, str] | None = None) -> Reply:
    """A reply whose JSON body is encoded already."""
    reply = Reply(status, headers=headers)
    reply.body = body
    return reply


def encode_str(text: str) -> bytes:
    """A string as JSON, as :func:`encode` writes one (its string encoder, called alone)."""
    return encode_basestring_ascii(text).encode()


def encode(data: Any) -> bytes:
    try:
        return _encode_json(data).encode()
    except (TypeError, ValueError):
        # A payload JSON cannot hold (bytes, NaN: a msgpack task's): shown as text.
        return _encode_json(jsonable(data)).encode()


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, str | int | float):
        return value
    return repr(value)


Handler = Callable[[Request], Awaitable[Reply]]


def split_path(scope: Scope, errors: str = "strict") -> list[str]:
    """The path's segments under the app's mount point, each percent-decoded (so ``%2F``
    in an id stays inside its segment) as UTF-8: UnicodeDecodeError when one is not (with
    ``errors="strict"``; uvicorn's ``path`` has U+FFFD for such bytes)."""
    raw = scope.get("raw_path")
    if raw is None:  # (an ASGI server may leave it out: the decoded path, then)
        path: str = scope["path"]
        segments = path.split("/")[1:]
    else:
        text = raw.decode("latin-1").split("?", 1)[0]
        segments = [unquote(s, errors=errors) if "%" in s else s for s in text.split("/")[1:]]
    root = scope.get("root_path", "").rstrip("/")
    if root:
        head = root.split("/")[1:]
        if segments[: len(head)] == head:
            segments = segments[len(head) :]
    return segments


_PARAMS = {"id": "the task id", "key": "the key", "queue": "the queue name"}


def not_utf8(scope: Scope, segments: list[str], patterns: list[tuple[str, ...]]) -> Problem:
    """422 for a path whose percent-decoded bytes are not UTF-8 (``/tasks/%FF``; the
    ``segments`` decoded with surrogateescape), naming the route's parameter: decoded with
    U+FFFD, as uvicorn's ``path`` is, it would act on another task, key or queue."""
    where = "a segment"
    for pattern in patterns:
        params = match(pattern, segments) or {}
        bad = [k for k, v in params.items() if any("\udc80" <= c <= "\udcff" for c in v)]
        if bad:
            where = _PARAMS.get(bad[0], bad[0])
            break
    raw = scope.get("raw_path") or scope["path"].encode()
    path = raw.decode("latin-1").split("?", 1)[0]
    return invalid(
        [
            field_error(
                "",
                f"{where} in the path {path!r} is not UTF-8 once percent-decoded: ids, keys "
                "and queue names are UTF-8 text; percent-encode each of its UTF-8 bytes (é is "
                "%C3%A9)",
            )
        ]
    )


def match(pattern: tuple[str, ...], segments: list[str]) -> dict[str, str] | None:
    if len(pattern) != len(segments):
        return None
    params = {}
    for want, got in zip(pattern, segments, strict=True):
        if want[0] == "{":
            params[want[1:-1]] = got
        elif want != got:
            return None
    return params


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to be over ``limit``: by its
    Content-Length before keeping any of it, else once the bytes read pass it. A request
    whose Content-Type is not JSON is refused (415), and so is a body with no Content-Type
    (an empty one is let through, to be refused as empty where a body is needed). What is left
    of a refused body is read and dropped (up to DRAIN bytes more), so the client sees the
    413 rather than a reset connection; a body longer still is refused and the connection
    closed."""
    declared = -1
    media = None
    for name, value in scope["headers"]:
        if name == b"content-length":
            declared = int(value) if value.isdigit() else -1
        elif name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            if media != JSON_MEDIA and not media.endswith(b"+json"):
                raise Problem(
                    "unsupported-media-type",
                    f"the body is {media.decode('latin-1')!r}: send JSON with "
                    "'Content-Type: application/json'",
                )
    if declared > limit:
        drained = declared - limit <= DRAIN and await drain(receive, declared)
        raise too_large(limit, close=not drained)
    if media is None and declared > 0:
        raise no_media_type()
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Problem("invalid", "the client went away before the body was read")
        chunk = message.get("body", b"")
        size += len(chunk)
        more = message.get("more_body", False)
        if size > limit:
            drained = not more or await drain(receive, DRAIN)
            raise too_large(limit, close=not drained)
        chunks.append(chunk)
        if not more:
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if media is None or not body:  # (a JSON body skips the checks)
                check_bare(scope, body, media, declared)
            return body


async def drain(receive: Receive, budget: int) -> bool:
    """Read and drop the rest of a body, at most ``budget`` bytes; True if it all came."""
    while budget >= 0:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return budget >= 0
    return False


def check_bare(scope: Scope, body: bytes, media: bytes | None, declared: int) -> None:
    """Refuse a body with no Content-Type (sent without a Content-Length), or an empty one
    framed as more (chunked, or a Content-Length the body lacks: see lost_to_upgrade)."""
    if body:
        raise no_media_type()
    if declared != 0:
        lost_to_upgrade(scope, declared)


def lost_to_upgrade(scope: Scope, declared: int) -> None:
    """Refuse a request offering ``Upgrade: h2c`` whose body the server dropped (it came
    empty though framed as more): uvicorn's own protocols take such a request for the last
    HTTP on the connection, so a mounted API served by plain uvicorn sees no body."""
    upgrade = chunked = False
    for name, value in scope["headers"]:
        if name == b"upgrade":
            upgrade = upgrade or b"h2c" in value.lower()
        elif name == b"transfer-encoding":
            chunked = chunked or b"chunked" in value.lower()
    if upgrade and (declared > 0 or chunked):
        raise Problem(
            "bad-request",
            "the body of this request was lost by the server: the request offers "
            "'Upgrade: h2c' (the JDK's default HttpClient and curl --http2 do), and uvicorn's "
            "own HTTP protocols drop the body of such a request. Serve the application with "
            "delayq's protocol (uvicorn --http delayq.web.protocol:Protocol, or "
            "uvicorn.run(app, http=delayq.web.protocol.Protocol)), or run `delayq api`; "
            "or make the client send HTTP/1.1 only (HttpClient.Version.HTTP_1_1, curl --http1.1)",
        )


def no_media_type() -> Problem:
    return Problem(
        "unsupported-media-type",
        "the body has no Content-Type: send JSON with the header 'Content-Type: application/json'",
    )


def too_large(limit: int, *, close: bool) -> Problem:
    return Problem(
        "too-large",
        f"the body is over the limit of {limit:,} bytes: send smaller payloads (store large "
        "data elsewhere and pass a reference), or split a batch",
        headers={"connection": "close"} if close else None,
    )
