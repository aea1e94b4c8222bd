"""Expiring keys with a guaranteed callback: the facade (``queue.expiring``), the script
calls (``ops.py``), the worker's part (``worker.py``) and the cluster's bells (``bells.py``);
docs/expiring.md tells the whole story."""

from delayq.expiring.facade import AsyncExpiring, Expired, Expiring

__all__ = ["AsyncExpiring", "Expired", "Expiring"]
