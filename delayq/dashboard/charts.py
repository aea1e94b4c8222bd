"""Bar charts as plain data for server-side SVG: no JavaScript charting, no build step."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

from delayq.admin.inspect import Finished, Timeline
from delayq.admin.present import human_seconds
from delayq.history import History, Minute, bucket

WIDTH, HEIGHT, PAD = 720, 150, 18

# name -> (bucket seconds, buckets): about 60-100 bars whatever the window.
WINDOWS: dict[str, tuple[float, int]] = {
    "10m": (10, 60),
    "1h": (60, 60),
    "6h": (300, 72),
    "24h": (900, 96),
    "7d": (7200, 84),
}

# name -> (minutes per bar, bars) of the history charts, which look back from now.
HISTORY_WINDOWS: dict[str, tuple[int, int]] = {
    "1h": (1, 60),
    "6h": (5, 72),
    "24h": (15, 96),
}

# Upper bounds (seconds) of the lateness chart's bars; the last bar holds the rest.
LATENESS_EDGES = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 300)


# A chart's spans, in their largest unit alone: 300 s is '5m'.
_span = functools.partial(human_seconds, exact=True)


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    w: float
    h: float
    value: int
    title: str
    css: str = "bar"


@dataclass
class Chart:
    bars: list[Bar]
    ticks: list[tuple[float, str]] = field(default_factory=list)
    top: int = 0
    width: int = WIDTH
    height: int = HEIGHT + PAD


def _bars(values: list[int], titles: list[str], css: list[str]) -> tuple[list[Bar], int]:
    top = max(values, default=0) or 1
    step = WIDTH / max(len(values), 1)
    bars = []
    for i, (v, t, c) in enumerate(zip(values, titles, css, strict=True)):
        h = 0.0 if v == 0 else max(1.5, HEIGHT * v / top)
        bars.append(Bar(i * step + 1, HEIGHT - h, max(step - 2, 1), h, v, t, c))
    return bars, max(values, default=0)


def timeline_chart(tl: Timeline) -> Chart:
    """Overdue tasks as the first (red) bar, then one bar per bucket from now on."""
    w = tl.bucket_seconds
    values = [tl.overdue, *tl.counts]
    titles = [f"{tl.overdue} overdue"] + [
        f"{c} due in {_span(i * w)} to {_span((i + 1) * w)}" for i, c in enumerate(tl.counts)
    ]
    css = ["bar overdue"] + ["bar"] * len(tl.counts)
    bars, top = _bars(values, titles, css)
    step = WIDTH / len(values)
    n = len(tl.counts)
    ticks = [
        (step * (1 + i), "now" if i == 0 else "+" + _span(i * w))
        for i in range(0, n, max(n // 4, 1))
    ]
    return Chart(bars, ticks, top)


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def lateness_chart(finished: list[Finished]) -> tuple[Chart, dict[str, float]]:
    """How long recent tasks took from due time to finish, as a histogram and percentiles."""
    values = sorted(v for f in finished if (v := f.due_to_done) is not None)
    counts = [0] * (len(LATENESS_EDGES) + 1)
    for v in values:
        i = next((j for j, edge in enumerate(LATENESS_EDGES) if v <= edge), len(LATENESS_EDGES))
        counts[i] += 1
    labels = [f"≤{_span(e)}" for e in LATENESS_EDGES] + [f">{_span(LATENESS_EDGES[-1])}"]
    titles = [f"{c} task(s) {label}" for c, label in zip(counts, labels, strict=True)]
    css = ["bar"] * 7 + ["bar warn"] * 3 + ["bar overdue"]
    bars, top = _bars(counts, titles, css)
    step = WIDTH / len(counts)
    ticks = [(step * i + step / 2, label) for i, label in enumerate(labels)]
    summary = {
        "n": float(len(values)),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": values[-1] if values else 0.0,
    }
    return Chart(bars, ticks, top), summary


def _clock(minute: int) -> str:
    return datetime.fromtimestamp(minute * 60, UTC).strftime("%H:%M")


def late_text(v: float | None) -> str:
    """A percentile read from the history's histogram: its bucket's upper bound."""
    if v is None:
        return "-"
    if math.isinf(v):
        return "more than 30 h"
    if v < 1:  # the sub-millisecond buckets are what a healthy queue shows
        return f"≤{v * 1000:.2g}ms" if v < 0.01 else f"≤{v * 1000:.0f}ms"
    return f"≤{human_seconds(v)}"


def history_charts(h: History, window: str) -> tuple[Chart, Chart, Minute]:
    """The queue's history over ``window`` (a HISTORY_WINDOWS name): its outcomes per bar
    (done, retried and dead stacked), its start lateness per bar (p99 behind p50, heights on
    the histogram's log scale), and the whole window's sum."""
    per, n = HISTORY_WINDOWS[window]
    spans = h.bars(per, n)
    step = WIDTH / n
    whole = Minute(spans[0].minute)
    for m in spans:
        whole.add(m)
    labels = [f"{_clock(m.minute)}-{_clock(m.minute + per)} UTC" for m in spans]

    top = max((m.done + m.retried + m.dead for m in spans), default=0) or 1
    counts: list[Bar] = []
    for i, (m, label) in enumerate(zip(spans, labels, strict=True)):
        y = float(HEIGHT)
        for v, what, css in (
            (m.done, "done", "bar ok"),
            (m.retried, "retried", "bar warn"),
            (m.dead, "dead", "bar overdue"),
        ):
            if v:
                hgt = max(1.5, HEIGHT * v / top)
                y -= hgt
                counts.append(
                    Bar(i * step + 1, y, max(step - 2, 1), hgt, v, f"{v} {what}, {label}", css)
                )

    # Lateness heights by bucket (log scale): bucket 0 (≤0.1 ms) is a low bar, not none.
    p = [(m.percentile(50), m.percentile(99)) for m in spans]
    top_bucket = max((bucket(p99) for _, p99 in p if p99 is not None), default=0)
    late: list[Bar] = []
    for i, ((p50, p99), m, label) in enumerate(zip(p, spans, labels, strict=True)):
        if p50 is None or p99 is None:
            continue
        title = f"{m.started} start(s): p50 {late_text(p50)}, p99 {late_text(p99)}, {label}"
        for edge, css in ((p99, "bar warn"), (p50, "bar")):
            hgt = HEIGHT * (bucket(edge) + 1) / (top_bucket + 1)
            late.append(
                Bar(i * step + 1, HEIGHT - hgt, max(step - 2, 1), hgt, m.started, title, css)
            )

    # (the first and last labels kept inside the chart)
    ticks = [
        (max(step * i, 14), "-" + _span((n - i) * per * 60)) for i in range(0, n, max(n // 4, 1))
    ]
    ticks.append((WIDTH - 14, "now"))
    return Chart(counts, ticks, top), Chart(late, ticks, top_bucket), whole
