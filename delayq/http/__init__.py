"""The HTTP API: ``delayq api``, or :func:`create_app` to mount it in your own app.

Any service can schedule tasks, look them up, cancel and reschedule them, and set watched
keys over HTTP, with a bearer token. It needs the ``http`` extra (``pip install
'delayq[http]'``: Starlette and uvicorn); importing it without that raises
:class:`~delayq.errors.MissingExtra`, which says so in one line.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable
from typing import Any

from delayq.extras import require

require("http", "the HTTP API")

from delayq.http.app import Api, create_app  # noqa: E402
from delayq.http.openapi import document  # noqa: E402
from delayq.listen import base_url, bind  # noqa: E402
from delayq.web.serve import Limits  # noqa: E402

__all__ = ["Api", "Limits", "base_url", "bind", "create_app", "document", "serve"]


def serve(
    url: str | None,
    *,
    token: str,
    sock: socket.socket,
    queues: list[str] | None = None,
    log_level: str = "warning",
    access_log: bool = False,
    limits: Limits | None = None,
    announce: Callable[[str], None] | None = None,
    task_types: Iterable[Any] = (),
) -> None:
    """Serve the API with uvicorn on ``sock`` (see :func:`bind`) until SIGINT/SIGTERM,
    within ``limits`` (:class:`~delayq.web.serve.Limits`; default: its defaults).
    ``announce`` is called with the API's URL once it listens; ``task_types``: as
    :func:`create_app` takes them."""
    from delayq.web.serve import serve as serve_app

    # The API itself, without the Starlette app around it (which only hands requests on:
    # docs/architecture.md says what it would cost).
    api = create_app(url, token=token, queues=queues, task_types=task_types).state.api
    serve_app(
        api,
        sock=sock,
        limits=limits or Limits(),
        log_level=log_level,
        access_log=access_log,
        lifespan="on",
        announce=announce,
    )
