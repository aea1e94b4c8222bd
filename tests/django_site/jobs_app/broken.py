"""A declaration the worker refuses: found with TASKS_MODULE = "broken" (the check test)."""

from __future__ import annotations

import delayq.contrib.django as dq
from delayq import Task


@dq.cron("0 25 * * *", name="bad-hour", queue="default")
def bad_hour(task: Task) -> None:
    pass
