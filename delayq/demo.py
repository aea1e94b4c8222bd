"""``delayq demo``: many tasks falling due over a few seconds, each run once, on time."""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from contextlib import ExitStack

from rich.console import Console
from rich.table import Table

from .core import TaskSpec
from .queue import Queue
from .task import Task
from .worker import Worker

console = Console()


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[i]


def run_demo(*, url: str | None, tasks: int, spread: float, concurrency: int) -> int:
    with ExitStack() as stack:
        if url is None:
            from .embedded import EmbeddedServer

            server = stack.enter_context(EmbeddedServer())
            url = server.url
            console.print(f"[bold]embedded server[/] {server.binary} on {url}")
        queue = Queue(f"demo-{secrets.token_hex(4)}", url=url)
        stack.callback(queue.close)
        worker = Worker(queue, concurrency=concurrency, lease=10)
        runs: Counter[str] = Counter()
        lateness: list[float] = []

        @worker.handler("demo.tick")
        async def tick(task: Task) -> None:
            lateness.append(time.time() - task.due_at.timestamp())
            runs[task.id] += 1

        start = 1.0
        specs = [
            TaskSpec("demo.tick", {"n": i}, delay=start + spread * i / max(tasks, 1))
            for i in range(tasks)
        ]
        t0 = time.perf_counter()
        ids = queue.schedule_many(specs)
        console.print(
            f"scheduled {len(ids)} tasks in {time.perf_counter() - t0:.3f} s, "
            f"due over the next {spread:g} s"
        )

        thread = threading.Thread(target=lambda: __import__("asyncio").run(worker.serve()))
        thread.start()
        deadline = time.time() + start + spread + 30
        while time.time() < deadline:
            s = queue.stats()
            if s.scheduled == 0 and s.active == 0 and len(runs) >= len(ids):
                break
            console.print(
                f"  waiting {s.scheduled:6d}  running {s.active:4d}  done {s.done:6d}", end="\r"
            )
            time.sleep(0.5)
        worker.stop()
        thread.join()

        lat = sorted(x * 1000 for x in lateness)
        once = sum(1 for i in ids if runs[i] == 1)
        twice = sum(1 for i in ids if runs[i] > 1)
        missing = sum(1 for i in ids if runs[i] == 0)
        table = Table(title="delayq demo")
        table.add_column("measure")
        table.add_column("value", justify="right")
        table.add_row("tasks scheduled", str(len(ids)))
        table.add_row("ran exactly once", str(once))
        table.add_row("ran more than once", str(twice))
        table.add_row("never ran", str(missing))
        for p in (50, 90, 99):
            table.add_row(f"lateness p{p}", f"{percentile(lat, p):.2f} ms")
        table.add_row("lateness max", f"{lat[-1] if lat else float('nan'):.2f} ms")
        console.print(table)
        ok = once == len(ids)
        console.print("[bold green]OK[/]" if ok else "[bold red]FAILED[/]")
        return 0 if ok else 1
