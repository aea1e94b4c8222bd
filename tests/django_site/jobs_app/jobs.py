"""Found only with DELAYQ["TASKS_MODULE"] = "jobs" (a Celery shop keeps tasks.py for Celery)."""

from __future__ import annotations

import delayq.contrib.django as dq
from delayq import Task


@dq.handler("job.run", queue="default")
def run_job(task: Task) -> None:
    pass
