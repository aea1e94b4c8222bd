"""The dashboard: its security rules over plain HTTP, and its pages in a real headless
Chromium (Debian's ``chromium`` driven by Playwright)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from delayq import Fail, Queue, Retry, Worker
from delayq.embedded import EmbeddedServer
from delayq.errors import ConfigurationError

from .conftest import ROOT, WorkerThread
from .support.dashboard_helpers import TOKEN, DashboardThread
from .support.helpers import wait_for

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
SCREENSHOT = ROOT / "docs" / "dashboard.png"
XSS = "<script>window.__pwned = 1</script><img src=x onerror=window.__pwned=2>"
BEARER = {"Authorization": f"Bearer {TOKEN}"}

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's chromium is not at /usr/bin/chromium: apt-get install chromium "
    "(.ci/run installs it)",
)


def bury(queue: Queue, run_worker: Callable[[Worker], WorkerThread], n: int) -> list[str]:
    ids = queue.schedule_many([{"kind": "bad", "payload": {"n": i}} for i in range(n)])
    worker = Worker(queue, concurrency=4, lease=5)

    @worker.handler("bad")
    def bad(task: Any) -> None:
        raise Fail(f"card declined for order {task.payload['n']}")

    with run_worker(worker):
        wait_for(lambda: queue.stats().dead == n)
    return ids


@pytest.fixture
def dashboard(server: EmbeddedServer, queue: Queue) -> Iterator[str]:
    with DashboardThread(server.url, [queue.name]) as base:
        yield base


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert m, "no CSRF field on the page"
    return m.group(1)


# -- security, over plain HTTP --------------------------------------------------------------


def test_every_path_needs_the_token(dashboard: str, queue: Queue) -> None:
    paths = [
        "/",
        "/api/queues",
        f"/api/queues/{queue.name}/history",
        "/metrics",
        "/static/app.js",
        f"/queues/{queue.name}/dead",
    ]
    with httpx.Client(base_url=dashboard, timeout=10) as http:
        for path in paths:
            r = http.get(path)
            assert r.status_code == 401, path
            assert "token required" in r.text and r.headers["www-authenticate"].startswith("Bearer")
        assert http.get("/", headers={"Authorization": "Bearer wrong-token"}).status_code == 401
        assert http.get("/?token=wrong-token").status_code == 401
        post = http.post(f"/queues/{queue.name}/dead/replay", data={"all": "1"})
        assert post.status_code == 401
        for path in paths:
            assert http.get(path, headers=BEARER).status_code == 200, path


def test_token_in_the_url_once_sets_an_httponly_cookie(dashboard: str, queue: Queue) -> None:
    with httpx.Client(base_url=dashboard, timeout=10) as http:
        r = http.get(f"/queues/{queue.name}/dead?offset=0&token={TOKEN}")
        assert r.status_code == 303
        assert r.headers["location"] == f"/queues/{queue.name}/dead?offset=0"  # token gone
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and TOKEN not in cookie
        page = http.get("/")  # the client keeps the cookie
        assert page.status_code == 200 and queue.name in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-frame-options"] == "DENY"


def test_actions_need_the_csrf_token_and_the_same_origin(
    dashboard: str, queue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    [dead_id] = bury(queue, run_worker, 1)
    action = f"/queues/{queue.name}/dead/replay"
    with httpx.Client(base_url=dashboard, timeout=10, headers=BEARER) as http:
        csrf = csrf_of(http.get(f"/queues/{queue.name}/dead").text)
        assert http.post(action, data={"id": dead_id}).status_code == 403
        assert http.post(action, data={"id": dead_id, "csrf": "0" * 64}).status_code == 403
        evil = {"origin": "https://evil.example"}
        assert (
            http.post(action, data={"id": dead_id, "csrf": csrf}, headers=evil).status_code == 403
        )
        assert queue.stats().dead == 1
        ok = http.post(action, data={"id": dead_id, "csrf": csrf, "next": "//evil.example/x"})
        assert ok.status_code == 303
        assert ok.headers["location"].startswith(f"/queues/{queue.name}?msg=replayed")
    info = queue.get(dead_id)
    assert info is not None and info.state == "scheduled"


# Each would take the browser to another site if followed as given: browsers drop tabs and
# newlines anywhere in a URL (and C0 controls and spaces around it), and read a backslash
# as a slash; urlsplit drops the tab too, after a check for "//" has passed.
OFF_SITE = [
    "//evil.example/x",
    "/\t/evil.example",
    "/\n/evil.example",
    "/\r/evil.example",
    "\t//evil.example",
    "/\\evil.example",
    "\\\\evil.example",
    "/\t\\evil.example",
    "/ /evil.example",
    "/\x00/evil.example",
    "/\x7f/evil.example",
    "https://evil.example/",
    "http:/evil.example",
    "javascript:alert(1)",
    "evil.example",
    "",
    " /queues",
]
SAME_SITE = ["/", "/queues/x/dead?after=abc", "/%2F/evil.example", "/%09/evil.example"]


def test_an_action_goes_back_only_to_a_path_of_this_site(dashboard: str, queue: Queue) -> None:
    """Finding 7 of issue 28: next=/\t/evil.example redirected to //evil.example."""
    action = f"/queues/{queue.name}/pause"
    with httpx.Client(base_url=dashboard, timeout=10, headers=BEARER) as http:
        csrf = csrf_of(http.get(f"/queues/{queue.name}").text)
        for target in OFF_SITE:
            r = http.post(action, data={"csrf": csrf, "next": target})
            assert r.status_code == 303, target
            assert r.headers["location"].startswith(f"/queues/{queue.name}?msg="), (
                target,
                r.headers["location"],
            )
        for target in SAME_SITE:
            r = http.post(action, data={"csrf": csrf, "next": target})
            path = r.headers["location"].split("?", 1)[0]
            assert path == target.split("?", 1)[0], (target, r.headers["location"])
    queue.resume()


def test_a_blank_token_is_refused_and_spaces_around_one_are_dropped(
    server: EmbeddedServer, queue: Queue
) -> None:
    """Issue 28, as for the API's token: all whitespace was accepted; spaces around a token
    made one no header could match."""
    with pytest.raises(ConfigurationError, match="only whitespace"):
        DashboardThread(server.url, [queue.name], token=" " * 12)
    with DashboardThread(server.url, [queue.name], token=f"  {TOKEN}\t") as base:
        assert httpx.get(f"{base}/", headers=BEARER, timeout=10).status_code == 200
        r = httpx.get(f"{base}/?token={TOKEN}", timeout=10)
        assert r.status_code == 303 and "delayq_session" in r.headers["set-cookie"]


def _dashboard_cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "delayq", "dashboard", "--port", "0", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_delayq_dashboard_refuses_a_blank_token() -> None:
    proc = _dashboard_cli("--url", "redis://127.0.0.1:1/0", "--token", " " * 12)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "only whitespace" in err and "--token" in err


def test_delayq_dashboard_shares_the_api_s_bounds_on_slow_clients(
    server: EmbeddedServer, queue: Queue
) -> None:
    """The dashboard is served as the API is (delayq/web/serve.py): its URL said once it
    listens, and a client that sends nothing is answered 408 and closed."""
    proc = _dashboard_cli(
        "--url", server.url, "-q", queue.name, "--token", TOKEN, "--header-timeout", "2"
    )
    try:
        assert proc.stdout is not None
        line = ""
        while not line.startswith("open "):
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
        base = line.split()[1].split("/?")[0]
        host, port = base.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=15) as sock:  # no retry
            t0 = time.monotonic()
            got = b""
            while chunk := sock.recv(65536):
                got += chunk
            took = time.monotonic() - t0
        assert 1.5 < took < 10 and got.startswith(b"HTTP/1.1 408 "), (took, got)
        assert b"--header-timeout" in got
        assert httpx.get(f"{base}/", headers=BEARER, timeout=10).status_code == 200
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=10)


def test_read_only_mode_shows_no_buttons_and_refuses_actions(
    server: EmbeddedServer, queue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    [dead_id] = bury(queue, run_worker, 1)
    with (
        DashboardThread(server.url, [queue.name], read_only=True) as base,
        httpx.Client(base_url=base, timeout=10, headers=BEARER) as http,
    ):
        page = http.get(f"/queues/{queue.name}/dead")
        assert "read-only" in page.text and 'method="post"' not in page.text
        assert dead_id in page.text
        refused = http.post(f"/queues/{queue.name}/dead/purge", data={"all": "1"})
        assert refused.status_code == 403
        assert http.get("/queues/not-shown").status_code == 404
        bad = http.get(f"/queues/{queue.name}/dead?after=not-a-cursor")
        assert bad.status_code == 400 and "not a page cursor" in bad.text  # the user's mistake
    assert queue.stats().dead == 1


# -- in a real browser ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10_000)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.accept()))
    page.dialogs = dialogs
    yield page
    context.close()


@needs_chromium
def test_overview_loads_and_its_counts_stay_live(dashboard: str, queue: Queue, page: Any) -> None:
    from playwright.sync_api import expect

    queue.schedule_many([{"kind": "later", "delay": 600} for _ in range(2)])
    response = page.goto(f"{dashboard}/?token={TOKEN}")
    assert response.status == 200 and page.url == f"{dashboard}/"
    expect(page.locator("h1")).to_have_text("Queues")
    cell = page.locator(f'td[data-q="{queue.name}"][data-f="scheduled"]')
    expect(cell).to_have_text("2")
    queue.schedule("later", delay=600)
    expect(cell).to_have_text("3")  # the page's script polls /api/queues


@needs_chromium
def test_replaying_a_dead_task_by_clicking(
    dashboard: str, queue: Queue, page: Any, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    from playwright.sync_api import expect

    first, second = bury(queue, run_worker, 2)
    page.goto(f"{dashboard}/queues/{queue.name}/dead?token={TOKEN}")
    row = page.locator("tr", has_text=first)
    expect(row).to_contain_text("card declined for order 0")
    row.get_by_role("button", name="Replay").click()
    expect(page.locator(".flash")).to_have_text("replayed 1 task(s)")
    replayed = queue.get(first)
    assert replayed is not None and replayed.state == "scheduled"
    assert queue.stats().dead == 1
    page.get_by_role("button", name="Delete all").click()  # asks first; the test accepts
    expect(page.locator(".flash")).to_have_text("deleted 1 dead task(s)")
    assert page.dialogs == ["Delete all 1 dead tasks for good?"]
    assert queue.get(second) is None


def _values(chart: Any, css: str) -> list[int]:
    """The values of a chart's bars of one class, read from their titles ("8 done, ...")."""
    rects = chart.locator(f"rect.{css}")
    out = []
    for i in range(rects.count()):
        rect = rects.nth(i)
        assert float(rect.get_attribute("height")) > 0
        out.append(int(rect.locator("title").text_content().split()[0]))
    return out


@needs_chromium
def test_the_queue_page_charts_its_history(
    dashboard: str, queue: Queue, page: Any, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    """Issue 32 item 8: a worker runs tasks, some retried and some dead; the queue's page
    charts them per minute (done, retried, dead stacked) with their start lateness p50 and
    p99, and /api/queues/<name>/history says the same."""
    from playwright.sync_api import expect

    failed: set[str] = set()
    worker = Worker(queue, concurrency=4, lease=10)

    @worker.handler("ok")
    def ok(task: Any) -> None:
        return None

    @worker.handler("flaky")
    def flaky(task: Any) -> None:
        if task.id not in failed:
            failed.add(task.id)
            raise Retry(after=0.05)

    @worker.handler("bad", max_attempts=1)
    def bad(task: Any) -> None:
        raise Fail("card declined")

    queue.schedule_many(
        [{"kind": "ok"} for _ in range(6)]
        + [{"kind": "flaky"} for _ in range(2)]
        + [{"kind": "bad"}]
    )
    with run_worker(worker):
        wait_for(lambda: (s := queue.stats()).done == 8 and s.dead == 1)
        wait_for(lambda: queue.stats().active == 0)
    page.goto(f"{dashboard}/queues/{queue.name}?token={TOKEN}")
    outcomes = page.get_by_role("img", name="tasks done, retried and dead per interval")
    expect(outcomes.locator("rect.ok").first).to_be_visible()
    assert sum(_values(outcomes, "ok")) == 8
    assert sum(_values(outcomes, "warn")) == 2
    assert sum(_values(outcomes, "overdue")) == 1
    lateness = page.get_by_role("img", name="start lateness p50 and p99 per interval")
    p99 = lateness.locator("rect.warn")
    assert p99.count() >= 1 and "p99 ≤" in p99.first.locator("title").text_content()
    assert sum(_values(lateness, "warn")) == 11  # the starts behind each interval's bar
    expect(page.locator("section.history")).to_contain_text("8 done, 2 retried, 1 dead")
    page.goto(f"{dashboard}/queues/{queue.name}?history=24h")
    assert sum(_values(outcomes, "ok")) == 8
    got = page.request.get(f"{dashboard}/api/queues/{queue.name}/history").json()
    assert got["queue"] == queue.name and got["minutes"]
    total = {f: sum(m[f] for m in got["minutes"]) for f in ("done", "retried", "dead", "started")}
    assert total == {"done": 8, "retried": 2, "dead": 1, "started": 11}
    assert all(0 < m["lateness_p50"] <= m["lateness_p99"] < 60 for m in got["minutes"])


@needs_chromium
def test_a_request_without_the_token_is_refused(dashboard: str, page: Any) -> None:
    response = page.goto(f"{dashboard}/")
    assert response.status == 401
    assert "token required" in page.content()
    assert page.goto(f"{dashboard}/?token=not-the-token").status == 401


@needs_chromium
def test_a_payload_with_script_is_shown_as_text(
    dashboard: str, queue: Queue, page: Any, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    from playwright.sync_api import expect

    queue.schedule("later", {"note": XSS}, task_id="xss-waiting", delay=600)
    page.goto(f"{dashboard}/task?id=xss-waiting&token={TOKEN}")
    expect(page.locator("pre.payload")).to_contain_text(XSS)
    page.goto(f"{dashboard}/queues/{queue.name}")
    expect(page.locator("td.payload").first).to_contain_text("<script>")
    page.goto(f"{dashboard}/task?id={'<script>alert(1)</script>'}")
    expect(page.locator(".lookup input")).to_have_value("<script>alert(1)</script>")
    assert page.evaluate("window.__pwned") is None
    assert page.dialogs == []


@needs_chromium
def test_screenshot_of_a_busy_queue(
    make_server: Callable[..., EmbeddedServer],
    page: Any,
    run_worker: Callable[[Worker], WorkerThread],
    tmp_path: Path,
) -> None:
    """A picture for docs/: written when missing, or with DELAYQ_SCREENSHOT=1."""
    srv = make_server(appendonly=False)
    with Queue("orders", url=srv.url) as queue:
        now = time.time()
        queue.schedule_many(
            [{"kind": "order.close", "payload": {"order_id": 100 + i}, "delay": i * 0.01}
             for i in range(120)]
            + [{"kind": "order.close", "payload": {"order_id": 500 + i},
                "at": now + 30 + (i * 37) % 3500} for i in range(400)]
            + [{"kind": "order.close", "payload": {"order_id": 900 + i, "fail": True}}
               for i in range(3)]
        )  # fmt: skip
        worker = Worker(queue, concurrency=8, lease=30)

        @worker.handler("order.close", max_attempts=1)
        def close(task: Any) -> None:
            time.sleep(0.002 * (task.payload["order_id"] % 7))
            if task.payload.get("fail"):
                raise RuntimeError(
                    f"payment service timed out for order {task.payload['order_id']}"
                )

        with run_worker(worker), DashboardThread(srv.url, ["orders"]) as base:
            wait_for(lambda: (s := queue.stats()).done == 120 and s.dead == 3)
            page.goto(f"{base}/queues/orders?token={TOKEN}")
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("DELAYQ_SCREENSHOT") == "1" or not SCREENSHOT.exists():
        SCREENSHOT.write_bytes(shot.read_bytes())


def test_cron_page_lists_the_schedules(dashboard: str, queue: Queue, run_worker: Any) -> None:
    from delayq import Worker
    from delayq.cron.schedules import every_schedule

    worker = Worker(queue)
    worker.every(hours=1, name="hourly-sweep")(lambda task: None)
    with run_worker(worker):
        wait_for(lambda: queue.client.hlen(queue.core.keys.cron) == 1)
    with httpx.Client(base_url=dashboard, timeout=10, headers=BEARER) as http:
        r = http.get(f"/queues/{queue.name}/cron")
    assert r.status_code == 200
    assert "hourly-sweep" in r.text and "no schedules" not in r.text
    assert f"<code>{every_schedule('x', 3_600_000).timing.describe()}</code>" in r.text
