"""What a release would ship, built and installed as a user would install it: the sdist and
the wheel from ``python -m build``, checked by ``twine check``, and the wheel alone installed
into a fresh virtual environment, where ``delayq --help`` runs and a worker runs the tasks a
queue schedules on a real server (its Lua scripts and package data are in the wheel).

Until the first release (docs/getting-started.md) this is how delayq is installed from a
wheel; CI (``.ci/run``) runs it with the rest of the suite, with ``DELAYQ_REQUIRE_BROWSER=1``
(tests/support/require_browser.py, checked here too).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from delayq.embedded import EmbeddedServer

from .conftest import ROOT

SMOKE = textwrap.dedent(
    """
    import asyncio
    import sys

    import delayq
    from delayq import Queue, Task, Worker

    assert delayq.__file__.startswith(sys.prefix), delayq.__file__  # the wheel's, not ROOT's
    queue = Queue("smoke", url=sys.argv[1])
    worker = Worker(queue, concurrency=2)
    seen = []

    @worker.handler("hello")
    async def hello(task: Task) -> None:
        seen.append(task.payload["n"])
        if len(seen) == 2:
            worker.stop()

    queue.schedule("hello", {"n": 1}, delay=0.2)
    queue.schedule("hello", {"n": 2}, task_id="second")
    asyncio.run(asyncio.wait_for(worker.serve(), 30))
    assert seen == [2, 1], seen
    info = queue.get("second")
    assert info is not None and info.state == "done", info
    print("smoke ok")
    """
)


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{args}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def clean_copy(to: Path) -> Path:
    """The checkout's files as a fresh clone has them (tracked, and new ones not ignored):
    a build in the checkout itself would reuse a stale ``delayq.egg-info``, whose file list
    can carry files the package data no longer names."""
    listed = run(
        "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT
    ).split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)
    return to


def test_the_wheel_alone_installs_schedules_and_runs_in_a_fresh_venv(
    tmp_path: Path, make_server: Callable[..., EmbeddedServer]
) -> None:
    dist = tmp_path / "dist"
    source = clean_copy(tmp_path / "src")
    run(sys.executable, "-m", "build", "--outdir", dist, source, cwd=tmp_path)
    wheels = sorted(dist.glob("delayq-*.whl"))
    sdists = sorted(dist.glob("delayq-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(dist.iterdir())
    checked = run(
        sys.executable, "-m", "twine", "check", "--strict", *wheels, *sdists, cwd=tmp_path
    )
    assert checked.count("PASSED") == 2, checked

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    bin_ = venv / "bin"
    # Nothing of the checkout on the path: the venv's own interpreter, in another directory.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_}{os.pathsep}{env.get('PATH', '')}"
    run(bin_ / "pip", "install", "--quiet", wheels[0], cwd=tmp_path, env=env)

    assert "delayq: reliable delayed tasks" in run(bin_ / "delayq", "--help", cwd=tmp_path, env=env)
    srv = make_server()
    script = tmp_path / "smoke.py"
    script.write_text(SMOKE)
    assert "smoke ok" in run(bin_ / "python", script, srv.url, cwd=tmp_path, env=env)
    shown = run(
        bin_ / "delayq", "info", "-q", "smoke", "--url", srv.url, "--json", cwd=tmp_path, env=env
    )
    assert '"scheduled": 0' in shown and '"queue": "smoke"' in shown


BROWSER_TESTS = textwrap.dedent(
    """
    import pytest

    def test_in_a_browser():
        pytest.skip("/usr/bin/chromium is missing: apt-get install chromium")

    @pytest.mark.skipif(True, reason="Debian's chromium is not at /usr/bin/chromium")
    def test_marked():
        pass

    def test_elsewhere():
        pytest.skip("no PostgreSQL on 127.0.0.1:5432")
    """
)


def test_ci_fails_a_browser_test_skipped_for_want_of_chromium(tmp_path: Path) -> None:
    (tmp_path / "test_browser.py").write_text(BROWSER_TESTS)

    def pytest_run(**env: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "tests.support.require_browser",
             "-p", "no:cacheprovider", "-q", "-rA", "test_browser.py"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            capture_output=True,
            text=True,
            timeout=120,
        )  # fmt: skip
        return proc.stdout + proc.stderr

    assert "3 skipped" in pytest_run(DELAYQ_REQUIRE_BROWSER="")
    required = pytest_run(DELAYQ_REQUIRE_BROWSER="1")
    # A skip at setup (a skipif mark, a fixture's skip) becomes an error, one in the test a
    # failure: the run fails either way.
    assert "1 failed, 1 skipped, 1 error" in required, required
    assert "apt-get install chromium" in required and "DELAYQ_REQUIRE_BROWSER" in required


def test_ci_runs_exactly_the_readmes_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^```bash\n(.*?)\n```", readme, re.M | re.S)
    [test_command] = [c for c in commands if "pytest" in c]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == test_command  # the rest of .ci/run installs what the suite needs
    assert "DELAYQ_REQUIRE_BROWSER=1 pytest" in test_command
