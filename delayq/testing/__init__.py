"""Test your handlers in virtual time: a real server, the real scripts, the real worker.

- :class:`VirtualClock`: ``Queue(name, url=url, clock=clock)`` reads every time from it.
- :func:`drain` / :func:`adrain`: run the worker's tasks due by a virtual time, in due
  order, in the calling thread; returns :class:`Drained`.
- A pytest plugin, opt-in with ``pytest_plugins = ["delayq.testing"]`` in a conftest:
  ``delayq_url`` (a private embedded server per session), ``delayq_clock``,
  ``delayq_queue`` and ``delayq_async_queue`` (see ``plugin.py`` and docs/testing.md).
"""

import contextlib

from delayq.testing.clock import VirtualClock
from delayq.testing.drain import Drained, Ran, adrain, drain

__all__ = ["Drained", "Ran", "VirtualClock", "adrain", "drain"]

# The fixtures, for pytest_plugins = ["delayq.testing"]; a plain import needs no pytest.
with contextlib.suppress(ImportError):
    from delayq.testing.plugin import (  # noqa: F401
        delayq_async_queue,
        delayq_clock,
        delayq_queue,
        delayq_url,
    )
