"""The worker runtime."""

from delayq.worker.worker import Worker

__all__ = ["Worker"]
