"""A submodule of the pkg_tasks package, declaring a handler."""

from __future__ import annotations

import delayq.contrib.django as dq
from delayq import Task


@dq.handler("pkg.mail", queue="emails")
def send(task: Task) -> None:
    pass
