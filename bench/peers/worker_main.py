"""One peer's worker in its own process: ``worker_main.py --peer NAME --url URL --out PATH``.

Every handler start is appended to --out as ``<id> <due> <start>``. Creates --ready once
the worker is up. Stops on SIGTERM/SIGINT (each peer's own handling), and by itself when
its stdin closes (the runner went away) or after --max-seconds; if the peer has not stopped
20 s after that, the process exits hard.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import load, open_record
from lifeline import stop_when_orphaned


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--peer", required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--ready", required=True)
    p.add_argument("--max-seconds", type=float, default=900)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    mod = load(args.peer)
    open_record(args.out)

    def request_stop() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(os.getpid(), signal.SIGTERM)
        hard = threading.Timer(20, lambda: os._exit(3))
        hard.daemon = True
        hard.start()

    stop_when_orphaned(request_stop, args.max_seconds)

    def ready() -> None:
        Path(args.ready).touch()

    mod.serve(args.url, ready)


if __name__ == "__main__":
    main()
