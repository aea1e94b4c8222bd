"""The worker runtime.

``Worker`` is imported on first use (``from delayq.worker import Worker`` still works), so
that importing one of the engine's modules (``delayq.worker.context``, ``.registry``, ...),
as the features in ``features/`` do, does not load the whole worker first.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Worker"]


def __getattr__(name: str) -> Any:
    if name == "Worker":
        from delayq.worker.worker import Worker

        return Worker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
