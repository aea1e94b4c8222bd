"""The example's fixtures: a private server for delayq, PostgreSQL for the orders, and
``manage.py delayq_worker`` as a real process.

Every test runs against a delayq server of its own session (``delayq_url``: started on a
free loopback port, never a Redis you run) and a test database that pytest-django creates on
the PostgreSQL of ``ORDERS_DB_HOST``/``ORDERS_DB_PORT`` (127.0.0.1:5432) and drops at the
end. Without a PostgreSQL there, every test is skipped, saying so.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
import redis
from django.db import connection

pytest_plugins = ["delayq.contrib.django.testing"]  # delayq_url, delayq_virtual

PROJECT = Path(__file__).resolve().parent.parent
PG = (os.environ.get("ORDERS_DB_HOST", "127.0.0.1"), int(os.environ.get("ORDERS_DB_PORT", "5432")))
T = TypeVar("T")


def postgres_up() -> bool:
    try:
        with socket.create_connection(PG, timeout=0.5):
            return True
    except OSError:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not postgres_up():
        skip = pytest.mark.skip(
            reason=f"no PostgreSQL on {PG[0]}:{PG[1]} (the example's database): start one, "
            "or point ORDERS_DB_HOST/ORDERS_DB_PORT at one"
        )
        for item in items:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def delayq_server(delayq_url: str, settings: Any) -> Iterator[str]:
    """Each test's queues on the session's private server, emptied first."""
    with redis.Redis.from_url(delayq_url) as r:
        r.flushdb()
    settings.DELAYQ = {**settings.DELAYQ, "URL": delayq_url}
    settings.ORDERS_CLOSE_AFTER = 1.0  # real-time tests; the virtual ones set 15 minutes
    yield delayq_url


def wait_for(check: Callable[[], T], timeout: float = 20.0, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s (last: {value!r})")
        time.sleep(0.05)
    return value


def raw_connection() -> psycopg.Connection[Any]:
    """A connection of the test's own to the test database, beside Django's."""
    s = connection.settings_dict
    return psycopg.connect(
        dbname=s["NAME"], host=s["HOST"], port=s["PORT"], user=s["USER"], autocommit=True
    )


@dataclass
class Workers:
    """``python manage.py delayq_worker`` processes on the test's database and server."""

    env: dict[str, str]
    log: Path
    app_name: str  # their PostgreSQL connections' application_name (PGAPPNAME)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "delayq_worker", "--lease", "2", *args],
                cwd=PROJECT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL, to the whole process group (a supervisor's children too)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop(self, proc: subprocess.Popen[bytes]) -> int:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            self.kill(proc)
            raise AssertionError(f"the worker did not stop on SIGTERM:\n{self.output()}") from None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def backends(self) -> list[int]:
        """The pids of the workers' PostgreSQL connections."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s ORDER BY pid",
                [self.app_name],
            )
            return [pid for (pid,) in cursor.fetchall()]


@pytest.fixture
def workers(transactional_db: None, delayq_url: str, tmp_path: Path) -> Iterator[Workers]:
    """Workers on the test database: the test's writes are committed (transactional_db),
    so another process sees them."""
    app_name = f"orders-worker-{secrets.token_hex(4)}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(
        ORDERS_DATABASE=connection.settings_dict["NAME"],
        DELAYQ_REDIS_URL=delayq_url,
        PGAPPNAME=app_name,
        ORDERS_CLOSE_AFTER="1",
    )
    w = Workers(env, tmp_path / "workers.log", app_name)
    yield w
    for proc in w.procs:
        if proc.poll() is None:
            w.kill(proc)
    # Their connections end with them; the test database is flushed (and at the end dropped)
    # only once they are gone.
    wait_for(lambda: not w.backends(), timeout=10, what="the workers' connections closed")
