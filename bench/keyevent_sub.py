"""The plain recipe's subscriber, in its own process, for bench/expiring.py.

Subscribes to ``__keyevent@<db>__:expired`` with redis-py (nothing from delayq) and, for
every expired key starting with ``--prefix``, records ``time.time() - deadline``, the
deadline being the key's last ``:``-separated field (ms since the epoch). With ``--events
PATH`` each arrival is also appended to PATH as it happens (one unbuffered write, so a
SIGKILLed subscriber leaves what it saw behind). Prints ``ready`` once subscribed. Stops on
SIGTERM/SIGINT, when stdin reaches EOF (the parent went away) or after --max-seconds; then
writes a JSON report to --out (the same shape as worker_proc.py's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import threading
import time
from collections import Counter
from types import FrameType
from typing import Any

import redis


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--db", type=int, default=0)
    p.add_argument("--events", help="append 'key<TAB>lateness' lines here")
    p.add_argument("--max-seconds", type=float, default=600)
    p.add_argument("--out", required=True)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def watch_stdin() -> None:
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    limit = threading.Timer(args.max_seconds, stop.set)
    limit.daemon = True
    limit.start()

    events_fd = None
    if args.events:
        events_fd = os.open(args.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    prefix = args.prefix.encode()
    seen: list[tuple[str, float]] = []
    runs: Counter[str] = Counter()

    r = redis.Redis.from_url(args.url, socket_timeout=30)
    pubsub = r.pubsub()
    pubsub.subscribe(f"__keyevent@{args.db}__:expired")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the subscribe confirmation: the channel is live
        msg = pubsub.get_message(timeout=0.5)
        if msg and msg["type"] == "subscribe":
            break
    print("ready", flush=True)

    while not stop.is_set():
        msg = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
        if msg is None or msg["type"] != "message":
            continue
        now = time.time()
        key: bytes = msg["data"]
        if not key.startswith(prefix):
            continue
        late = now - int(key.rsplit(b":", 1)[1]) / 1000
        name = key.decode()
        seen.append((name, late))
        runs[name] += 1
        if events_fd is not None:
            os.write(events_fd, f"{name}\t{late:.6f}\n".encode())

    with contextlib.suppress(Exception):
        pubsub.close()
        r.close()
    report: dict[str, Any] = {
        "started": len(seen),
        "distinct": len(runs),
        "duplicates": sum(1 for n in runs.values() if n > 1),
        "lateness": [late for _, late in seen],
        "seen": seen,
    }
    with open(args.out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
