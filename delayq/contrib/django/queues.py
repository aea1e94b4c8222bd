"""The configured queues of this process: ``queue("orders")`` and ``aqueue("orders")``.

Each is made once per process from ``settings.DELAYQ`` (on first use, so a web process
that never schedules never connects), shared by every thread, and closed at exit. A
change of the setting (``override_settings``, pytest-django's ``settings`` fixture) closes
them, and the next call makes them from the new setting. An ``AsyncQueue`` belongs to the
event loop it was first used on, so ``aqueue`` keeps one per loop, and closes it when that
loop shuts down: an async generator started on the loop, which ``asyncio.run`` (and so
asgiref's ``async_to_sync``, which runs each async view of a WSGI server on a new loop)
closes before closing the loop, closes the loop's queues and forgets them. Without it, each
request of a WSGI server would leave a queue and its Redis connection behind.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.core.signals import setting_changed

from delayq.contrib.django import conf
from delayq.errors import DelayqError
from delayq.queue import AsyncQueue, Queue


@dataclass(frozen=True)
class Override:
    """What ``delayq.contrib.django.testing`` puts in place of the setting's servers: every
    queue made meanwhile reads this clock, on this server, under this key prefix."""

    url: str
    clock: Any
    prefix: str


@dataclass
class LoopQueues:
    """The queues of one event loop, and what closes them when it shuts down."""

    queues: dict[str, AsyncQueue] = field(default_factory=dict)
    # the loop keeps only a weak reference to an async generator, and to a task
    held: list[Any] = field(default_factory=list)


class Queues:
    """The process's queues, made from the setting on first use."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sync: dict[str, Queue] = {}
        # loop -> its queues, closed and dropped when the loop shuts down
        self.by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopQueues] = (
            weakref.WeakKeyDictionary()
        )
        self.override: Override | None = None
        self.config: conf.Config | None = None  # the setting, read once until it changes

    def options(self, name: str | None) -> tuple[str, dict[str, Any]]:
        """The configured queue's name and its ``Queue(...)`` arguments."""
        if self.config is None:
            self.config = conf.read()
        config = self.config.queue(name)
        kwargs: dict[str, Any] = {"url": config.url, **config.options}
        if self.override is not None:
            kwargs.update(
                url=self.override.url, clock=self.override.clock, prefix=self.override.prefix
            )
        return config.name, kwargs

    def queue(self, name: str | None = None) -> Queue:
        with self.lock:
            config_name, kwargs = self.options(name)
            found = self.sync.get(config_name)
            if found is None:
                found = self.sync[config_name] = made(Queue, config_name, kwargs)
            return found

    def aqueue(self, name: str | None = None) -> AsyncQueue:
        loop = asyncio.get_running_loop()
        with self.lock:
            config_name, kwargs = self.options(name)
            of_loop = self.by_loop.get(loop)
            if of_loop is None:
                of_loop = self.by_loop[loop] = LoopQueues()
                closer = self.closed_with_loop(loop, of_loop)
                of_loop.held += [closer, loop.create_task(_start(closer))]
            found = of_loop.queues.get(config_name)
            if found is None:
                found = of_loop.queues[config_name] = made(AsyncQueue, config_name, kwargs)
            return found

    async def closed_with_loop(
        self, loop: asyncio.AbstractEventLoop, of_loop: LoopQueues
    ) -> AsyncIterator[None]:
        """Waits at its ``yield`` until the loop's ``shutdown_asyncgens`` closes it, then
        closes and forgets the loop's queues."""
        try:
            yield
        finally:
            with self.lock:
                if self.by_loop.get(loop) is of_loop:
                    del self.by_loop[loop]
                queues = list(of_loop.queues.values())
                of_loop.queues.clear()
            for q in queues:
                with contextlib.suppress(Exception):
                    await q.close()

    def close(self) -> None:
        """Close every sync queue now; the async ones are dropped (their loop closes their
        connections; closing them needs that loop)."""
        with self.lock:
            queues, self.sync = list(self.sync.values()), {}
            self.by_loop = weakref.WeakKeyDictionary()
            self.config = None
        for q in queues:
            with contextlib.suppress(Exception):
                q.close()

    @contextlib.contextmanager
    def overridden(self, override: Override) -> Iterator[None]:
        self.close()
        self.override = override
        try:
            yield
        finally:
            self.close()
            self.override = None


async def _start(closer: AsyncIterator[None]) -> None:
    """Run ``closer`` to its ``yield``, on the loop: the loop then finalizes it."""
    await anext(closer)


def made(cls: type[Any], name: str, kwargs: dict[str, Any]) -> Any:
    try:
        return cls(name, **kwargs)
    except DelayqError as e:  # a bad option of the setting's: say which
        raise conf.refused(f"DELAYQ['QUEUES'][{name!r}]", kwargs, e) from None


registry = Queues()
atexit.register(registry.close)


def _setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == conf.SETTING:
        registry.close()


setting_changed.connect(_setting_changed, dispatch_uid="delayq.contrib.django.queues")


def queue(name: str | None = None) -> Queue:
    """The configured ``Queue`` called ``name`` (None: the only one configured, or
    ``"default"``), made once per process and closed at exit.

    Raises:
        ImproperlyConfigured: no such queue in ``settings.DELAYQ["QUEUES"]``, or one of its
            options is refused (the message names it).
    """
    return registry.queue(name)


def aqueue(name: str | None = None) -> AsyncQueue:
    """The configured ``AsyncQueue`` called ``name``, for ``async def`` views: one per event
    loop (call it on the loop that uses it), closed when that loop shuts down (under WSGI,
    at the end of each async view's request)."""
    return registry.aqueue(name)
