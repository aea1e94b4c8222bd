"""The ``single`` measure in interleaved rounds, optionally pinned to one CPU and with a
second delayq beside the current one:

    python bench/peers/single_rounds.py [--rounds 3] [--server valkey,redis] [--pin CPU]
        [--before DIR] [--peers delayq,huey,...]

Each entry is ``producer_main.py --single`` (5,000 calls after 20, delays 5-15 s, no worker)
on a fresh server, as ``bench/peers/run --measures single`` runs it; every round runs every
entry once, the order rotated each round, and the table gives each entry's median over the
rounds (and every round's p50). ``--before DIR``: also run delayq from DIR (a checkout or
``git archive`` of another commit, put on the producer's ``PYTHONPATH``). ``--pin CPU``:
the server and the producer both on that CPU (``taskset``), so a call costs what its two
processes do; unpinned, a 2-core machine's round trips are ~30 µs or ~100 µs depending on
where the kernel wakes the server, which is not the code's doing (docs/benchmarks.md).
Run it with the peers' venv (``PYTHON=<venv>/bin/python``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # bench/: common.py

from common import ROOT, fresh_server  # noqa: E402

PEERS = ("arq", "rq", "dramatiq", "celery", "huey", "saq", "bullmq", "floor")
N = 5_000


def entries(args: argparse.Namespace) -> list[tuple[str, str, str | None, str]]:
    """(label, peer, variant, PYTHONPATH) of every entry."""
    out = []
    for label, path in (("before", args.before), ("", str(ROOT))):
        if path is None:
            continue
        for variant in ("sync", "async"):
            name = f"delayq {variant}" + (f", {label}" if label else "")
            out.append((name, "delayq", variant, path))
    out += [(p, p, None, str(ROOT)) for p in args.peers if p != "delayq"]
    return out


def run_one(server: str, peer: str, variant: str | None, path: str, pin: int | None) -> dict:  # type: ignore[type-arg]
    with fresh_server(server) as srv:
        if pin is not None:
            subprocess.run(
                ["taskset", "-a", "-p", "-c", str(pin), str(srv.pid)],
                check=True,
                capture_output=True,
            )
        fd, out = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        argv = ["taskset", "-c", str(pin)] if pin is not None else []
        argv += [sys.executable, str(HERE / "producer_main.py"), "--peer", peer, "--url", srv.url]
        argv += ["--n", str(N), "--delay-base", "5.0", "--span", "10.0", "--single"]
        argv += ["--max-seconds", "120", "--out", out]
        argv += ["--variant", variant] if variant else []
        env = {**os.environ, "PYTHONPATH": path}
        try:
            proc = subprocess.run(
                argv, env=env, capture_output=True, text=True, cwd=ROOT, timeout=300
            )
            if proc.returncode:
                raise RuntimeError(f"{peer} exited {proc.returncode}: {proc.stderr[-300:]}")
            with open(out) as f:
                return json.load(f)  # type: ignore[no-any-return]
        finally:
            with contextlib.suppress(OSError):
                os.unlink(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--server", default="valkey,redis")
    p.add_argument("--pin", type=int, default=None, metavar="CPU")
    p.add_argument("--before", default=None, metavar="DIR")
    p.add_argument("--peers", default=",".join(PEERS))
    args = p.parse_args()
    args.peers = [x for x in args.peers.split(",") if x]
    todo = entries(args)
    servers = args.server.split(",")
    got: dict[tuple[str, str], list[tuple[float, float]]] = {
        (s, e[0]): [] for s in servers for e in todo
    }
    for r in range(args.rounds):
        for server in servers:
            k = r % len(todo)
            for name, peer, variant, path in todo[k:] + todo[:k]:
                try:
                    rep = run_one(server, peer, variant, path, args.pin)
                except Exception as e:  # one peer failing does not end the run
                    print(f"  {server} {name}: {e}", flush=True)
                    continue
                lat = sorted(rep["latencies_s"])
                got[(server, name)].append((1e6 * lat[len(lat) // 2], rep["sent"] / rep["elapsed"]))
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"round {r + 1} of {args.rounds} done, load {load}", flush=True)
    where = (
        f"pinned: servers and producers on CPU {args.pin}" if args.pin is not None else "unpinned"
    )
    for server in servers:
        print(f"\n== {server} ({where}), {args.rounds} rounds; medians of the rounds")
        print(f"{'entry':22s} {'p50 us':>8s} {'calls/s':>9s}   each round's p50 us / calls/s")
        for name, *_ in todo:
            v = got[(server, name)]
            if not v:
                print(f"{name:22s} failed")
                continue
            p50 = statistics.median(x[0] for x in v)
            rate = statistics.median(x[1] for x in v)
            each = "  ".join(f"{a:.0f}/{b:,.0f}" for a, b in v)
            print(f"{name:22s} {p50:8.1f} {rate:9,.0f}   {each}")


if __name__ == "__main__":
    main()
