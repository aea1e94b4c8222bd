"""Periodic tasks, their pure parts: schedules and their timing (``schedules.py``), the
script calls (``ops.py``) and what the producer reads of them (``facade.py``:
``queue.schedules()``, without croniter). The worker's part is
``delayq/worker/features/cron.py``, ``delayq cron`` is ``delayq/cli/cron.py``."""
