"""The worker runtime."""

from .worker import Worker

__all__ = ["Worker"]
