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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Item, load

CHUNK = 1000


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


if __name__ == "__main__":
    main()
