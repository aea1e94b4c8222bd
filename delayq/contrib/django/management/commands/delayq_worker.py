"""``python manage.py delayq_worker [--queue orders] [--processes N]``: the worker of the
handlers declared in the apps' tasks modules, on the queues of ``settings.DELAYQ``.

With ``--processes N`` this process is a supervisor (``delayq.processes``): it builds the
worker once, so a broken tasks module or setting fails here before any child starts, closes
its database connections, then runs N children, each this command with ``--processes 1``,
restarted when one dies; SIGTERM/SIGINT are forwarded and each child finishes its running
tasks within the worker's grace.
"""

from __future__ import annotations

import logging
import os
import sys
from argparse import ArgumentParser
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from delayq.contrib.django.declare import make_worker
from delayq.errors import ConfigurationError, InvalidTaskError, WorkerFailed
from delayq.processes import child
from delayq.processes.supervisor import ProcessSupervisor, process_count
from delayq.timing import parse_duration

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"


class Command(BaseCommand):
    help = (
        "Run the delayq worker of the handlers declared in each app's tasks module, on the "
        "queues of settings.DELAYQ, until SIGINT or SIGTERM."
    )
    requires_system_checks: list[str] = []  # the worker's build checks what it needs

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="NAME",
            help="A queue of settings.DELAYQ['QUEUES'] to serve (repeat for several; "
            "default: all of them).",
        )
        parser.add_argument(
            "--processes",
            default="1",
            metavar="N|auto",
            help="Worker processes under one supervisor (auto: one per core).",
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            default=None,
            help="Tasks run at once (handler threads) [default: DELAYQ['WORKER']'s, or 16].",
        )
        parser.add_argument(
            "--lease",
            default=None,
            metavar="DURATION",
            help="How long a claimed task is held, e.g. 30s [default: DELAYQ['WORKER']'s].",
        )
        parser.add_argument(
            "--log-level",
            default="info",
            choices=["debug", "info", "warning", "error"],
            help="delayq's log level, when LOGGING configures no handler for it.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            n = process_count(options["processes"])
            lease = None if options["lease"] is None else parse_duration(options["lease"])
        except (ConfigurationError, InvalidTaskError) as e:
            raise CommandError(str(e)) from None
        self._logging(options["log_level"])
        overrides: dict[str, Any] = {}
        if options["concurrency"] is not None:
            overrides["concurrency"] = options["concurrency"]
        if lease is not None:
            overrides["lease"] = lease
        try:
            worker = make_worker(options["queues"], relay=True, require=True, **overrides)
        except ImproperlyConfigured as e:
            raise CommandError(str(e)) from None
        # Whatever the tasks modules opened while they were imported: nothing of this
        # process's (a supervisor's, or a worker's main thread) uses it again.
        connections.close_all()
        if n > 1:
            code = ProcessSupervisor(self._child_command(options), n, grace_s=worker.grace_s).run()
            if code:
                raise CommandError("worker processes keep failing at start")
            return
        if child.supervised():
            child.prepare(worker)
        try:
            worker.run()
        except WorkerFailed as e:
            raise CommandError(str(e)) from None

    @staticmethod
    def _child_command(options: dict[str, Any]) -> list[str]:
        """This command again, as it was started, with ``--processes 1``."""
        program = sys.argv[0]
        if os.path.basename(program) == "__main__.py":  # python -m django
            command = [sys.executable, "-m", "django"]
        else:
            command = [sys.executable, program]
        command += ["delayq_worker", "--processes=1", f"--log-level={options['log_level']}"]
        for name in options["queues"] or ():
            command.append(f"--queue={name}")
        for option in ("concurrency", "lease", "settings", "pythonpath"):
            if options.get(option) is not None:
                command.append(f"--{option}={options[option]}")
        return command

    @staticmethod
    def _logging(level: str) -> None:
        """A handler for delayq's logs on stderr, unless LOGGING gave them one."""
        log = logging.getLogger("delayq")
        if log.handlers or logging.getLogger().handlers:
            return
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        log.addHandler(handler)
        log.setLevel(getattr(logging, level.upper()))
