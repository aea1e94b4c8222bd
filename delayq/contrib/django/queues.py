"""The configured queues of this process: ``queue("orders")`` and ``aqueue("orders")``.

Each is made once per process from ``settings.DELAYQ`` (on first use, so a web process
that never schedules never connects), shared by every thread, and closed at exit. A
change of the setting (``override_settings``, pytest-django's ``settings`` fixture) closes
them, and the next call makes them from the new setting. An ``AsyncQueue`` belongs to the
event loop it was first used on, so ``aqueue`` keeps one per loop.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
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


class Queues:
    """The process's queues, made from the setting on first use."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sync: dict[str, Queue] = {}
        # loop -> name -> AsyncQueue; a loop that is gone takes its queues with it.
        self.by_loop: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[str, AsyncQueue]
        ] = weakref.WeakKeyDictionary()
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
            of_loop = self.by_loop.setdefault(loop, {})
            found = of_loop.get(config_name)
            if found is None:
                found = of_loop[config_name] = made(AsyncQueue, config_name, kwargs)
            return found

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


def made(cls: type[Any], name: str, kwargs: dict[str, Any]) -> Any:
    try:
        return cls(name, **kwargs)
    except DelayqError as e:  # a bad option of the setting's: say which
        raise ImproperlyConfigured(f"settings.DELAYQ['QUEUES'][{name!r}]: {e}") from None


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
    loop (call it on the loop that uses it)."""
    return registry.aqueue(name)
