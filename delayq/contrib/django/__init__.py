"""Django integration: ``pip install 'delayq[django]'``, then in settings.py::

    INSTALLED_APPS = [..., "delayq.contrib.django"]
    DELAYQ = {"URL": env("REDIS_URL"), "QUEUES": {"orders": {"shards": 1}}}

- :func:`queue` / :func:`aqueue`: the configured ``Queue`` / ``AsyncQueue``, made once per
  process (per event loop for ``aqueue``) and closed at exit.
- :func:`schedule_on_commit`: schedule when the transaction commits, nothing on rollback.
- ``@handler``, ``@cron``, ``@every``, ``@on_expire`` in each app's ``tasks.py`` (or the
  module ``DELAYQ["TASKS_MODULE"]`` names), run by ``python manage.py delayq_worker``, with
  Django's database connections closed or checked around each run.
- ``delayq.contrib.django.testing``: a pytest fixture and a ``TestCase`` mixin that run the
  tasks a test scheduled in virtual time, and an eager mode (``DELAYQ["EAGER"]``).

See docs/django.md.
"""

from __future__ import annotations

from delayq.extras import require

require("django", "delayq.contrib.django")

from delayq.contrib.django.commit import schedule_on_commit  # noqa: E402
from delayq.contrib.django.declare import (  # noqa: E402
    cron,
    discover,
    every,
    handler,
    make_worker,
    on_expire,
)
from delayq.contrib.django.queues import aqueue, queue  # noqa: E402

__all__ = [
    "aqueue",
    "cron",
    "discover",
    "every",
    "handler",
    "make_worker",
    "on_expire",
    "queue",
    "schedule_on_commit",
]
