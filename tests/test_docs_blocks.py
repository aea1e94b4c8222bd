"""Every fenced code block in docs/ runs in a test or says why not, and its Python is typed.

A block's marker is an HTML comment on the line just before its fence, which neither the
site nor GitHub shows::

    <!-- docs: DIRECTIVE; DIRECTIVE ... -->

with these directives:

- ``not-run: REASON``: not executed here (a command that installs or serves until stopped,
  code that needs a server or a service not at hand, another library's code).
- ``not-typed: REASON``: a Python block left out of the type check (another library's
  code, or an excerpt that is not a module, such as a method's body).
- ``with: PRELUDE``: run and type-checked after one of the ``PRELUDES`` below, which give
  the block the names its page's prose has given it (``queue``, ``worker``, ``store``, ...).
- ``file: NAME``: the block is the file NAME of its page's example (``tasks.py``), written
  where the page's other blocks run, so that they import it; it is run and typed too.
- ``in: PATH``: the block is copied verbatim from PATH (checked here, whatever the
  indentation: a method's body is shown dedented), whose tests run it: not run again here,
  and typed as PATH, which the type check takes whole (a block alone may use names its
  file defines).
- ``ran-by: tests/FILE.py::TEST``: a shell command that TEST runs as a user would (checked
  to exist).

Without a marker a ``python`` block is run and typed as it is. A shell block (``bash``,
``sh``, ``console``) must say ``not-run`` or ``ran-by``. A block in a data language
(``json``, ``yaml``, ``text``, ``ini``, ``conf``, ``toml``, ``dockerfile``, ``promql``) is
not a program, and its language says so; a fence without a language is refused (write
``text``).

Running: the runnable Python blocks of every page, in page order, in one child process
(``tests/support/docs_runner.py``), each in a fresh namespace, in a scratch directory,
against a private server that ``DELAYQ_REDIS_URL`` names and that is flushed before each
block. ``redis://127.0.0.1:6379/0`` in a block stands for that server: so written, the
blocks read as a user's code, and none of them reaches a real Redis on 6379. Typing: each
Python block, after its prelude, is one module of a single ``mypy --strict`` run with the
project's configuration (an ``in:`` block's file is checked in its place).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from delayq.embedded import EmbeddedServer

from .conftest import ROOT

DOCS = ROOT / "docs"
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)(?P<lang>[\w+-]*)[^\n]*$")
MARKER = re.compile(r"^\s*<!--\s*docs:\s*(?P<body>.*?)\s*-->\s*$")
SHELL = {"bash", "sh", "console", "shell"}
DATA = {"json", "yaml", "text", "ini", "conf", "toml", "dockerfile", "promql"}
DIRECTIVES = {"not-run", "not-typed", "with", "file", "in", "ran-by"}
LOCAL_URL = "redis://127.0.0.1:6379/0"

APP = """\
from datetime import UTC, datetime, timedelta
from typing import Any

from delayq import Discard, Expired, Fail, Queue, Retry, Task, TaskSpec, Worker
from delayq.hooks import CallNext


class Store:
    def close_if_pending(self, order_id: int) -> bool:
        return True


class Metrics:
    def observe(self, kind: str, seconds: float) -> None: ...


queue = Queue("orders")
worker = Worker(queue)
store = Store()
metrics = Metrics()
order_id = 42
users = [1, 2, 3]
suspended_tenants: set[str] = set()


def chunks(payload: Any) -> list[Any]:
    return [payload]


def render(chunk: Any) -> None: ...


def current_tenant() -> str:
    return "acme"
"""

# The names a block's page has given it, by name (``<!-- docs: with: app -->``).
PRELUDES = {"app": APP}

# Pages not yet held to these rules, each with why; test_pending_pages_still_need_it fails
# once a page passes, so that it leaves this list.
PENDING: dict[str, str] = {}


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    directives: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"

    @property
    def prelude(self) -> str:
        return PRELUDES.get(self.directives.get("with", ""), "")

    @property
    def runs(self) -> bool:
        return self.lang == "python" and not {"not-run", "in"} & set(self.directives)

    @property
    def typed(self) -> bool:
        return self.lang == "python" and "not-typed" not in self.directives


def parse_marker(body: str) -> dict[str, str]:
    out = {}
    for part in filter(None, (p.strip() for p in body.split(";"))):
        key, _, value = part.partition(":")
        out[key.strip()] = value.strip()
    return out


def blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = i + 1
        close = re.compile(rf"^\s*{re.escape(m['fence'])}\s*$")
        while end < len(lines) and not close.match(lines[end]):
            end += 1
        body = textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n"
        marker = MARKER.match(lines[i - 1]) if i else None
        directives = parse_marker(marker["body"]) if marker else {}
        found.append(Block(page, i + 1, m["lang"].lower(), body, directives))
        i = end + 1
    return found


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)


EVERY = [b for p in pages() for b in blocks(p)]
ALL = [b for b in EVERY if b.where.rsplit(":", 1)[0] not in PENDING]


def test_pending_pages_still_need_it() -> None:
    for page, why in PENDING.items():
        assert (ROOT / page).is_file(), f"{page} is gone: drop it from PENDING"
        own = [b for b in EVERY if b.where.startswith(f"{page}:")]
        assert any(problems(b) for b in own), f"{page} passes: drop it from PENDING ({why})"


def test_the_docs_have_blocks_of_each_kind() -> None:
    langs = {b.lang for b in ALL}
    assert {"python", "bash", "json"} <= langs and len(ALL) > 80


def contains(text: str, code: str) -> bool:
    """``code``'s lines, in a row, in ``text``, whatever their indentation (a method's body
    is shown dedented)."""
    want = [line.strip() for line in code.strip().splitlines()]
    have = [line.strip() for line in text.splitlines()]
    return any(have[i : i + len(want)] == want for i in range(len(have) - len(want) + 1))


def problems(block: Block) -> list[str]:
    """What is wrong with a block's marker, or its want of one."""
    d = block.directives
    out = [f"unknown directive {k!r}" for k in d if k not in DIRECTIVES]
    out += [f"{k}: needs a value" for k in ("not-run", "not-typed", "with", "file", "in", "ran-by")
            if k in d and not d[k]]  # fmt: skip
    if not block.lang:
        out.append("a fence without a language: write ```text (or the block's language)")
    elif block.lang in SHELL and not {"not-run", "ran-by"} & set(d):
        out.append("a shell block: mark it <!-- docs: not-run: WHY --> or ran-by: TEST")
    elif block.lang not in SHELL | DATA | {"python"}:
        out.append(f"language {block.lang!r}: add it to DATA or SHELL in {__name__}")
    if "with" in d and d["with"] not in PRELUDES:
        out.append(f"no prelude {d['with']!r} (there are {sorted(PRELUDES)})")
    if "in" in d:
        texts = [(ROOT / p.strip()).read_text() for p in d["in"].split(",")]
        if not any(contains(t, block.code) for t in texts):
            out.append(f"not found verbatim in {d['in']}")
    if "ran-by" in d:
        path, _, test = d["ran-by"].partition("::")
        source = ROOT / path
        if not source.is_file() or f"def {test}(" not in source.read_text():
            out.append(f"no test {d['ran-by']}")
    return out


def test_every_block_runs_in_a_test_or_is_marked() -> None:
    wrong = [f"{b.where}: {p}" for b in ALL for p in problems(b)]
    assert wrong == [], "\n".join(wrong)


def test_the_marker_rules_catch_what_they_should(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "```\nplain\n```\n\n```bash\nrm -rf /\n```\n\n"
        "<!-- docs: not-run: installs -->\n```sh\npip install x\n```\n\n"
        "<!-- docs: with: nothing -->\n```python\nx = 1\n```\n\n"
        "<!-- docs: in: tests/conftest.py -->\n```python\nnot in it = 1\n```\n\n"
        "<!-- docs: ran-by: tests/test_demo.py::test_nope -->\n```bash\ndelayq demo\n```\n"
    )
    got = [problems(b) for b in blocks(page)]
    assert [len(p) for p in got] == [1, 1, 0, 1, 1, 1], got


def test_every_python_block_passes_mypy_strict(tmp_path: Path) -> None:
    typed = [b for b in ALL if b.typed]
    assert len(typed) > 30
    where: dict[str, tuple[Block, int]] = {}
    files: set[str] = set()  # the sources of in: blocks, checked whole
    for i, b in enumerate(typed):
        if "in" in b.directives:
            files |= {str(ROOT / p.strip()) for p in b.directives["in"].split(",")}
            continue
        name = b.directives.get("file") or f"block_{i:03d}.py"
        (tmp_path / name).write_text(b.prelude + b.code)
        where[name] = (b, b.prelude.count("\n"))
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--strict", "--cache-dir", str(ROOT / ".mypy_cache"), "--no-error-summary",
         "--hide-error-context", *sorted(where), *sorted(files)],
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    errors = []
    for line in proc.stdout.splitlines():
        m = re.match(r"^(?P<file>[\w.]+):(?P<line>\d+): (?P<rest>.*)$", line)
        if m and m["file"] in where:
            b, offset = where[m["file"]]
            errors.append(f"{b.page.relative_to(ROOT)}:{b.line + int(m['line']) - offset}: "
                          f"{m['rest']}")  # fmt: skip
        elif line.strip():
            errors.append(line)
    assert proc.returncode == 0 and errors == [], "\n".join(errors) + proc.stderr


def test_every_runnable_python_block_runs_on_a_real_server(
    tmp_path: Path, make_server: Callable[..., EmbeddedServer]
) -> None:
    srv = make_server()
    runnable = [b for b in ALL if b.runs]
    assert len(runnable) > 20
    todo = [
        {
            "where": b.where,
            "prelude": b.prelude,
            "code": b.code.replace(LOCAL_URL, srv.url),
            "file": b.directives.get("file", ""),
        }
        for b in runnable
    ]
    (tmp_path / "blocks.json").write_text(json.dumps(todo))
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.docs_runner", "blocks.json", "results.json"],
        cwd=tmp_path,
        env={**env, "DELAYQ_REDIS_URL": srv.url, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    failed, keys = results["failed"], results["keys"]
    assert failed == {}, "\n\n".join(f"{w}:\n{tb}" for w, tb in failed.items())
    assert set(keys) == {b.where for b in runnable}
    # They ran against the server: each block that schedules at its top level left its tasks.
    schedules = {b.where for b in runnable if re.search(r"^\w+\.schedule(_many)?\(", b.code, re.M)}
    assert len(schedules) > 8
    assert {w for w in schedules if not keys[w]} == set(), keys


@pytest.mark.parametrize("url", [LOCAL_URL])
def test_no_block_reaches_another_redis(url: str) -> None:
    """A runnable block names no server but the one it runs against (LOCAL_URL stands for
    it): no other redis:// URL, host or port."""
    others = [
        b.where for b in ALL if b.runs and re.search(r"rediss?(\+\w+)?://", b.code.replace(url, ""))
    ]
    assert others == []


def test_the_async_testing_examples_run_as_copied_in_pytest_asyncios_strict_mode() -> None:
    """docs/testing.md's async tests and fixtures carry their marks: copied into a project
    without ``asyncio_mode = "auto"`` (this one has it), they still run."""
    async_blocks = [
        b for b in blocks(DOCS / "testing.md") if b.lang == "python" and "async def test_" in b.code
    ]
    assert len(async_blocks) >= 3
    tests = []
    for b in async_blocks:
        source = b.directives["in"]
        tests += [f"{source}::{name}" for name in re.findall(r"async def (test_\w+)", b.code)]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
         "-o", "asyncio_mode=strict", *tests],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0 and f"{len(tests)} passed" in proc.stdout, proc.stdout
