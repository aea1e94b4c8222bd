"""``delayq limit``, ``pause``, ``resume`` and what ``info`` shows of the controls, through
click's runner on a real server; the dashboard's pause and resume buttons over HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from click.testing import CliRunner, Result

from delayq import Queue
from delayq.embedded import EmbeddedServer

from .support.dashboard_helpers import DashboardThread
from .test_cli_admin import as_json
from .test_dashboard import BEARER, csrf_of


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
    assert bad.exit_code == 2 and "burst must be a whole number from 1" in bad.output
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


def test_the_dashboard_pauses_and_resumes_with_the_token_and_csrf(
    server: EmbeddedServer, queue: Queue
) -> None:
    queue.set_rate_limit("5/s")
    page = f"/queues/{queue.name}"
    with (
        DashboardThread(server.url, [queue.name]) as base,
        httpx.Client(base_url=base, timeout=10) as http,
    ):
        assert http.post(f"{page}/pause").status_code == 401  # no token
        http.headers.update(BEARER)
        html = http.get(page).text
        assert "5/s (burst 5)" in html and f'action="{page}/pause"' in html
        csrf = csrf_of(html)
        assert http.post(f"{page}/pause").status_code == 403  # no CSRF token
        evil = {"origin": "https://evil.example"}
        assert http.post(f"{page}/pause", data={"csrf": csrf}, headers=evil).status_code == 403
        assert not queue.paused()
        done = http.post(f"{page}/pause", data={"csrf": csrf, "next": page})
        assert done.status_code == 303 and "paused" in done.headers["location"]
        assert queue.paused()
        html = http.get(page).text
        assert f'action="{page}/resume"' in html and "paused; 5/s" in html
        assert "paused" in http.get("/api/queues").json()[0]["controls"]
        assert http.post(f"{page}/resume", data={"csrf": csrf}).status_code == 303
        assert not queue.paused()
    with (
        DashboardThread(server.url, [queue.name], read_only=True) as base,
        httpx.Client(base_url=base, timeout=10, headers=BEARER) as http,
    ):
        assert f'action="{page}/pause"' not in http.get(page).text
        assert http.post(f"{page}/pause", data={"csrf": csrf}).status_code == 403
        assert not queue.paused()
