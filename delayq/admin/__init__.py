"""Looking at queues and acting on them: read-only inspection (``inspect.py``), operator
actions (``operate.py``, ``reshard.py``), formatting (``present.py``) and Prometheus metrics
(``metrics.py``). The CLI and the dashboard are built on these."""

from delayq.admin.inspect import Admin, QueueOverview

__all__ = ["Admin", "QueueOverview"]
