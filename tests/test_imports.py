"""What a producer loads: ``import delayq``, a Queue and its schedule() need no feature's
worker part (cron's, which loads croniter). Checked in a fresh interpreter, on a real
server: ``sys.modules`` after the calls."""

from __future__ import annotations

import subprocess
import sys

from delayq.embedded import EmbeddedServer

PRODUCER = """
import asyncio, sys
import delayq

url, name = sys.argv[1], sys.argv[2]
queue = delayq.Queue(name, url=url)
queue.schedule("k", {"n": 1}, delay=60)
queue.schedule("k", {"n": 2}, task_id="given", delay=60)
queue.schedules()

async def main():
    aqueue = delayq.AsyncQueue(name, url=url)
    await aqueue.schedule("k", {"n": 3}, delay=60)
    await aqueue.close()

asyncio.run(main())
worker = delayq.Worker(queue)
worker.handler("k")(lambda task: None)
print("before", "croniter" in sys.modules)

@worker.cron("0 2 * * *", name="nightly")
def nightly(task):
    pass

print("after", "croniter" in sys.modules)
"""


def test_a_producer_does_not_load_croniter(server: EmbeddedServer, qname: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PRODUCER, server.url, qname],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    # Declaring a schedule loads it: the check can see croniter when it is there.
    assert out == ["before", "False", "after", "True"]
