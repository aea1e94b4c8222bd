"""docs/coming-from.md: every "After:" block is real delayq API. Each block compiles, imports
only names delayq exports, and calls Queue, AsyncQueue, Worker, schedule, handler, cron and
every with keywords their signatures accept."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import delayq
from delayq import AsyncQueue, Queue, Worker
from delayq.spec import ScheduleOptions
from delayq.worker.features.cron import Schedules

PAGE = Path(__file__).resolve().parents[2] / "docs" / "coming-from.md"
AFTER = re.compile(r"^After:\n\n(?:<!--.*?-->\n)?```python\n(.*?)^```$", re.S | re.M)


def keywords(fn: Callable[..., Any], rest: set[str] | None = None) -> set[str] | None:
    """The keyword names ``fn`` accepts; ``rest``: what its ``**kwargs`` are passed on to
    (None: anything)."""
    params = inspect.signature(fn).parameters.values()
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None if rest is None else named | rest
    return named


HANDLER = keywords(Worker.handler) or set()
ACCEPTS: dict[str, set[str] | None] = {
    "Queue": keywords(Queue.__init__),
    "AsyncQueue": keywords(AsyncQueue.__init__),
    "Worker": keywords(Worker.__init__),
    "schedule": set(ScheduleOptions.__annotations__),
    "handler": HANDLER,
    # cron and every pass their other keywords on to the handler (max_attempts, backoff, ...)
    "cron": keywords(Schedules.cron, HANDLER),
    "every": keywords(Schedules.every, HANDLER),
    "Retry": keywords(delayq.Retry.__init__),
}


def blocks() -> list[str]:
    found = AFTER.findall(PAGE.read_text())
    assert len(found) >= 5, "one After: block per peer"
    return found


@pytest.mark.parametrize("code", blocks(), ids=lambda c: c.split("\n", 1)[0][:40])
def test_after_block_uses_real_delayq_api(code: str) -> None:
    tree = compile(code, "<after>", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "delayq":
            for alias in node.names:
                assert alias.name in delayq.__all__, alias.name
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name not in ACCEPTS:
                continue
            allowed = ACCEPTS[name]
            used = {k.arg for k in node.keywords if k.arg}
            if allowed is not None:
                assert used <= allowed, f"{name}() has no keyword {used - allowed}"
            if name == "schedule":
                assert isinstance(node.args[0], ast.Constant), "schedule(kind, payload, ...)"


def test_cron_and_every_accept_the_options_the_page_uses() -> None:
    params = inspect.signature(Schedules.cron).parameters
    assert "tz" in params and "name" in params
    assert {"minutes", "name"} <= set(inspect.signature(Schedules.every).parameters)
