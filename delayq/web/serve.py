"""Serving delayq's web apps with uvicorn: the HTTP API (``delayq api``) and the dashboard
(``delayq dashboard``).

Both get the same bounds on what clients can hold (:class:`Limits`: the flags
``--max-connections``, ``--keep-alive``, ``--header-timeout`` and ``--body-timeout`` of both
commands), the HTTP/1.1 protocol of ``protocol.py``, and say their URL only once they
listen. uvicorn is imported only here, when a server starts.
"""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from delayq.errors import ConfigurationError
from delayq.listen import base_url

log = logging.getLogger("delayq.web")


@dataclass(frozen=True)
class Limits:
    """What one client, or many, can hold of a server.

    Args:
        max_connections: connections and requests in progress at once; a request past
            them is answered 503 (uvicorn's ``limit_concurrency``).
        keep_alive: seconds an idle kept-alive connection stays open (uvicorn's
            ``timeout_keep_alive``).
        header_timeout: seconds a request's head (request line and headers) may take to
            arrive, from its first byte (from the connection, for its first request).
        body_timeout: seconds its body may take, from the end of its head.
    """

    max_connections: int = 1000
    keep_alive: int = 5
    header_timeout: float = 10.0
    body_timeout: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_connections", "keep_alive"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be a whole number from 1, got {value!r}")
        for name in ("header_timeout", "body_timeout"):
            value = getattr(self, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not ok or not math.isfinite(value) or not 0 < value <= 3600:
                raise ConfigurationError(
                    f"{name} must be seconds above 0 and at most 3600, got {value!r}"
                )


def protocol_class(limits: Limits) -> type[Any]:
    """The protocol uvicorn runs a connection with (``uvicorn.Config(http=...)``), with
    these limits' read deadlines. ImportError without httptools."""
    from delayq.web.protocol import Protocol

    return type(
        "Protocol",
        (Protocol,),
        {"header_timeout": float(limits.header_timeout), "body_timeout": limits.body_timeout},
    )


def serve(
    app: Any,
    *,
    sock: socket.socket,
    limits: Limits,
    log_level: str = "warning",
    access_log: bool = False,
    lifespan: Literal["on", "off"] = "on",
    announce: Callable[[str], None] | None = None,
) -> None:
    """Serve ``app`` (ASGI) on ``sock`` until SIGINT/SIGTERM; then close ``sock``.
    ``announce`` is called with the server's URL once it listens and the app has started."""
    import uvicorn

    http: Any
    try:
        http = protocol_class(limits)
    except ImportError:
        # (the dashboard's extra before it took httptools): uvicorn's h11 protocol has the
        # connection limit and the keep-alive timer, not the read deadlines.
        http = "h11"
        log.warning(
            "httptools is not installed: requests are read with no header or body timeout "
            "(pip install httptools)"
        )
    config = uvicorn.Config(
        app,
        http=http,
        limit_concurrency=limits.max_connections,
        timeout_keep_alive=limits.keep_alive,
        log_level=log_level,
        access_log=access_log,
        lifespan=lifespan,
        ws="none",
    )
    url = base_url(sock)

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if announce is not None and not self.should_exit:
                announce(url)

    try:
        Server(config).run(sockets=[sock])
    finally:
        sock.close()
