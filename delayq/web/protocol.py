"""The HTTP/1.1 protocol delayq's web servers run under uvicorn: uvicorn's httptools
protocol (its C parser: about twice the requests a second of h11), with what it lacks.

- **An upgrade it does not take is ignored**, as RFC 9110 section 7.8 allows: the request
  is served as HTTP/1.1, body included. The JDK's default ``HttpClient`` and ``curl
  --http2`` offer ``Upgrade: h2c`` on every ``http://`` request. httptools takes any
  request with ``Connection: upgrade`` for the last HTTP on the connection: it reports the
  message complete without its body and stops there, so uvicorn hands the application an
  empty body (and would read the body as the next request). Here the body is read on, as
  the head framed it (its ``Content-Length`` or chunks), through a head of our own fed to
  the parser, and the connection goes on.
- **Deadlines on reading a request.** Its head (request line and headers) must arrive
  within ``header_timeout`` of its first byte (of the connection, for the first request),
  and its body within ``body_timeout`` of the head. uvicorn has neither, and the keep-alive
  timer it has is cancelled by any byte received, so a client sending a byte a second held
  a connection for ever. A request read too slowly is answered 408 and its connection
  closed. The time a request spends being answered is never counted.
- **A deadline on writing a response.** A response blocked on a client that does not read
  it (the transport's write buffer full: uvicorn pauses writing) must drain within
  ``write_timeout``, or the connection is aborted. The timer is armed only when the
  transport pauses writing, so a response that drains costs nothing more.
- **Over the connection limit** (uvicorn's ``limit_concurrency``) the 503 is a problem,
  like every other refusal, and closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from delayq.web.problems import MEDIA_TYPE, Problem

log = logging.getLogger("delayq.web")

_FRAMING = (b"content-length", b"transfer-encoding")
_PROBLEM_MEDIA = MEDIA_TYPE.encode()


def problem_response(p: Problem, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """A whole HTTP/1.1 response carrying ``p``, which closes the connection."""
    body = p.encode()
    head = [STATUS_LINE[p.status]]
    for name, value in [
        *default_headers,
        (b"content-type", _PROBLEM_MEDIA),
        (b"content-length", str(len(body)).encode()),
        *((k.encode(), v.encode()) for k, v in p.headers.items()),
        (b"connection", b"close"),
    ]:
        head += [name, b": ", value, b"\r\n"]
    return b"".join([*head, b"\r\n", body])


class Protocol(HttpToolsProtocol):
    """One connection. ``header_timeout`` and ``body_timeout`` are set on the subclass
    :func:`delayq.web.serve.protocol_class` makes for a server.

    Its overrides are few on purpose: a request received whole goes through four more
    Python calls than uvicorn's (``data_received``, ``on_headers_complete``,
    ``on_message_complete``, ``on_response_complete``) and arms no timer; the parser's
    per-header callbacks are uvicorn's own.
    """

    header_timeout = 10.0
    body_timeout = 30.0
    write_timeout = 30.0

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        # The connection limit is checked here (on_headers_complete), to answer a problem.
        self.max_connections = self.limit_concurrency
        self.limit_concurrency = None
        self.reading: str | None = None  # "head" or "body" while a request is read,
        self.since = 0.0  # since when (the loop's clock)
        self.deadline: asyncio.TimerHandle | None = None
        self.armed_for: tuple[str, float] | None = None
        self.replay: _Replay | None = None  # reading a declined upgrade's body
        self.write_deadline: asyncio.TimerHandle | None = None

    # -- the deadlines ------------------------------------------------------------------------

    def settle(self) -> None:
        """Arm the deadline of what is being read, if its time counts: not a request queued
        behind one being answered (uvicorn stops reading meanwhile)."""
        phase = self.reading
        if phase is None or (self.pipeline if phase == "body" else self.answering()):
            self.disarm()
            return
        if self.armed_for == (phase, self.since):
            return
        self.disarm()
        timeout = self.header_timeout if phase == "head" else self.body_timeout
        self.deadline = self.loop.call_at(self.since + timeout, self.too_slow, phase)
        self.armed_for = (phase, self.since)

    def disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = self.armed_for = None

    def answering(self) -> bool:
        """A request of this connection is being answered (its time is the server's)."""
        return self.cycle is not None and not self.cycle.response_complete

    def too_slow(self, phase: str) -> None:
        self.deadline = self.armed_for = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if phase == "body" and cycle is not None and cycle.response_started:
            self.transport.close()  # answered already (a body over its limit): just close
            return
        if phase == "head":
            seconds, what = self.header_timeout, "its head (the request line and headers)"
            flag = "--header-timeout"
        else:
            seconds, what, flag = self.body_timeout, "its body", "--body-timeout"
        log.info(
            "closed a connection from %s: %s did not arrive within %g s",
            f"{self.client[0]}:{self.client[1]}" if self.client else "?",
            what,
            seconds,
        )
        if cycle is not None and not cycle.response_complete:
            # The application, waiting for the body, sees the client gone and writes nothing.
            cycle.disconnected = True
            cycle.message_event.set()
        detail = (
            f"the request was read too slowly: {what} did not arrive within {seconds:g} s. "
            f"Send each request whole and at once; the server's {flag} sets the limit"
        )
        p = Problem("request-timeout", detail)
        self.transport.write(problem_response(p, self.server_state.default_headers))
        self.transport.close()

    # -- uvicorn's protocol, with the deadlines and upgrades ----------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.reading, self.since = "head", self.loop.time()
        self.settle()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.write_deadline is None:
            self.write_deadline = self.loop.call_later(self.write_timeout, self.write_too_slow)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.write_deadline is not None:
            self.write_deadline.cancel()
            self.write_deadline = None

    def write_too_slow(self) -> None:
        self.write_deadline = None
        log.info(
            "closed a connection from %s: its response did not drain within %g s "
            "(the client does not read it; the server's --write-timeout sets the limit)",
            f"{self.client[0]}:{self.client[1]}" if self.client else "?",
            self.write_timeout,
        )
        self.transport.abort()  # (close would wait for the buffer to drain: it never does)

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        if self.write_deadline is not None:
            self.write_deadline.cancel()
            self.write_deadline = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.reading is None and (self.cycle is None or self.cycle.response_complete):
            # The first bytes after a kept-alive wait (any bytes: CRLFs between requests too).
            self.reading, self.since = "head", self.loop.time()
        self._unset_keepalive_if_required()
        while data:
            try:
                self.parser.feed_data(data)
                data = b""
            except httptools.HttpParserError as e:
                self.logger.warning("Invalid HTTP request received.")
                self.refuse_malformed(data, e)
                return
            except httptools.HttpParserUpgrade as upgrade:
                if self._should_upgrade():  # a WebSocket this server takes
                    self.disarm()
                    self.handle_websocket_upgrade()
                    return
                data = self.decline_upgrade(data[upgrade.args[0] :])
        if self.replay is not None and self.replay.done:
            self.parser = _parser(self)  # (between requests: the next starts on our own)
            self.replay = None
        if self.reading is None:
            if self.deadline is not None:
                self.disarm()
        else:
            self.settle()

    def refuse_malformed(self, data: bytes, error: Exception) -> None:
        """A request the parser refused (``data``: the bytes it was fed): a 400 problem, and
        the connection closed (uvicorn's answer is a text/plain 400)."""
        if data.startswith(b"PRI * HTTP/2"):
            detail = (
                "the request is HTTP/2 with prior knowledge (the HTTP/2 preface): this API "
                "speaks HTTP/1.1. Send HTTP/1.1 requests (an 'Upgrade: h2c' offer is fine: it "
                "is served as HTTP/1.1), not HTTP/2 from the first byte (curl "
                "--http2-prior-knowledge, an h2c-only client)"
            )
        else:
            why = str(error) or type(error).__name__
            detail = (
                f"the request is not valid HTTP/1.1 ({why}): check its request line, its "
                "headers (each 'Name: value'), its chunked framing, and that it has either a "
                "Content-Length or a Transfer-Encoding, not both"
            )
        self.send_problem(Problem("bad-request", detail))

    def send_400_response(self, msg: str) -> None:
        # (uvicorn's own 400, text/plain; only a parser error sends it)
        self.send_problem(Problem("bad-request", f"the request is not valid HTTP/1.1 ({msg})"))

    def send_problem(self, p: Problem) -> None:
        self.disarm()
        self.transport.write(problem_response(p, self.server_state.default_headers))
        self.transport.close()

    def decline_upgrade(self, rest: bytes) -> bytes:
        """What to feed the parser after the head of a request whose upgrade is not taken
        (``rest``: the bytes received after that head)."""
        if self.scope["method"] == "CONNECT":  # what follows is a tunnel's: not HTTP
            self.logger.warning("Unsupported upgrade request.")
            self.cycle.keep_alive = False
            self.flow.pause_reading()
            return b""
        framing = [(n, v) for n, v in self.headers if n in _FRAMING]
        if not framing:
            return rest  # no body: what follows is the next request
        # The parser took the request as complete, without its body: open it again, and
        # read the body through a head of ours that frames it as the request's did, fed to
        # a parser of its own whose head callbacks are dropped.
        self.cycle.more_body = True
        self.cycle.message_event.clear()
        self.reading = "body"  # (since the end of the request's head, as before)
        self.replay = _Replay(self)
        self.parser = _parser(self.replay)
        head = b"".join(n + b": " + v + b"\r\n" for n, v in framing)
        return b"POST / HTTP/1.1\r\n" + head + b"\r\n" + rest

    def on_headers_complete(self) -> None:
        app = self.app
        limit = self.max_connections
        # (self is among the connections; this request not yet among the tasks)
        if limit is not None and (len(self.connections) > limit or len(self.tasks) >= limit):
            self.logger.warning("Exceeded concurrency limit.")
            self.app = _Overloaded(limit)
        try:
            HttpToolsProtocol.on_headers_complete(self)
        finally:
            self.app = app
        self.reading, self.since = "body", self.loop.time()

    def on_message_complete(self) -> None:
        HttpToolsProtocol.on_message_complete(self)
        self.reading = None

    def on_response_complete(self) -> None:
        HttpToolsProtocol.on_response_complete(self)
        if self.reading is not None and not self.transport.is_closing():
            # A request read while this one was answered: its time counts from now.
            self.since = self.loop.time()
            self.settle()


def _parser(callbacks: Any) -> httptools.HttpRequestParser:
    """A request parser as uvicorn makes one."""
    parser = httptools.HttpRequestParser(callbacks)
    with contextlib.suppress(AttributeError):  # (httptools < 0.6.3 has none)
        parser.set_dangerous_leniencies(lenient_data_after_close=True)
    return parser


class _Replay:
    """The parser's callbacks while a declined upgrade's body is read through our head:
    that head's are dropped, the body's go to the protocol, and so does everything of the
    requests after it in the same bytes (``done``: between two of them, the protocol can
    take a parser of its own back)."""

    def __init__(self, protocol: Protocol) -> None:
        self.protocol = protocol
        self.ours = True  # our head, then the request's body
        self.done = False

    def on_message_begin(self) -> None:
        if not self.ours:
            self.done = False
            self.protocol.on_message_begin()

    def on_url(self, url: bytes) -> None:
        if not self.ours:
            self.protocol.on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.ours:
            self.protocol.on_header(name, value)

    def on_headers_complete(self) -> None:
        if not self.ours:
            self.protocol.on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self.protocol.on_body(body)

    def on_message_complete(self) -> None:
        self.protocol.on_message_complete()
        self.ours = False
        self.done = True


class _Overloaded:
    """The application a request over the connection limit gets: a 503 problem."""

    def __init__(self, limit: int) -> None:
        self.problem = Problem(
            "overloaded",
            f"the server is at its limit of {limit} connections and requests at once: try "
            "again shortly; the server's --max-connections sets the limit",
            headers={"retry-after": "1"},
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = self.problem.encode()
        headers = [
            (b"content-type", _PROBLEM_MEDIA),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", b"1"),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})
