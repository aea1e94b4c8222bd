"""The table, the bars (as ratios), the JSON and the PNG chart of one peers run."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Results = dict[str, dict[str, Any]]  # peer -> measure -> figures, or {"error": text}

# measure, figure, label, unit, True when higher is better
BAR_MEASURES = (
    ("schedule", "tasks_per_s", "schedule throughput", "tasks/s", True),
    ("single", "tasks_per_s", "one call per task", "tasks/s", True),
    ("lateness", "p99_ms", "lateness p99", "ms", False),
    ("drain", "tasks_per_s", "drain", "tasks/s", True),
    ("idle", "sent_per_s", "idle commands sent", "cmd/s", False),
    ("idle", "executed_per_s", "idle commands executed", "cmd/s", False),
    ("idle", "bytes_per_task", "memory per waiting task", "B", False),
)
FLOOR_DRAIN_LIMIT = 3.0
TIE = 0.02  # a ratio within 2% of 1 is a tie: not ahead


def fig(results: Results, peer: str, measure: str, key: str) -> float:
    m = results.get(peer, {}).get(measure)
    if not isinstance(m, dict) or "error" in m:
        return math.nan
    v = m.get(key)
    return float(v) if isinstance(v, int | float) else math.nan


def skipped(results: Results, peer: str) -> bool:
    """True when the peer was not run (its package is not installed)."""
    return any(isinstance(m, dict) and "skipped" in m for m in results.get(peer, {}).values())


def error(results: Results, peer: str, measure: str) -> str | None:
    m = results.get(peer, {}).get(measure)
    if isinstance(m, dict) and "error" in m:
        return str(m["error"])
    return None


# -- formatting ---------------------------------------------------------------------------------


def n0(v: float) -> str:
    if math.isnan(v):
        return "-"
    if math.isinf(v):
        return "inf"
    return f"{v:,.0f}"


def ms(v: float) -> str:
    if math.isnan(v):
        return "-"
    if math.isinf(v):
        return "never"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}"


def small(v: float) -> str:
    if math.isnan(v):
        return "-"
    return f"{v:.1f}" if v < 100 else f"{v:,.0f}"


def ratio_text(r: float) -> str:
    if math.isnan(r):
        return "n/a"
    if math.isinf(r):
        return "inf"
    return f"{r:,.1f}x" if r >= 10 else f"{r:.2f}x"


# -- the table ----------------------------------------------------------------------------------

COLUMNS = (
    ("peer", 9),
    ("version", 8),
    ("schedule/s", 11),
    ("late p50", 9),
    ("p95", 7),
    ("p99", 7),
    ("max ms", 7),
    ("missing", 7),
    ("dup", 4),
    ("drain/s", 8),
    ("idle cmd/s", 10),
    ("(+scripts)", 10),
    ("B/task", 7),
)


def table_rows(results: Results, versions: dict[str, str]) -> list[list[str]]:
    rows = []
    for peer in results:

        def f(measure: str, key: str, peer: str = peer) -> float:
            return fig(results, peer, measure, key)

        def cell(measure: str, text: str, peer: str = peer) -> str:
            if skipped(results, peer):
                return "skipped"
            return "ERROR" if error(results, peer, measure) else text

        lat_missing = f("lateness", "missing")
        partial_drain = results[peer].get("drain", {}).get("complete") is False
        rows.append(
            [
                peer,
                versions.get(peer, "?"),
                cell("schedule", n0(f("schedule", "tasks_per_s"))),
                cell("lateness", ms(f("lateness", "p50_ms"))),
                cell("lateness", ms(f("lateness", "p95_ms"))),
                cell("lateness", ms(f("lateness", "p99_ms"))),
                cell("lateness", ms(f("lateness", "max_ms"))),
                cell("lateness", n0(lat_missing)),
                cell("lateness", n0(f("lateness", "duplicated"))),
                cell("drain", n0(f("drain", "tasks_per_s")) + ("*" if partial_drain else "")),
                cell("idle", small(f("idle", "sent_per_s"))),
                cell("idle", small(f("idle", "executed_per_s"))),
                cell("idle", n0(f("idle", "bytes_per_task"))),
            ]
        )
    return rows


def table_text(results: Results, versions: dict[str, str]) -> str:
    rows = table_rows(results, versions)
    widths = [max(w, *(len(r[i]) for r in rows)) for i, (_, w) in enumerate(COLUMNS)]
    head = "  ".join(
        h.ljust(w) if i < 2 else h.rjust(w)
        for i, ((h, _), w) in enumerate(zip(COLUMNS, widths, strict=True))
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    return "\n".join(lines)


def table_markdown(results: Results, versions: dict[str, str]) -> str:
    heads = [
        "peer",
        "version",
        "schedule (tasks/s)",
        "lateness p50 (ms)",
        "p95",
        "p99",
        "max",
        "missing",
        "duplicated",
        "drain (tasks/s)",
        "idle: cmd/s sent",
        "idle: cmd/s incl. in scripts",
        "memory (B/task)",
    ]
    out = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in table_rows(results, versions):
        r = [f"**{c}**" if r[0] == "delayq" and i == 0 else c for i, c in enumerate(r)]
        out.append("| " + " | ".join(r) + " |")
    return "\n".join(out)


def errors_text(results: Results) -> list[str]:
    lines = []
    for peer, ms_ in results.items():
        for measure, m in ms_.items():
            if isinstance(m, dict) and "error" in m:
                lines.append(f"{peer} {measure}: {m['error']}")
    return lines


def skipped_text(results: Results) -> list[str]:
    out = []
    for peer, ms_ in results.items():
        why = next(
            (m["skipped"] for m in ms_.values() if isinstance(m, dict) and "skipped" in m), None
        )
        if why:
            out.append(f"{peer}: {why}")
    return out


# -- one call per task ----------------------------------------------------------------------------


def single_rows(results: Results, versions: dict[str, str] | None = None) -> list[list[str]]:
    """peer, call, p50 us, p99 us, calls/s, delayq (sync) calls/s / the peer's."""
    rows = []
    ours = fig(results, "delayq", "single", "tasks_per_s")
    for peer in results:
        m = results[peer].get("single")
        if not isinstance(m, dict):
            continue
        if "skipped" in m or "error" in m:
            text = "skipped" if "skipped" in m else "ERROR"
            rows.append([peer, text, "", "", "", ""])
            continue
        variants = [("sync" if peer == "delayq" else "", m)]
        if isinstance(m.get("async"), dict):
            variants.append(("async", m["async"]))
        for label, v in variants:
            rate = float(v["tasks_per_s"])
            r = ours / rate if rate > 0 and peer != "delayq" else math.nan
            rows.append(
                [
                    f"{peer} ({label})" if label else peer,
                    "",
                    n0(float(v["p50_us"])),
                    n0(float(v["p99_us"])),
                    n0(rate),
                    ratio_text(r) if peer != "delayq" else "",
                ]
            )
    return rows


SINGLE_HEADS = ("peer", "", "p50 (µs)", "p99 (µs)", "calls/s", "delayq sync ÷ peer")


def single_text(results: Results) -> str:
    rows = single_rows(results)
    if not rows:
        return ""
    heads = [h.replace("µ", "u") for h in SINGLE_HEADS]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    lines = [
        "  ".join(
            h.rjust(w) if i > 1 else h.ljust(w)
            for i, (h, w) in enumerate(zip(heads, widths, strict=True))
        )
    ]
    for r in rows:
        lines.append(
            "  ".join(
                c.rjust(w) if i > 1 else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    return "\n".join(lines)


def single_markdown(results: Results) -> str:
    heads = ["peer", "p50 (µs)", "p99 (µs)", "calls/s", "delayq sync ÷ peer"]
    out = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in single_rows(results):
        cells = [r[0] if not r[1] else f"{r[0]}: {r[1]}", *r[2:]]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def idle_markdown(results: Results) -> str:
    """Per idle worker: commands sent, executed (scripts' inner ones included), the peer's
    executed / delayq's, server CPU."""
    heads = ["peer", "cmd/s sent", "cmd/s executed", "peer ÷ delayq (executed)", "server CPU ms/s"]
    out = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    ours = fig(results, "delayq", "idle", "executed_per_s")
    for peer in results:
        if skipped(results, peer):
            out.append(f"| {peer} | skipped | | | |")
            continue
        if error(results, peer, "idle"):
            out.append(f"| {peer} | ERROR | | | |")
            continue
        ex = fig(results, peer, "idle", "executed_per_s")
        r = ex / ours if ours > 0 and peer != "delayq" else math.nan
        out.append(
            f"| {peer} | {small(fig(results, peer, 'idle', 'sent_per_s'))} | {small(ex)} | "
            f"{ratio_text(r) if peer != 'delayq' else ''} | "
            f"{small(fig(results, peer, 'idle', 'server_cpu_ms_per_s'))} |"
        )
    return "\n".join(out)


def ratios_markdown(bars_: list[dict[str, Any]]) -> str:
    """The bars as one table: a row per measure, a column per peer (delayq's advantage)."""
    peers = list(dict.fromkeys(b["peer"] for b in bars_ if b["peer"] != "floor"))
    whats = list(dict.fromkeys(b["what"] for b in bars_ if b["peer"] != "floor"))
    out = ["| measure | " + " | ".join(peers) + " |", "|" + "---|" * (len(peers) + 1)]
    for w in whats:
        cells = []
        for p in peers:
            b = next((b for b in bars_ if b["what"] == w and b["peer"] == p), None)
            r = float(b["ratio"]) if b and b["ratio"] is not None else math.nan
            cells.append(ratio_text(r) if b else "")
        out.append(f"| {w} (delayq's advantage) | " + " | ".join(cells) + " |")
    return "\n".join(out)


def servers_text(by_server: dict[str, Results]) -> str:
    """delayq's own figures side by side on each server."""
    keys = (
        ("schedule", "tasks_per_s", "schedule_many tasks/s", n0),
        ("single", "tasks_per_s", "schedule() calls/s", n0),
        ("single", "p50_us", "schedule() p50 us", n0),
        ("lateness", "p99_ms", "lateness p99 ms", ms),
        ("drain", "tasks_per_s", "drain tasks/s", n0),
        ("idle", "executed_per_s", "idle cmd/s executed", small),
        ("idle", "bytes_per_task", "B per waiting task", n0),
    )
    lines = ["  " + "".ljust(22) + "".join(f.rjust(12) for f in by_server)]
    for measure, key, label, fmt in keys:
        vals = [fmt(fig(r, "delayq", measure, key)) for r in by_server.values()]
        lines.append("  " + label.ljust(22) + "".join(v.rjust(12) for v in vals))
    return "\n".join(lines)


def _load(v: Any) -> str:
    return " ".join(f"{x:.2f}" for x in v) if isinstance(v, list | tuple) else "?"


def markdown_all(doc: dict[str, Any]) -> str:
    """Every server's tables as Markdown, for docs/benchmarks.md."""
    out = [
        f"Run {doc['started']}, commit {doc['commit']}, {doc['machine']['nproc']} x "
        f"{doc['machine']['cpu']}, load average at start {_load(doc['machine']['loadavg_start'])}"
        f"{' [--quick]' if doc['quick'] else ''}",
    ]
    for flavour, run in doc["servers"].items():
        res = run["results"]
        out += [
            "",
            f"## {flavour}: {run['server']}",
            f"load average {_load(run.get('loadavg_start'))} -> {_load(run.get('loadavg_end'))}",
            "",
            run.get("table_markdown", ""),
            "",
            ratios_markdown(run.get("bars", [])),
            "",
            single_markdown(res),
            "",
            idle_markdown(res),
        ]
        out += [f"- skipped: {line}" for line in skipped_text(res)]
        out += [f"- error: {line}" for line in errors_text(res)]
    return "\n".join(out) + "\n"


# -- bars ---------------------------------------------------------------------------------------


@dataclass
class Bar:
    what: str
    peer: str
    ours: float
    theirs: float
    ratio: float  # how many times better delayq is (> 1: ahead)
    unit: str
    passed: bool
    note: str = ""
    phrase: str = "better"

    def line(self) -> str:
        verdict = "PASS" if self.passed else ("N/A " if math.isnan(self.ratio) else "FAIL")
        if not self.passed and abs(self.ratio - 1) <= TIE and self.peer != "floor":
            verdict = "TIE "
        fmt = ms if self.unit == "ms" else (small if self.unit == "cmd/s" else n0)
        if math.isnan(self.ratio):
            verdict_text = "no ratio"
        elif self.peer == "floor" or self.ratio >= 1:
            verdict_text = f"delayq {ratio_text(self.ratio)} {self.phrase}"
        else:
            inv = 1 / self.ratio if self.ratio > 0 else math.inf
            verdict_text = f"{self.peer} {ratio_text(inv)} {self.phrase}"
        return (
            f"[{verdict}] {self.what:24s} vs {self.peer:8s}: delayq {fmt(self.ours)} {self.unit}, "
            f"{self.peer} {fmt(self.theirs)} {self.unit} -> {verdict_text}{self.note}"
        )


def bars(results: Results) -> list[Bar]:
    out: list[Bar] = []
    peers = [p for p in results if p not in ("delayq", "floor") and not skipped(results, p)]
    lat_ok = (
        fig(results, "delayq", "lateness", "missing") == 0
        and fig(results, "delayq", "lateness", "duplicated") == 0
    )
    for measure, key, label, unit, higher in BAR_MEASURES:
        if measure not in results.get("delayq", {}):
            continue  # not run
        ours = fig(results, "delayq", measure, key)
        for peer in peers:
            theirs = fig(results, peer, measure, key)
            if higher:
                r = ours / theirs if theirs > 0 else (math.inf if ours > 0 else math.nan)
            else:
                r = theirs / ours if ours > 0 else (math.inf if theirs > 0 else math.nan)
            note = ""
            if error(results, peer, measure):
                note = f" ({peer} failed this measure: not comparable)"
                r = math.nan
            passed = not math.isnan(r) and r > 1.0 + TIE
            if measure == "lateness" and not lat_ok:
                passed, note = False, " (delayq missed or duplicated tasks)"
            if measure == "drain" and results["delayq"].get("drain", {}).get("complete") is False:
                passed, note = False, " (delayq did not finish the drain)"
            out.append(Bar(label, peer, ours, theirs, r, unit, passed, note))
    ours = fig(results, "delayq", "drain", "tasks_per_s")
    floor = fig(results, "floor", "drain", "tasks_per_s")
    if "floor" in results and "drain" in results["floor"] and "drain" in results["delayq"]:
        r = floor / ours if ours > 0 else math.nan
        share = ours / floor if floor > 0 else math.nan
        passed = not math.isnan(r) and r <= FLOOR_DRAIN_LIMIT
        note = f" (floor / delayq = {ratio_text(r)}; bar: within {FLOOR_DRAIN_LIMIT:g}x)"
        out.append(
            Bar(
                "drain within 3x of floor",
                "floor",
                ours,
                floor,
                share,
                "tasks/s",
                passed,
                note,
                "the floor's rate",
            )
        )
    return out


# -- chart --------------------------------------------------------------------------------------


def chart(results: Results, scale: dict[str, Any] | None, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    peers = list(results)
    palette = {"delayq": "#d62728", "floor": "#7f7f7f"}
    colors = [palette.get(p, "#1f77b4") for p in peers]
    panels = [
        ("schedule", ("tasks_per_s",), "schedule: tasks/s, one producer (higher is better)", True),
        ("lateness", ("p99_ms",), "lateness p99: ms, log scale (lower is better)", True),
        ("drain", ("tasks_per_s",), "drain: tasks/s, one worker (higher is better)", True),
        (
            "idle",
            ("sent_per_s", "executed_per_s"),
            "idle worker: cmd/s sent | executed incl. in scripts (lower)",
            False,
        ),
        ("idle", ("bytes_per_task",), "memory: bytes per waiting task (lower is better)", False),
    ]
    fig_, axes = plt.subplots(2, 3, figsize=(16, 9))
    xs = list(range(len(peers)))
    for ax, (measure, keys, label, log) in zip(axes.flat, panels, strict=False):
        ax.set_title(label, fontsize=10)
        ax.set_xticks(xs, peers, rotation=30, fontsize=8)
        width = 0.8 / len(keys)
        allvals = [fig(results, p, measure, k) for k in keys for p in peers]
        finite = [v for v in allvals if math.isfinite(v) and v > 0]
        if not finite:
            ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
            continue
        top = max(finite) * (3 if log else 1.15)
        for j, key in enumerate(keys):
            vals = [fig(results, p, measure, key) for p in peers]
            shown = [v if math.isfinite(v) else (top if math.isinf(v) else 0) for v in vals]
            pos = [x + (j - (len(keys) - 1) / 2) * width for x in xs]
            bars_ = ax.bar(
                pos,
                shown,
                width=width,
                color=colors,
                hatch="//" if j else None,
                alpha=0.6 if j else 1,
            )
            for b_, v, p in zip(bars_, vals, peers, strict=True):
                txt = (
                    "error"
                    if error(results, p, measure)
                    else ("never" if math.isinf(v) else ("-" if math.isnan(v) else _short(v)))
                )
                y = b_.get_height() if b_.get_height() > 0 else (min(finite) if log else 0)
                ax.annotate(
                    txt, (b_.get_x() + b_.get_width() / 2, y), ha="center", va="bottom", fontsize=7
                )
        if log:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _short(v)))
            ax.yaxis.set_minor_formatter(NullFormatter())
    ax = axes.flat[5]
    if scale:
        ms_ = sorted(int(k) for k in scale)
        labels = ["0 (table)", *(f"{m:,}" for m in ms_)]
        p99 = [fig(results, "delayq", "lateness", "p99_ms")]
        p99 += [float(scale[str(m)]["lateness"]["p99_ms"]) for m in ms_]
        drain = [fig(results, "delayq", "drain", "tasks_per_s")]
        drain += [float(scale[str(m)]["drain"]["tasks_per_s"]) for m in ms_]
        ax.plot(labels, p99, "o-", color="#d62728", label="lateness p99 (ms)")
        ax.set_ylabel("lateness p99 (ms)")
        ax.set_ylim(bottom=0, top=max([v for v in p99 if math.isfinite(v)] or [1]) * 1.5)
        ax2 = ax.twinx()
        ax2.plot(labels, drain, "s--", color="#2ca02c", label="drain (tasks/s)")
        ax2.set_ylabel("drain (tasks/s)")
        ax2.set_ylim(bottom=0, top=max([v for v in drain if math.isfinite(v)] or [1]) * 1.3)
        ax.set_title("delayq alone with N tasks already waiting", fontsize=10)
        ax.set_xlabel("tasks waiting (due later)")
        lines = ax.get_lines() + ax2.get_lines()
        ax.legend(lines, [str(x.get_label()) for x in lines], fontsize=8, loc="lower left")
    else:
        ax.axis("off")
    fig_.suptitle(title, fontsize=11)
    fig_.tight_layout()
    fig_.savefig(path, dpi=100)
    plt.close(fig_)


def _short(v: float) -> str:
    if v >= 10_000:
        return f"{v / 1000:,.0f}k"
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}"
