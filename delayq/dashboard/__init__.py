"""The web dashboard: ``delayq dashboard``, or :func:`create_app` to mount it yourself.

The worker never imports this package; it reads queues through :mod:`delayq.admin`. It needs
the ``dashboard`` extra (``pip install 'delayq[dashboard]'``); importing it without that raises
:class:`~delayq.errors.MissingExtra`, which says so in one line.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from delayq.extras import require

require("dashboard", "the dashboard")

from delayq.admin.inspect import Admin  # noqa: E402
from delayq.dashboard.app import create_app  # noqa: E402
from delayq.listen import base_url, bind  # noqa: E402
from delayq.web.serve import Limits  # noqa: E402

__all__ = ["Limits", "base_url", "bind", "create_app", "serve"]


def serve(
    admin: Admin,
    *,
    token: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    read_only: bool = False,
    log_level: str = "warning",
    announce: Callable[[str], None] | None = None,
    sock: socket.socket | None = None,
    limits: Limits | None = None,
) -> None:
    """Serve the dashboard with uvicorn until SIGINT/SIGTERM (on ``sock`` if given), within
    ``limits`` (:class:`~delayq.web.serve.Limits`; default: its defaults). ``announce`` is
    called with the dashboard's URL once it listens."""
    from delayq.web.serve import serve as serve_app

    app = create_app(admin, token=token, read_only=read_only)
    # No access log: the first request's URL carries the token.
    serve_app(
        app,
        sock=sock or bind(host, port),
        limits=limits or Limits(),
        log_level=log_level,
        access_log=False,
        lifespan="off",
        announce=announce,
    )
