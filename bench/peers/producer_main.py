"""One peer's producer in its own process: schedules N tasks, reports how long it took.

``producer_main.py --peer NAME --url URL --n N (--due-base T | --delay-base D) [--span S]``:
task i is due at ``T + S*i/N`` (absolute) or ``D + S*i/N`` seconds after it is sent. Tasks
go to the peer's ``Producer.send`` in chunks; only the sending is timed. Stops sending
after --max-seconds and reports how many went out. Writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Item, load

CHUNK = 1000
WARM = 20  # --single: calls made before the timed ones


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--peer", required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--n", type=int, required=True)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--due-base", type=float)
    g.add_argument("--delay-base", type=float)
    p.add_argument("--span", type=float, default=0.0)
    p.add_argument("--loop", action="store_true", help="delayq only: one schedule() per task")
    p.add_argument(
        "--single",
        action="store_true",
        help="one call per task, each call timed: p50/p99 latency in the report",
    )
    p.add_argument("--variant", help="with --single: the adapter's VARIANTS[name] producer")
    p.add_argument("--max-seconds", type=float, default=120)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    mod = load(args.peer)
    n = args.n

    def item(i: int) -> Item:
        offset = args.span * i / n
        if args.due_base is not None:
            return Item(f"t{i:07d}", due_at=args.due_base + offset)
        return Item(f"t{i:07d}", delay_s=args.delay_base + offset)

    items = [item(i) for i in range(n)]
    if args.single:
        single(mod, args, items)
        return
    producer = mod.LoopProducer(args.url) if args.loop else mod.Producer(args.url)
    sent = 0
    t0 = time.perf_counter()
    for start in range(0, n, CHUNK):
        chunk = items[start : start + CHUNK]
        producer.send(chunk)
        sent += len(chunk)
        if time.perf_counter() - t0 > args.max_seconds:
            break
    elapsed = time.perf_counter() - t0
    producer.close()
    with open(args.out, "w") as f:
        json.dump({"n": n, "sent": sent, "elapsed": elapsed, "complete": sent == n}, f)


def single(mod: ModuleType, args: argparse.Namespace, items: list[Item]) -> None:
    """Each task its own call (``send_one``, ``asend_one`` awaited on the producer's loop, or
    ``send([item])``), timed one by one; a first untimed call connects and loads scripts."""
    cls = mod.VARIANTS[args.variant] if args.variant else mod.Producer
    producer = cls(args.url)
    warm, items = items[:WARM], items[WARM:]
    lat: list[float] = []
    t0 = time.perf_counter()
    if hasattr(producer, "asend_one"):

        async def run(batch: list[Item], out: list[float] | None) -> None:
            for it in batch:
                t = time.perf_counter()
                await producer.asend_one(it)
                if out is not None:
                    out.append(time.perf_counter() - t)
                    if time.perf_counter() - t0 > args.max_seconds:
                        break

        producer.loop.run_until_complete(run(warm, None))
        t0 = time.perf_counter()
        producer.loop.run_until_complete(run(items, lat))
    else:
        one = getattr(producer, "send_one", None) or (lambda it: producer.send([it]))
        for it in warm:
            one(it)
        t0 = time.perf_counter()
        for it in items:
            t = time.perf_counter()
            one(it)
            lat.append(time.perf_counter() - t)
            if time.perf_counter() - t0 > args.max_seconds:
                break
    elapsed = time.perf_counter() - t0
    producer.close()
    with open(args.out, "w") as f:
        json.dump(
            {
                "n": len(items),
                "sent": len(lat),
                "elapsed": elapsed,
                "complete": len(lat) == len(items),
                "latencies_s": lat,
            },
            f,
        )


if __name__ == "__main__":
    main()
