"""``delayq limit``, ``pause``, ``resume`` and what ``info`` shows of the controls, through
click's runner on a real server."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from click.testing import CliRunner, Result

from delayq import Queue
from delayq.embedded import EmbeddedServer

from .test_cli_admin import as_json


@pytest.fixture
def cli(server: EmbeddedServer) -> Callable[..., Result]:
    from delayq.cli.main import main

    def run(*args: str) -> Result:
        env = {"DELAYQ_REDIS_URL": server.url, "DELAYQ_QUEUE": "", "COLUMNS": "200"}
        return CliRunner(env=env).invoke(main, list(args), catch_exceptions=False)

    return run


def test_limit_sets_shows_and_clears_the_rate_limit(
    cli: Callable[..., Result], queue: Queue
) -> None:
    shown = as_json(cli("limit", "-q", queue.name, "--json"))
    assert shown == {"queue": queue.name, "paused": False, "rate_limit": None}
    out = cli("limit", "-q", queue.name, "100/s")
    assert out.exit_code == 0 and out.output == f"{queue.name}: 100/s (burst 100)\n"
    assert as_json(cli("limit", "-q", queue.name, "30/m", "--burst", "5", "--json"))[
        "rate_limit"
    ] == {"rate": "30/m", "per_second": 0.5, "burst": 5}
    assert cli("limit", "-q", queue.name).output == f"{queue.name}: 30/m (burst 5)\n"
    assert queue.rate_limit() is not None
    assert cli("limit", "-q", queue.name, "--clear").output == f"{queue.name}: -\n"
    assert queue.rate_limit() is None


def test_limit_refuses_bad_input_naming_the_forms(cli: Callable[..., Result], queue: Queue) -> None:
    bad = cli("limit", "-q", queue.name, "100/d")
    assert bad.exit_code == 2 and '"N/s", "N/m" or "N/h"' in bad.output
    bad = cli("limit", "-q", queue.name, "10/s", "--burst", "0")
    assert bad.exit_code == 2 and "burst must be an int from 1" in bad.output
    assert cli("limit", "-q", queue.name, "10/s", "--clear").exit_code == 2
    assert cli("limit", "-q", queue.name, "--burst", "3").exit_code == 2
    assert queue.rate_limit() is None


def test_pause_and_resume(cli: Callable[..., Result], queue: Queue) -> None:
    assert cli("pause", "-q", queue.name).output == f"{queue.name}: paused\n"
    assert queue.paused()
    assert as_json(cli("resume", "-q", queue.name, "--json"))["paused"] is False
    assert not queue.paused()


def test_info_shows_the_controls_and_how_far_behind_the_limit_is(
    cli: Callable[..., Result], queue: Queue
) -> None:
    queue.schedule_many([{"kind": "late", "at": time.time() - 30} for _ in range(50)])
    queue.set_rate_limit("10/s")
    queue.pause()
    [q] = as_json(cli("info", "-q", queue.name, "--json"))
    assert q["paused"] is True and q["rate_limit"]["rate"] == "10/s"
    assert q["due"] == 50 and q["throttle_backlog_s"] == 5.0 and q["oldest_due_age"] > 29
    text = cli("info", "-q", queue.name).output
    assert "paused; 10/s (burst 10), 5.0s behind" in text
