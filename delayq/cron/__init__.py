"""Periodic tasks: schedules and their timing (``schedules.py``), the script calls
(``ops.py``), the worker's part (``worker.py``) and ``delayq cron`` (``cli.py``)."""
