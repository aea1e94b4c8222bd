"""System checks (``manage.py check``, and every command that runs them): the ``DELAYQ``
setting and every declaration of the apps' tasks modules, checked without connecting, so a
typo in a cron expression fails the deploy's ``check`` rather than the worker's start."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from delayq.contrib.django import conf, declare
from delayq.errors import ConfigurationError
from delayq.queue import Queue
from delayq.worker.worker import Worker

UNREACHABLE = "redis://127.0.0.1:9/0"  # never connected to: the check makes no call


@checks.register("delayq")
def check_setting(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E001: the setting or a declaration is refused; W001: persistent database
    connections without health checks."""
    out: list[checks.CheckMessage] = []
    try:
        config = conf.read()
        queues = []
        for name, queue in config.queues.items():
            try:
                queues.append(Queue(name, url=UNREACHABLE, **_offline(queue.options)))
            except ConfigurationError as e:
                raise conf.refused(f"DELAYQ['QUEUES'][{name!r}]", queue.options, e) from None
        try:
            worker = Worker(queues[0] if len(queues) == 1 else queues, **config.worker)
        except ConfigurationError as e:
            raise conf.refused("DELAYQ['WORKER']", config.worker, e) from None
        for declaration in declare.discover():
            if declaration.queue is not None:
                config.queue(declaration.queue)
            declare.register(worker, declaration)
    except (ImproperlyConfigured, ValueError) as e:
        out.append(checks.Error(str(e), id="delayq.E001"))
    for alias, db in settings.DATABASES.items():
        if db.get("CONN_MAX_AGE", 0) != 0 and not db.get("CONN_HEALTH_CHECKS", False):
            out.append(
                checks.Warning(
                    f"DATABASES[{alias!r}] keeps connections (CONN_MAX_AGE) without "
                    "CONN_HEALTH_CHECKS: a worker's first task after the database dropped "
                    "its connection fails and is retried",
                    hint=f"set DATABASES[{alias!r}]['CONN_HEALTH_CHECKS'] = True",
                    id="delayq.W001",
                )
            )
    return out


def _offline(options: dict[str, Any]) -> dict[str, Any]:
    """A queue's options as a check may use them: ``shards="stored"`` would read the server."""
    return {**options, "shards": 1} if options.get("shards") == "stored" else options
