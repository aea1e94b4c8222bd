"""The worker runtime.

``Worker`` is imported on first use (``from delayq.worker import Worker`` still works): the
engine's modules (``delayq.worker.context``, ...) are imported by the features the worker
itself imports (cron, expiring), so this package must not import the worker eagerly.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Worker"]


def __getattr__(name: str) -> Any:
    if name == "Worker":
        from delayq.worker.worker import Worker

        return Worker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
