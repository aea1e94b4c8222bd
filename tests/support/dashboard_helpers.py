"""The dashboard served by uvicorn on a free loopback port in a thread, for tests."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import uvicorn

from delayq.admin.inspect import Admin
from delayq.dashboard import base_url, bind, create_app

TOKEN = "test-token-0123456789"


class DashboardThread:
    """``with DashboardThread(url, [queue]) as base:`` serves until the block ends."""

    def __init__(
        self, url: str, queues: Sequence[str], *, token: str = TOKEN, read_only: bool = False
    ) -> None:
        self.admin = Admin(url, queues=queues)
        self.app = create_app(self.admin, token=token, read_only=read_only)
        self.sock = bind("127.0.0.1", 0)
        self.base = base_url(self.sock)
        config = uvicorn.Config(
            self.app, log_level="warning", access_log=False, lifespan="off", ws="none"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the dashboard did not start")
            time.sleep(0.01)
        return self.base

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        assert not self.thread.is_alive(), "the dashboard did not stop"
        self.sock.close()
        self.admin.close()
