"""The metrics port's HTTP server: ``/metrics``, and the probes ``/livez`` and ``/readyz``.

prometheus-client's own server answers every path with the metrics; this one is the same
server (a WSGI server in a daemon thread, one thread per request) with the two probes in
front. A probe answers 200 ``ok``, or 503 with the reason in one line of plain text; HEAD
answers the same without the body. What the reasons are: ``worker/health.py`` (one worker)
and ``processes/health.py`` (a ``--processes`` supervisor).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

# (why not live, why not ready): "" for each that is.
Verdict = Callable[[], tuple[str, str]]
PROBES = {"/livez": 0, "/readyz": 1}


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes come every few seconds: not a line each on stderr."""


def app(registry: CollectorRegistry, verdict: Verdict) -> Callable[..., Iterable[bytes]]:
    """The WSGI application: the probes, and the metrics on every other path."""
    metrics = make_wsgi_app(registry)

    def serve(request: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        which = PROBES.get(request.get("PATH_INFO", ""))
        if which is None:
            return metrics(request, start_response)  # type: ignore[no-any-return]
        method = request.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            body = b"use GET or HEAD\n"
            status, extra = "405 Method Not Allowed", [("Allow", "GET, HEAD")]
        else:
            reason = verdict()[which]
            body = f"{reason or 'ok'}\n".encode()
            status, extra = ("503 Service Unavailable" if reason else "200 OK"), []
        start_response(
            status,
            [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
                *extra,
            ],
        )
        return [b"" if method == "HEAD" else body]

    return serve


def start_server(
    port: int, host: str, registry: CollectorRegistry, verdict: Verdict
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``app(registry, verdict)`` on ``host:port`` in a daemon thread (port 0: any;
    an IPv6 host too, as prometheus-client's own server takes)."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]

    class Server(ThreadingWSGIServer):
        address_family = family

    server = make_server(
        str(address[0]), port, app(registry, verdict), Server, handler_class=_Quiet
    )
    thread = threading.Thread(target=server.serve_forever, name="delayq-metrics", daemon=True)
    thread.start()
    return server, thread
