"""A worker app for the logs' tests (tests/test_task_logs.py): handlers that log on their
own logger (async and sync), one that fails, one that outlasts the grace period. DQ_QUEUE
names the queue; its URL comes from ``--url``."""

from __future__ import annotations

import asyncio
import logging
import os
import threading

from delayq import Queue, Task, Worker

queue = Queue(os.environ.get("DQ_QUEUE", "logging"))
worker = Worker(queue, grace=0.5)
mine = logging.getLogger("myapp")
release = threading.Event()  # never set: the slow handler runs until it is cancelled


@worker.handler("hello")
async def hello(task: Task) -> None:
    mine.warning("async handler says hello")


@worker.handler("hello.sync")
def hello_sync(task: Task) -> None:
    mine.warning("sync handler says hello")


@worker.handler("charge", max_attempts=1)
def charge_card(task: Task) -> None:
    raise ConnectionError("card service down")


@worker.handler("slow")
async def slow(task: Task) -> None:
    await asyncio.sleep(3600)
