"""Expiring keys with a guaranteed callback, their pure parts: the facade
(``queue.expiring``) and the script calls (``ops.py``). The worker's part, with the
cluster's bells, is in ``delayq/worker/features/``; docs/expiring.md tells the whole story."""

from delayq.expiring.facade import AsyncExpiring, Expired, Expiring

__all__ = ["AsyncExpiring", "Expired", "Expiring"]
