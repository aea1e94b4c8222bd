"""``delayq api``'s HTTP/1.1 layer as clients meet it (``delayq/web/protocol.py``), against
real ``delayq api`` processes over raw sockets: an upgrade it does not take (``Upgrade:
h2c``, which the JDK's default HttpClient and ``curl --http2`` offer), the JDK client
itself, slow clients and the connection limit, HEAD on the probes, the URL said once the
server listens, and the token as it is given at start-up.

The timings are generous (a loaded 2-core machine): a deadline of 2 s is checked to cut a
slow client off after 1.5 s and before 10 s, and other clients to be answered meanwhile
within 5 s each.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from delayq import Queue
from delayq.embedded import EmbeddedServer
from delayq.errors import ConfigurationError
from delayq.web.serve import Limits

from .conftest import FLAVOURS, ROOT

TOKEN = "s3cret-token-for-protocol-tests"
JAVA_CLIENT = ROOT / "tests" / "support" / "java" / "Client.java"


class ApiProcess:
    """``delayq api --port 0`` with ``args``; ``base`` is the URL it says, once it says it."""

    def __init__(self, redis_url: str, *args: str, token: str = TOKEN) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.err: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "delayq", "api", "--port", "0", "--token", token, *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "DELAYQ_REDIS_URL": redis_url},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.base = self._url()
        self.port = int(self.base.rsplit(":", 1)[1])

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line)
            self.lines.put(line)

    def _url(self) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                assert self.proc.poll() is None, "".join(self.err)
                continue
            if line.startswith("delayq HTTP API on "):
                return line.split()[4]
        raise AssertionError("delayq api did not say its URL:\n" + "".join(self.err))

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.reader.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    """One server for the module: what is tested here is the HTTP layer, not Redis's."""
    srv = EmbeddedServer(FLAVOURS[0][1], appendonly=False).start()
    yield srv
    srv.stop()


@pytest.fixture
def api_process(server: EmbeddedServer) -> Iterator[Any]:
    started: list[ApiProcess] = []

    def start(*args: str, token: str = TOKEN) -> ApiProcess:
        api = ApiProcess(server.url, *args, token=token)
        started.append(api)
        return api

    yield start
    for api in started:
        api.stop()


def request(method: str, path: str, body: bytes = b"", *, headers: str = "") -> bytes:
    """A raw HTTP/1.1 request with the token (and a JSON body's Content-Length)."""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + headers + "\r\n").encode() + body


H2C = "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAEAAEAAAAIAAAAB\r\n"


_LEFT: weakref.WeakKeyDictionary[socket.socket, bytes] = weakref.WeakKeyDictionary()


def read_response(sock: socket.socket, *, head: bool = False) -> tuple[int, dict[str, str], bytes]:
    """The next response on ``sock``: status, headers, body (by its Content-Length; none for
    an answer to HEAD). Bytes past it are kept for the next call (pipelined answers): a
    stray body would be read as the next status line, and fail."""
    data = _LEFT.pop(sock, b"")
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed mid-response: {data!r}"
        data += chunk
    top, _, rest = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 "), lines[0]
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = 0 if head else int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        rest += chunk
    if rest[length:]:
        _LEFT[sock] = rest[length:]
    return status, headers, rest[:length]


# -- the URL is said once the server listens -----------------------------------------------


def test_the_url_is_said_only_once_the_api_listens(api_process: Any) -> None:
    """Issue 31 item 10: with --port 0 a client that reads the URL connects at once."""
    api = api_process()
    with api.connect() as sock:  # no retry: refused before the fix
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, body = read_response(sock)
    assert status == 200 and json.loads(body) == {"status": "ok"}


# -- an upgrade not taken ----------------------------------------------------------------------


def test_an_h2c_upgrade_is_served_as_http_1_1_body_included(
    api_process: Any, server: EmbeddedServer, qname: str
) -> None:
    """Issue 31 item 1: the body of a request offering h2c reached the API empty (422 "the
    body is empty"), and its bytes were then read as the next request."""
    api = api_process()
    path = f"/v1/queues/{qname}/tasks"

    def body(i: int) -> bytes:
        return json.dumps({"kind": "k", "id": f"h2c-{i}", "delay": 60}).encode()

    with api.connect() as sock:
        sock.sendall(request("POST", path, body(1), headers=H2C))  # head and body at once
        status, _, out = read_response(sock)
        assert status == 201, out
        assert json.loads(out)["id"] == "h2c-1"

        whole = request("POST", path, body(2), headers=H2C)  # the body sent after the head
        cut = whole.index(b"\r\n\r\n") + 4
        sock.sendall(whole[:cut])
        time.sleep(0.2)
        sock.sendall(whole[cut:])
        status, _, out = read_response(sock)
        assert status == 201, out

        chunked = request(
            "POST",
            path,
            headers=H2C + "Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n",
        )
        data = body(3)
        sock.sendall(chunked + b"%x\r\n%s\r\n" % (10, data[:10]))
        time.sleep(0.2)
        sock.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data) - 10, data[10:]))
        status, _, out = read_response(sock)
        assert status == 201, out

        # A GET offering h2c, and a request after it in the same packet.
        sock.sendall(
            request("GET", f"{path}/h2c-1", headers=H2C) + request("DELETE", f"{path}/h2c-2")
        )
        status, _, out = read_response(sock)
        assert status == 200 and json.loads(out)["state"] == "scheduled"
        status, _, _ = read_response(sock)
        assert status == 204

        # The requests after an h2c request's body, in its packet, the second split in two.
        after = request("GET", f"{path}/h2c-3") + request("POST", path, body(5), headers=H2C)
        sock.sendall(request("POST", path, body(6), headers=H2C) + after[:-20])
        time.sleep(0.2)
        sock.sendall(after[-20:])
        assert [read_response(sock)[0] for _ in range(3)] == [201, 200, 201]

        sock.sendall(request("POST", path, body(4)))  # and the connection goes on
        assert read_response(sock)[0] == 201
    with Queue(qname, url=server.url) as q:
        states = [getattr(q.get(f"h2c-{i}"), "state", None) for i in range(1, 7)]
        assert states == ["scheduled", "cancelled"] + ["scheduled"] * 4  # (h2c-2: DELETE)


@pytest.mark.skipif(
    shutil.which("java") is None, reason="no java on PATH (apt install openjdk-17-jdk-headless)"
)
def test_the_jdk_default_http_client_schedules_reschedules_and_looks_up(
    api_process: Any, server: EmbeddedServer, qname: str
) -> None:
    """``HttpClient.newHttpClient()``, HTTP/2 preferred: it offers h2c on every request."""
    api = api_process()
    proc = subprocess.run(
        ["java", str(JAVA_CLIENT), api.base, TOKEN, qname],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    statuses = [line.split(" ", 2)[:2] for line in lines]
    assert statuses == [
        ["201", "HTTP_1_1"],
        ["201", "HTTP_1_1"],
        ["200", "HTTP_1_1"],
        ["200", "HTTP_1_1"],
        ["200", "HTTP_1_1"],
    ], proc.stdout
    with Queue(qname, url=server.url) as q:
        info = q.get("order-close:42")
        assert info is not None and info.payload == {"order_id": 42}
        assert q.get("order-close:43") is not None
    due = json.loads(lines[3].split(" ", 2)[2])["due_at"]  # "15m", then PATCH "1h"
    left = datetime.fromisoformat(due).timestamp() - time.time()
    assert 3000 < left <= 3600, due


# -- HEAD --------------------------------------------------------------------------------------


def test_the_probes_answer_head_with_the_get_headers_and_no_body(api_process: Any) -> None:
    """Finding 12 of issue 28: HEAD /healthz answered 405."""
    api = api_process()
    with api.connect() as sock:
        for path in ("/healthz", "/readyz"):
            sock.sendall(request("GET", path))
            _, got, body = read_response(sock)
            sock.sendall(request("HEAD", path))
            status, headers, nothing = read_response(sock, head=True)
            assert status == 200 and nothing == b""
            assert headers["content-length"] == got["content-length"] == str(len(body))
        sock.sendall(request("GET", "/healthz"))  # no stray body came before this answer
        assert read_response(sock)[0] == 200


# -- slow clients and the connection limit -----------------------------------------------------


def trickle(sock: socket.socket, data: bytes, every: float = 1.0) -> tuple[float, bytes]:
    """Send ``data`` a byte at a time, ``every`` seconds apart, until the server answers or
    closes; (seconds it took, what the server sent)."""
    t0 = time.monotonic()
    sock.settimeout(every)
    got = b""
    try:
        for i in range(len(data)):
            sock.sendall(data[i : i + 1])
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            got += chunk
            if not chunk or b"\r\n\r\n" in got:
                break
        sock.settimeout(10)
        while chunk := sock.recv(65536):
            got += chunk
    except (BrokenPipeError, ConnectionResetError):
        pass
    return time.monotonic() - t0, got


def test_a_slow_client_is_cut_off_while_others_are_served(api_process: Any, qname: str) -> None:
    """A client sending a byte a second, in the head or the body of a request, or in the
    next request of a kept-alive connection (uvicorn's keep-alive timer restarts on every
    byte), is answered 408 and closed after the timeout; others are served meanwhile."""
    api = api_process("--header-timeout", "2", "--body-timeout", "2")
    path = f"/v1/queues/{qname}/tasks"
    body = json.dumps({"kind": "k", "delay": 60}).encode()
    whole = request("POST", path, body)
    cut = whole.index(b"\r\n\r\n") + 4
    results: dict[str, tuple[float, bytes]] = {}

    def head() -> None:
        with api.connect() as sock:
            results["head"] = trickle(sock, whole)

    def body_slow() -> None:
        with api.connect() as sock:
            sock.sendall(whole[:cut])
            results["body"] = trickle(sock, whole[cut:])

    def kept_alive() -> None:
        with api.connect() as sock:
            sock.sendall(request("GET", "/healthz"))
            assert read_response(sock)[0] == 200
            results["kept"] = trickle(sock, whole)

    def silent() -> None:
        with api.connect() as sock:
            t0 = time.monotonic()
            sock.settimeout(15)
            got = b""
            while chunk := sock.recv(65536):
                got += chunk
            results["silent"] = (time.monotonic() - t0, got)

    threads = [threading.Thread(target=f) for f in (head, body_slow, kept_alive, silent)]
    for t in threads:
        t.start()
    served = 0
    with httpx.Client(
        base_url=api.base, timeout=10, headers={"authorization": f"Bearer {TOKEN}"}
    ) as c:
        while any(t.is_alive() for t in threads):
            t0 = time.monotonic()
            assert c.post(path, json={"kind": "k", "delay": 60}).status_code == 201
            assert c.get("/healthz").status_code == 200
            assert time.monotonic() - t0 < 5
            served += 1
            time.sleep(0.1)
    for t in threads:
        t.join(30)
    assert served >= 5
    for name, flag in (
        ("head", "--header-timeout"),
        ("body", "--body-timeout"),
        ("kept", "--header-timeout"),
        ("silent", "--header-timeout"),
    ):
        took, got = results[name]
        assert 1.5 < took < 10, (name, took, got)
        top, _, doc = got.partition(b"\r\n\r\n")
        assert top.startswith(b"HTTP/1.1 408 "), (name, got)
        assert b"content-type: application/problem+json" in top and b"connection: close" in top
        problem = json.loads(doc)
        assert problem["type"] == "urn:delayq:problem:request-timeout", problem
        assert flag in problem["detail"] and "2 s" in problem["detail"], problem


def test_connections_past_the_limit_get_a_503_problem(api_process: Any) -> None:
    api = api_process("--max-connections", "3", "--header-timeout", "60")
    idle = [api.connect(), api.connect(), api.connect()]  # (3 are served: the 4th refused)
    time.sleep(0.5)
    idle[2].sendall(request("GET", "/healthz"))  # (kept alive: still one of the 3)
    assert read_response(idle[2])[0] == 200
    try:
        with api.connect() as sock:
            time.sleep(0.5)  # (the server has accepted the idle two)
            sock.sendall(request("GET", "/healthz"))
            status, headers, body = read_response(sock)
        assert status == 503 and headers["retry-after"] == "1"
        doc = json.loads(body)
        assert doc["type"] == "urn:delayq:problem:overloaded"
        assert "--max-connections" in doc["detail"] and "3" in doc["detail"]
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 10
    while httpx.get(f"{api.base}/healthz", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "still refused once the idle connections closed"
        time.sleep(0.1)


def test_a_client_that_never_reads_is_cut_off_at_the_write_timeout(
    api_process: Any, qname: str
) -> None:
    api = api_process(
        "--max-connections", "3", "--header-timeout", "2", "--body-timeout", "2",
        "--write-timeout", "3",
    )  # fmt: skip
    auth = {"authorization": f"Bearer {TOKEN}"}
    task = {"kind": "k", "id": "big", "delay": 3600, "payload": {"x": "a" * 60000}}
    r = httpx.post(f"{api.base}/v1/queues/{qname}/tasks", json=task, headers=auth, timeout=10)
    assert r.status_code < 300, r.text
    get = request(
        "GET", f"/v1/queues/{qname}/tasks/big", headers=f"Authorization: Bearer {TOKEN}\r\n"
    )
    slow = []
    for _ in range(2):  # pipelining 100 large responses, never reading one
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        s.connect(("127.0.0.1", api.port))
        s.sendall(get * 100)
        slow.append(s)
    try:
        deadline = time.monotonic() + 20  # (3 s, on a loaded machine)
        while True:
            status = httpx.get(f"{api.base}/healthz", timeout=10).status_code
            if status == 200:
                break
            assert time.monotonic() < deadline, "a client that never reads still holds its slot"
            time.sleep(0.5)
        for s in slow:  # cut off: what was sent, then the end (or a reset)
            s.settimeout(10)
            with contextlib.suppress(ConnectionResetError):
                while s.recv(1 << 20):
                    pass
    finally:
        for s in slow:
            s.close()


# -- the token as given ------------------------------------------------------------------------


def test_a_token_with_spaces_around_it_is_the_token_without_them(api_process: Any) -> None:
    """Issue 28: a token with spaces around it could never match (headers drop them)."""
    api = api_process(token=f"  {TOKEN} \t")
    r = httpx.get(f"{api.base}/readyz", headers={"authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ({"max_connections": 0}, "max_connections must be a whole number from 1"),
        ({"keep_alive": 2.5}, "keep_alive must be a whole number from 1"),
        ({"header_timeout": 0}, "header_timeout must be seconds above 0"),
        ({"body_timeout": float("inf")}, "body_timeout must be seconds above 0"),
        ({"body_timeout": True}, "body_timeout must be seconds above 0"),
    ],
)
def test_limits_refuse_what_cannot_bound_anything(given: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        Limits(**given)


def test_delayq_api_refuses_a_zero_timeout() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "delayq", "api", "--token", TOKEN, "--header-timeout", "0"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--header-timeout" in proc.stderr


# -- the API mounted in an application, served by uvicorn -----------------------------------


@contextlib.contextmanager
def uvicorn_serving(redis_url: str, *args: str) -> Iterator[int]:
    """``uvicorn tests.support.apps.mounted_api:app`` with ``args``; yields its port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "tests.support.apps.mounted_api:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            *args,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "DELAYQ_REDIS_URL": redis_url},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "uvicorn did not listen within 60 s"
                time.sleep(0.1)
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


def mounted_h2c_post(port: int, qname: str, tid: str) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"kind": "k", "id": tid, "delay": "15m"}).encode()
    raw = request("POST", f"/delayq/v1/queues/{qname}/tasks", body, headers=H2C)
    raw = raw.replace(TOKEN.encode(), b"mounted-api-token-1234")  # (mounted_api.py's)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        return read_response(sock)


def test_a_mounted_api_under_plain_uvicorn_names_the_lost_h2c_body(
    server: EmbeddedServer, qname: str
) -> None:
    """Review of issue 31, item 1a: uvicorn's own protocol drops the body of a request
    offering h2c; the mounted API said "the body is empty" (422), now a 400 naming why and
    the fix."""
    with uvicorn_serving(server.url, "--http", "httptools") as port:
        status, headers, out = mounted_h2c_post(port, qname, "plain-1")
    assert status == 400, out
    assert headers["content-type"] == "application/problem+json"
    detail = json.loads(out)["detail"]
    assert "Upgrade: h2c" in detail and "delayq.web.protocol:Protocol" in detail


def test_a_mounted_api_served_with_delayq_s_protocol_takes_an_h2c_offer(
    server: EmbeddedServer, qname: str
) -> None:
    """Review of issue 31, item 1b: docs/http.md's way to serve a mounted API, ``uvicorn
    --http delayq.web.protocol:Protocol``, schedules the JDK client's first POST."""
    with uvicorn_serving(server.url, "--http", "delayq.web.protocol:Protocol") as port:
        status, _, out = mounted_h2c_post(port, qname, "mounted-1")
    assert status == 201, out
    with Queue(qname, url=server.url) as q:
        assert q.get("mounted-1") is not None


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"GET /healthz HTTP/1.1 extra\r\nHost: x\r\n\r\n", "not valid HTTP/1.1"),
        (b"GET /healthz HTTP/1.1\r\nHost x\r\n\r\n", "not valid HTTP/1.1"),
        (
            b"POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "not valid HTTP/1.1",
        ),
        (
            b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "not valid HTTP/1.1",
        ),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "speaks HTTP/1.1"),
    ],
    ids=["request-line", "header-colon", "chunking", "length-and-chunked", "h2-preface"],
)
def test_a_malformed_request_gets_a_400_problem(api_process: Any, raw: bytes, words: str) -> None:
    """Review of issue 31, item 5: uvicorn answered these with a text/plain 400."""
    api = api_process()
    with api.connect() as sock:
        sock.sendall(raw)
        status, headers, out = read_response(sock)
    assert status == 400, out
    assert headers["content-type"] == "application/problem+json"
    problem = json.loads(out)
    assert problem["type"] == "urn:delayq:problem:bad-request" and words in problem["detail"]
