"""delayq.contrib.django: its own tests (tests/django_site) and the example project's
(examples/django_orders), each a pytest-django run of its own, on PostgreSQL and a private
delayq server; and the one-line refusal without the extra.

Each project is run in a child process, as its users run it, rather than in this one:
pytest-django configures Django for a whole pytest session from one settings module, and the
rest of the suite has none (pyproject's addopts keep pytest-django out of it: ``-p
no:django``). Both skip, saying why, when no PostgreSQL answers on 127.0.0.1:5432.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.slow

PROJECTS = {
    "contrib": ROOT / "tests" / "django_site",
    "example": ROOT / "examples" / "django_orders",
}


def _postgres_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=0.5):
            return True
    except OSError:
        return False


def pytest_in(project: Path, *args: str) -> str:
    """``python -m pytest ARGS`` run in ``project`` (its pytest.ini and settings)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "DJANGO_", "PG")) and k != "PYTHONPATH"
    }
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=580,
    )
    return out.stdout + out.stderr


def summary(output: str) -> dict[str, int]:
    """pytest's summary line, ``5 passed, 1 failed in 0.41s``, as {"passed": 5, "failed": 1}."""
    lines = re.findall(r"^=*\s*(\d+ \w+(?:, \d+ \w+)*) in [\d.]+s", output, re.M)
    assert len(lines) == 1, output
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", lines[0])}


@pytest.mark.timeout(600)
@pytest.mark.skipif(not _postgres_up(), reason="no PostgreSQL on 127.0.0.1:5432")
@pytest.mark.parametrize("name", list(PROJECTS))
def test_the_django_tests_pass_on_postgresql(name: str) -> None:
    project = PROJECTS[name]
    collected = pytest_in(project, "--collect-only")
    count = len(re.findall(r"^\S+\.py::.+$", collected, re.M))
    assert count >= 8, collected
    output = pytest_in(project)
    assert summary(output) == {"passed": count}, output


def test_without_the_extra_the_import_names_the_pip_command() -> None:
    code = (
        "import sys; sys.modules['django'] = None\n"
        "try:\n"
        "    import delayq.contrib.django\n"
        "except ImportError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == (
        "MissingExtra delayq.contrib.django needs the django extra: pip install 'delayq[django]'"
    )
