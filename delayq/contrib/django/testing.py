"""Tests of a Django project's tasks, in virtual time (``delayq.testing``) or eagerly.

- :class:`VirtualTime`: while it is entered, every configured queue (``queue("orders")``,
  ``schedule_on_commit``, the worker's) is made on one server with a
  :class:`~delayq.testing.VirtualClock`, under a key prefix of its own (deleted at exit);
  ``drain(until=...)`` runs the discovered handlers of the tasks due by then, in due order,
  in the calling thread.
- ``delayq_virtual``: a pytest fixture that yields one, on ``delayq_url``'s private server
  (``pytest_plugins = ["delayq.contrib.django.testing"]`` in a conftest brings both).
- :class:`DelayqTestMixin`: the same for a ``django.test.TestCase``, as ``self.delayq``.
- Eager mode: ``DELAYQ["EAGER"] = True`` makes ``schedule_on_commit`` call the handler when
  the transaction commits, whatever the delay (docs/django.md says what it leaves out).

Under a ``TestCase`` a transaction never commits: run the callbacks with
``self.captureOnCommitCallbacks(execute=True)`` (pytest-django:
``django_capture_on_commit_callbacks(execute=True)``), then drain.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import os
import secrets
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import redis
from django.db import connections

from delayq.contrib.django import conf, db
from delayq.contrib.django.declare import make_worker
from delayq.contrib.django.queues import Override, registry
from delayq.embedded import EmbeddedServer, find_binary
from delayq.keys import QueueKeys
from delayq.queue import Queue
from delayq.testing import Drained, VirtualClock, adrain, drain
from delayq.worker.worker import Worker

ASYNC_UNSAFE_ENV = "DJANGO_ALLOW_ASYNC_UNSAFE"


@contextlib.contextmanager
def inline_orm() -> Iterator[None]:
    """Let sync handlers use the ORM while ``drain`` runs them inline on its event loop.

    ``drain`` runs a sync handler in the calling thread (the test's, with the test's
    connection and transaction), from inside the event loop it runs the worker's code on;
    Django refuses ORM calls in a thread with a running loop unless
    ``DJANGO_ALLOW_ASYNC_UNSAFE`` is set. The refusal guards against coroutines sharing a
    connection; ``drain`` runs one handler at a time, so it is set while it runs."""
    previous = os.environ.get(ASYNC_UNSAFE_ENV)
    os.environ[ASYNC_UNSAFE_ENV] = "true"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ASYNC_UNSAFE_ENV, None)
        else:
            os.environ[ASYNC_UNSAFE_ENV] = previous


class VirtualTime:
    """The configured queues on a virtual clock, and their worker (see the module)."""

    def __init__(self, url: str, clock: VirtualClock | None = None) -> None:
        self.url = url
        self.clock = clock or VirtualClock()
        self.prefix = f"dqtest{secrets.token_hex(4)}"
        self._workers: dict[str, Worker] = {}
        self._connections: dict[str, Any] = {}  # the test thread's, while drain runs
        self._override = registry.overridden(Override(url, self.clock, self.prefix))

    def __enter__(self) -> VirtualTime:
        self._override.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        names = list(conf.read().queues)
        self._override.__exit__(None, None, None)
        self._workers.clear()
        with redis.Redis.from_url(self.url) as r:
            for name in names:  # the keys watched through the queue are the app's own
                watched = r.hkeys(QueueKeys(name, self.prefix).xkeys)
                if watched:
                    r.delete(*watched)
            for key in r.scan_iter(match=f"{self.prefix}:*", count=1000):
                r.delete(key)

    def queue(self, name: str | None = None) -> Queue:
        """The configured queue ``name`` (what ``delayq.contrib.django.queue`` returns)."""
        return registry.queue(name)

    def worker(self, queue: str | None = None) -> Worker:
        """The worker of one configured queue (None: the only one), with the discovered
        handlers, made once (again after a change of the setting)."""
        current = self.queue(queue)
        found = self._workers.get(current.name)
        if found is None or found.queue is not current:  # new, or the setting changed
            found = self._workers[current.name] = make_worker([current.name], wrap=self._wrap)
        return found

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """A sync handler runs on the test thread's connections (in its ``TestCase``
        transaction, seeing what the test wrote): ``drain``'s event loop would otherwise
        give it connections of its own (Django keeps them per thread, and per asyncio
        context while a loop runs). An async handler's ORM calls go through
        ``sync_to_async`` to another thread, and its connections."""
        managed = db.managed(fn)
        if inspect.iscoroutinefunction(fn):
            return managed

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            for alias, conn in self._connections.items():
                connections[alias] = conn
            return managed(*args, **kwargs)

        return run

    @contextlib.contextmanager
    def _inline(self) -> Iterator[None]:
        self._connections = {alias: connections[alias] for alias in connections}
        try:
            with inline_orm():
                yield
        finally:
            self._connections = {}

    def _targets(self, queue: str | None) -> list[str]:
        return list(conf.read().queues) if queue is None else [self.queue(queue).name]

    def _until(self, until: datetime | timedelta | None) -> datetime | None:
        return self.clock.now() + until if isinstance(until, timedelta) else until

    def drain(
        self,
        until: datetime | timedelta | None = None,
        *,
        queue: str | None = None,
        raise_errors: bool = False,
    ) -> Drained:
        """``delayq.testing.drain`` of each configured queue's worker (or of ``queue``'s), up
        to ``until`` (a timedelta from the clock's now, or an aware datetime). With several
        queues each is drained in turn up to ``until``: tasks of one queue run in due order,
        not interleaved with another's."""
        target = self._until(until)
        out = Drained()
        for name in self._targets(queue):
            with self._inline():
                ran = drain(self.worker(name), until=target, raise_errors=raise_errors)
            out.ran.extend(ran.ran)
            out.infos.update(ran.infos)
        return out

    async def adrain(
        self,
        until: datetime | timedelta | None = None,
        *,
        queue: str | None = None,
        raise_errors: bool = False,
    ) -> Drained:
        """The same in an ``async def`` test."""
        target = self._until(until)
        out = Drained()
        for name in self._targets(queue):
            with self._inline():
                ran = await adrain(self.worker(name), until=target, raise_errors=raise_errors)
            out.ran.extend(ran.ran)
            out.infos.update(ran.infos)
        return out


_server: list[EmbeddedServer] = []


def private_server_url() -> str:
    """A private server for this process's tests, started on first use, stopped at exit."""
    if not _server:
        server = EmbeddedServer(find_binary(), appendonly=False).start()
        atexit.register(server.stop)
        _server.append(server)
    return _server[0].url


class DelayqTestMixin:
    """For a ``django.test.TestCase`` (or ``TransactionTestCase``): ``self.delayq`` is a
    :class:`VirtualTime` for each test, on ``delayq_url`` (None: a private server started
    once per process)."""

    delayq_url: str | None = None
    delayq: VirtualTime

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        self.delayq = VirtualTime(self.delayq_url or private_server_url()).__enter__()
        self.addCleanup(self.delayq.__exit__, None, None, None)  # type: ignore[attr-defined]


try:
    import pytest

    from delayq.testing.plugin import delayq_url  # noqa: F401  (the fixture, for pytest_plugins)

    @pytest.fixture
    def delayq_virtual(delayq_url: str) -> Iterator[VirtualTime]:  # noqa: F811
        """The configured queues on a virtual clock for this test, and their workers."""
        with VirtualTime(delayq_url) as virtual:
            yield virtual

except ImportError:  # pragma: no cover - the mixin needs no pytest
    pass


__all__ = [
    "DelayqTestMixin",
    "VirtualTime",
    "delayq_virtual",
    "private_server_url",
]
