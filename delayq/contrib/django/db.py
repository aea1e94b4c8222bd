"""Django's database connections around each handler run, as Django does around a request.

Django calls ``close_old_connections`` when a request starts and when it ends: a connection
past ``CONN_MAX_AGE`` (0 by default: every request's) or one left unusable by an error is
closed, and the next query opens a fresh one. A worker has no requests, so without this a
sync handler's thread would keep the connection it first opened for the life of the process,
and go on using it after the database dropped it. :func:`managed` wraps a handler so the
same happens before and after each run, in the thread that runs it: a sync handler's own
(the worker's handler thread), and for an async handler the thread ``sync_to_async`` runs
ORM calls in (its default, ``thread_sensitive=True``: one shared thread).

A connection inside an ``atomic`` block is left alone: the run is then part of someone's
transaction (a test's ``TestCase``, or ``drain`` called inside one), which closing it would
break. A persistent connection (``CONN_MAX_AGE > 0``) that the database dropped between
tasks is found dead by Django only with ``CONN_HEALTH_CHECKS = True``; the
``delayq.W001`` system check says so.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections


def close_old_connections() -> None:
    """Close this thread's connections that are past their age or unusable (Django's
    ``close_old_connections``), except those inside an ``atomic`` block."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


def managed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with :func:`close_old_connections` before and after each call, in the thread
    its ORM calls run in (sync or async, as ``fn`` is)."""
    if inspect.iscoroutinefunction(fn):
        close = sync_to_async(close_old_connections)

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            await close()
            try:
                return await fn(*args, **kwargs)
            finally:
                await close()

        return run_async

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return run
