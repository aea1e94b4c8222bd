"""One delayq worker in its own process, for the benchmarks (see common.WorkerProcess).

Runs a no-op handler (async or sync) for one task kind and records, for every start,
``time.time() - task.due_at.timestamp()`` (lateness) and the task id. With ``--mode expire``
it registers an async ``on_expire`` callback on ``--pattern`` instead and records, for every
call, ``time.time() - expired.deadline.timestamp()``, the key and ``expired.via``; with
``--events PATH`` each call is also appended to PATH as it happens (one unbuffered write, so
a SIGKILLed worker leaves what it saw behind); ``--log PATH`` sends delayq's warnings there
instead of stderr. Prints ``ready`` once the worker is subscribed to its wake channel. Stops
gracefully on SIGTERM/SIGINT, when stdin reaches EOF (the parent went away) or after
--max-seconds; then writes a JSON report to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import time
from collections import Counter
from typing import Any

from lifeline import stop_worker_when_orphaned

import delayq.worker.alarm
from delayq import Expired, Queue, Task, Worker


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--kind", default="bench.noop")
    p.add_argument("--mode", choices=("async", "sync", "expire"), default="async")
    p.add_argument("--pattern", default="bench:*", help="--mode expire: the on_expire pattern")
    p.add_argument("--events", help="--mode expire: append 'key<TAB>lateness<TAB>via' lines")
    p.add_argument("--log", help="write delayq's warnings here instead of stderr")
    p.add_argument("--concurrency", type=int, default=64, help="0: the Worker's default")
    p.add_argument("--lookahead", type=float, help="Worker(lookahead=...); default: its default")
    p.add_argument("--append-to", help="async mode: the handler also appends one line to this file")
    p.add_argument("--uvloop", action="store_true", help="serve on uvloop's event loop")
    p.add_argument(
        "--coarse-timers",
        action="store_true",
        help="no timerfd wake-ups: run timers fire at the event loop's millisecond",
    )
    p.add_argument(
        "--no-spin",
        action="store_true",
        help="the alarm goes off at a run's time, with no wait on the CPU ahead of it",
    )
    p.add_argument("--no-freeze-gc", action="store_true", help="Worker(freeze_gc=False)")
    p.add_argument("--lease", type=float, default=30)
    p.add_argument("--record", choices=("lateness", "count"), default="lateness")
    p.add_argument("--max-seconds", type=float, default=600)
    p.add_argument("--out", required=True)
    p.add_argument("--profile", help="write cProfile stats of the event loop thread here")
    return p.parse_args()


class Recorder:
    def __init__(self, keep_lateness: bool) -> None:
        self.keep_lateness = keep_lateness
        self.lateness: list[float] = []
        self.due: list[float] = []  # each start's due time (s), beside its lateness
        self.runs: Counter[str] = Counter()
        self.first_start: float | None = None
        self.last_start: float | None = None
        self.seen: list[tuple[str, float, str]] = []
        self.events_fd: int | None = None

    def note(self, task: Task) -> None:
        now = time.time()
        # list.append and Counter updates from handler threads are safe under the GIL
        # for what we need (a count and a list of floats).
        if self.first_start is None:
            self.first_start = now
        self.last_start = now
        if self.keep_lateness:
            due = task.due_at.timestamp()
            self.lateness.append(now - due)
            self.due.append(due)
        self.runs[task.id] += 1

    def note_expired(self, expired: Expired) -> None:
        now = time.time()
        if self.first_start is None:
            self.first_start = now
        self.last_start = now
        late = now - expired.deadline.timestamp()
        self.seen.append((expired.key, late, expired.via))
        self.runs[expired.key] += 1
        if self.events_fd is not None:
            os.write(self.events_fd, f"{expired.key}\t{late:.6f}\t{expired.via}\n".encode())

    def report(self) -> dict[str, Any]:
        if self.seen:
            return {
                "started": len(self.seen),
                "distinct": len(self.runs),
                "duplicates": sum(1 for n in self.runs.values() if n > 1),
                "first_start": self.first_start,
                "last_start": self.last_start,
                "lateness": [late for _, late, _ in self.seen],
                "seen": self.seen,  # [key, lateness s, via] per callback, in order
                "via": dict(Counter(via for _, _, via in self.seen)),
            }
        return {
            "started": sum(self.runs.values()),
            "distinct": len(self.runs),
            "duplicates": sum(1 for n in self.runs.values() if n > 1),
            "first_start": self.first_start,
            "last_start": self.last_start,
            "lateness": self.lateness if self.keep_lateness else None,
            "due": self.due if self.keep_lateness else None,
        }


def schedstat() -> tuple[float, float]:
    """(CPU time, time spent runnable but waiting for a CPU) of this thread so far, in ms:
    the second is how much a busy machine held the worker back."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            cpu, wait = f.read().split()[:2]
        return int(cpu) / 1e6, int(wait) / 1e6
    except (OSError, ValueError):
        return float("nan"), float("nan")


async def serve(worker: Worker) -> None:
    cpu0, wait0 = schedstat()
    task = asyncio.create_task(worker.serve(install_signals=True))
    # Ready once the wake-up subscription is live (the engine's waker). A worker that is not
    # ready within 10 s fails the run: printing "ready" late would time a queue already
    # drained (the engine's attributes moved once, and every run measured ~10,000 tasks/s).
    deadline = time.monotonic() + 10
    while not task.done():
        engine = worker.engine
        if engine is not None and engine.waker.subscribed.is_set():
            break
        if time.monotonic() > deadline:
            raise SystemExit("the worker's wake-up subscription was not live within 10 s")
        await asyncio.sleep(0.005)
    print("ready", flush=True)
    await task
    cpu1, wait1 = schedstat()
    CLOCK["loop_cpu_ms"], CLOCK["loop_run_delay_ms"] = cpu1 - cpu0, wait1 - wait0
    # How late the server-clock mapping sets timers: the true offset (server and worker share
    # this host's clock) less the worker's lower bound of it.
    if worker.clock.offset is not None:
        # (time.monotonic(): asyncio's loop.time(), and what the worker reads on uvloop)
        CLOCK["offset_error_ms"] = (time.time() - time.monotonic() - worker.clock.offset) * 1000
    alarm = worker.engine.runs.alarm if worker.engine else None
    CLOCK["alarm_wakes"] = alarm.wakes if alarm is not None else -1
    CLOCK["alarm_spins"] = alarm.spins if alarm is not None else -1
    CLOCK["alarm_spun_ms"] = alarm.spun * 1000 if alarm is not None else -1


CLOCK: dict[str, float] = {}


class GcPauses:
    """How long each garbage collection held the process up, by generation (gc.callbacks),
    from when the first task started (start-up's own are left out)."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.started = 0.0
        self.pauses: list[tuple[int, float]] = []  # (generation, seconds)
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        elif self.rec.first_start is not None:
            self.pauses.append((info["generation"], time.perf_counter() - self.started))

    def report(self) -> dict[str, Any]:
        worst = max((p for _, p in self.pauses), default=0.0)
        return {
            "gc_collections": [sum(1 for g, _ in self.pauses if g == n) for n in range(3)],
            "gc_max_ms": worst * 1000,
            "gc_total_ms": sum(p for _, p in self.pauses) * 1000,
        }


def register(worker: Worker, args: argparse.Namespace, rec: Recorder) -> None:
    """The handler (or the on_expire callback) for the mode asked for."""
    if args.events:
        rec.events_fd = os.open(args.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    if args.mode == "expire":

        @worker.on_expire(args.pattern)
        async def on_expire(expired: Expired) -> None:
            rec.note_expired(expired)

    elif args.mode == "async" and args.append_to:
        out = open(args.append_to, "a")  # noqa: SIM115 (closed with the process)

        @worker.handler(args.kind)
        async def append_async(task: Task) -> None:
            rec.note(task)  # (lateness is taken at the first line, as a peer's would be)
            out.write(f"{task.id} {task.due_at.timestamp()!r} {time.time()!r}\n")
            out.flush()

    elif args.mode == "async":

        @worker.handler(args.kind)
        async def noop_async(task: Task) -> None:
            rec.note(task)

    else:

        @worker.handler(args.kind)
        def noop_sync(task: Task) -> None:
            rec.note(task)


def main() -> None:
    args = parse_args()
    if args.log:
        logging.basicConfig(
            filename=args.log, level=logging.WARNING, format="%(created).3f %(message)s"
        )
    queue = Queue(args.queue, url=args.url)
    options: dict[str, Any] = {"lease": args.lease, "freeze_gc": not args.no_freeze_gc}
    if args.concurrency:
        options["concurrency"] = args.concurrency
    if args.lookahead is not None:
        options["lookahead"] = args.lookahead
    worker = Worker(queue, **options)
    rec = Recorder(keep_lateness=args.record == "lateness")
    pauses = GcPauses(rec)

    register(worker, args, rec)

    stop_worker_when_orphaned(worker, args.max_seconds)

    if args.coarse_timers:
        delayq.worker.alarm.PRECISE = False
    if args.no_spin:
        delayq.worker.alarm.SPIN_S = 0.0
    if args.uvloop:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
        asyncio.run(serve(worker))
        prof.disable()
        prof.dump_stats(args.profile)
    else:
        asyncio.run(serve(worker))
    queue.close()
    with open(args.out, "w") as f:
        json.dump({**rec.report(), **CLOCK, **pauses.report()}, f)


if __name__ == "__main__":
    main()
