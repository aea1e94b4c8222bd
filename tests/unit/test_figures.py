"""Headline figures come from one file, docs/figures.json, written by bench/headline.py from the
last full ``bench/peers/run``. A page that quotes a headline figure the file does not hold
fails here.

What counts as a headline claim:

- in README.md, every number with a unit of time or rate (``ms``, ``µs``, ``tasks/s``,
  ``commands/s``) or of memory per task: the README's figures are all headlines;
- in docs/*.md, "p99 lateness N ms" / "lateness p99 N ms" (delayq's headline lateness), and
  "N commands/s sent" / "N commands/s executed" (the idle cost). Figures of other runs (the
  soak, the cluster runs, a ``--quick`` run) stay in their pages in other words, naming
  their run;
- docs/benchmarks.md is the page of the run itself: it must name the file's date and commit,
  and its delayq row must hold every figure.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "docs" / "figures.json"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
NUMBER = r"(\d[\d,]*(?:\.\d+)?)"

# README: a number and its unit; the unit as figures.json spells it (None: no figure has it).
README_UNITS = {
    "ms": "ms",
    "µs": None,
    "tasks/s": "tasks/s",
    "commands/s": "commands/s",
    "command/s": "commands/s",
    "cmd/s": "commands/s",
    "B per waiting task": "B per waiting task",
    "bytes per waiting task": "B per waiting task",
    "B/task": "B per waiting task",
}
_UNITS = "|".join(re.escape(u) for u in sorted(README_UNITS, key=len, reverse=True))
README_CLAIM = re.compile(rf"(?<![\w.]){NUMBER}\s?({_UNITS})")

# docs/*.md: headline phrasings, each tied to one figure.
DOCS_CLAIMS = {
    "lateness_p99_ms": re.compile(
        rf"(?:p99 lateness|lateness p99)(?: of| was| is)? ~?{NUMBER} ?ms", re.I
    ),
    "idle_sent_per_s": re.compile(rf"{NUMBER} (?:commands?|cmd)/s sent", re.I),
    "idle_executed_per_s": re.compile(rf"{NUMBER} (?:commands?|cmd)/s executed", re.I),
}

# docs/benchmarks.md's results table: the column that shows each figure in delayq's row.
COLUMNS = {
    "schedule_tasks_per_s": "schedule (tasks/s)",
    "lateness_p50_ms": "lateness p50 (ms)",
    "lateness_p99_ms": "p99",
    "lateness_max_ms": "max",
    "drain_tasks_per_s": "drain (tasks/s)",
    "idle_sent_per_s": "idle: cmd/s sent",
    "idle_executed_per_s": "idle: cmd/s incl. in scripts",
    "memory_bytes_per_task": "memory (B/task)",
}


def figures() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(FIGURES.read_text())
    return doc


def num(text: str) -> float:
    return float(text.replace(",", ""))


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_file_gives_each_figure_its_value_unit_command_date_and_commit() -> None:
    doc = figures()
    run = doc["run"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", run["date"])
    assert re.fullmatch(r"[0-9a-f]{7,40}", run["commit"]), "a clean commit, not +dirty"
    assert doc["figures"], "no figures"
    for name, fig in doc["figures"].items():
        assert isinstance(fig["value"], int | float), name
        assert fig["unit"] in set(README_UNITS.values()) - {None}, name
        assert (fig["command"], fig["date"], fig["commit"]) == (
            run["command"],
            run["date"],
            run["commit"],
        ), f"{name} comes from another run than the file's"


def test_benchmarks_page_is_the_run_the_file_comes_from() -> None:
    doc = figures()
    text = BENCHMARKS.read_text()
    date = doc["run"]["date"].removesuffix(" UTC")
    assert date in text and doc["run"]["commit"] in text, (
        "docs/benchmarks.md must present the run docs/figures.json comes from"
    )
    header, row = _table_row(text, "**delayq**")
    for name, column in COLUMNS.items():
        cell = row[header.index(column)]
        assert num(cell) == doc["figures"][name]["value"], (
            f"docs/benchmarks.md shows {column} = {cell}; docs/figures.json has "
            f"{name} = {doc['figures'][name]['value']}"
        )


def test_readme_quotes_only_figures_from_the_file() -> None:
    values = {(f["unit"], f["value"]) for f in figures()["figures"].values()}
    text = (ROOT / "README.md").read_text()
    claims = README_CLAIM.findall(text)
    assert claims, "the README quotes no headline figure: the pattern or the README changed"
    bad = [f"{n} {u}" for n, u in claims if (README_UNITS[u], num(n)) not in values]
    assert not bad, f"README.md quotes figures that are not in docs/figures.json: {bad}"


@pytest.mark.parametrize("page", pages()[1:], ids=lambda p: p.name)
def test_docs_quote_only_headline_figures_from_the_file(page: Path) -> None:
    if page == BENCHMARKS:
        return  # the run's own page: checked above
    figs = figures()["figures"]
    text = page.read_text()
    bad = [
        f"{m.group(0)!r} (docs/figures.json: {figs[name]['value']} {figs[name]['unit']})"
        for name, pattern in DOCS_CLAIMS.items()
        for m in pattern.finditer(text)
        if num(m.group(1)) != figs[name]["value"]
    ]
    assert not bad, f"{page.name} quotes a headline figure from another run: {bad}"


def test_the_check_catches_a_figure_from_another_run() -> None:
    """The patterns find the phrasings the pages used before there was one source."""
    assert README_CLAIM.findall("(p99 lateness 0.23 ms, 10,000 tasks)") == [("0.23", "ms")]
    m = DOCS_CLAIMS["lateness_p99_ms"].search("p99 lateness 1.57 ms with an async handler")
    assert m and m.group(1) == "1.57"
    assert DOCS_CLAIMS["idle_sent_per_s"].search("counted 0.20 commands/s sent and 1.00/s")


def test_headline_script_writes_the_file_from_a_full_run_only(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import headline
    finally:
        sys.path.remove(str(ROOT / "bench"))
    run = {
        "quick": False,
        "started": "2026-12-01 11:39:00 +0100",
        "commit": "abc1234",
        "seconds": 852.0,
        "machine": {"cpu": "x"},
        "results": {
            "delayq": {
                "schedule": {"tasks_per_s": 85259.4, "loop_tasks_per_s": 6246.2, "complete": True},
                "lateness": {"p50_ms": 0.12, "p99_ms": 0.38, "max_ms": 1.46},
                "drain": {"tasks_per_s": 77999.6, "complete": True},
                "idle": {"sent_per_s": 0.2, "executed_per_s": 1.0, "bytes_per_task": 219.3},
            }
        },
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    out = tmp_path / "figures.json"
    assert headline.main([str(path), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["run"]["date"] == "2026-12-01 10:39 UTC"
    assert doc["figures"]["lateness_p99_ms"]["value"] == 0.4
    assert doc["figures"]["drain_tasks_per_s"]["value"] == 78000
    assert doc["figures"]["memory_bytes_per_task"]["value"] == 219
    assert set(doc["figures"]) == set(figures()["figures"])
    path.write_text(json.dumps(dict(run, quick=True)))
    assert headline.main([str(path), "--out", str(out)]) == 1
    path.write_text(json.dumps(dict(run, commit=None)))
    assert headline.main([str(path), "--out", str(out)]) == 1
    assert headline.main([str(path), "--out", str(out), "--commit", "def5678"]) == 0


def _table_row(text: str, first_cell: str) -> tuple[list[str], list[str]]:
    """The header and the row starting with ``first_cell`` of a Markdown table."""
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if cells and cells[0] == first_cell:
            j = i
            while j > 0 and lines[j - 1].startswith("|"):
                j -= 1
            header = [c.strip() for c in lines[j].strip().strip("|").split("|")]
            return header, cells
    raise AssertionError(f"no table row starting with {first_cell!r}")
