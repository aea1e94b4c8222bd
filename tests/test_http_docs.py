"""``/docs``, the HTTP API's interactive page (Swagger UI from the swagger-ui-bundle
package): over plain HTTP, what it serves and that nothing in the page points elsewhere; in
a real headless Chromium against ``delayq api``, that it lists the operations and that
"Try it out" with the token schedules a task."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
import pytest

from delayq import Queue
from delayq.embedded import EmbeddedServer, free_port
from delayq.http import create_app

from .conftest import ROOT
from .test_dashboard import CHROMIUM, CHROMIUM_ARGS

TOKEN = "s3cret-token-for-the-docs-page"
PROBLEM = "application/problem+json"
LINKS = re.compile(r'(?:src|href)="([^"]*)"')


@pytest.fixture
async def client(server: EmbeddedServer) -> AsyncIterator[httpx.AsyncClient]:
    """The API with no token sent: the page and its files need none."""
    app = create_app(server.url, token=TOKEN)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
        yield c
    await app.state.api.aclose()


async def test_the_page_and_its_files_answer_without_a_token_and_name_no_other_site(
    client: httpx.AsyncClient,
) -> None:
    r = await client.get("/docs")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert r.headers["cache-control"] == "no-cache"
    policy = r.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert "connect-src 'self'" in policy and "http" not in policy
    html = r.text
    assert "//" not in html.replace("<!DOCTYPE html>", "")  # no URL of another site
    links = LINKS.findall(html)
    assert len(links) == 5 and all(link.startswith("docs/") for link in links), links
    want = {
        ".js": "text/javascript; charset=utf-8",
        ".css": "text/css; charset=utf-8",
        ".png": "image/png",
    }
    for link in links:
        got = await client.get(f"/{link}")
        assert got.status_code == 200, link
        assert got.headers["content-type"] == want[Path(link).suffix], link
        assert got.headers["x-content-type-options"] == "nosniff"
        assert int(got.headers["content-length"]) == len(got.content) > 0
        if link == "docs/init.js":  # ours: checked again on each load
            assert got.headers["cache-control"] == "no-cache"
            assert "https:" not in got.text and "http:" not in got.text
            assert 'new URL("openapi.json", base)' in got.text and "validatorUrl: null" in got.text
        else:  # Swagger UI's, under a path that names its version
            assert re.fullmatch(r"docs/swagger-ui-\d+\.\d+\.\d+/[\w.-]+", link), link
            assert got.headers["cache-control"] == "public, max-age=31536000, immutable"
    bundle = next(link for link in links if link.endswith("swagger-ui-bundle.js"))
    assert len((await client.get(f"/{bundle}")).content) > 500_000  # the real one
    head = await client.head(f"/{bundle}")
    assert head.status_code == 200 and head.content == b""
    # The document the page loads is public, as it was.
    assert (await client.get("/openapi.json")).status_code == 200


async def test_docs_paths_it_does_not_serve(client: httpx.AsyncClient) -> None:
    r = await client.get("/docs/")
    assert r.status_code == 308 and r.headers["location"] == "../docs"
    page = (await client.get("/docs")).text
    folder = re.search(r"docs/(swagger-ui-[\d.]+)/", page)
    assert folder is not None
    for path in (
        "/docs/nope.js",
        f"/docs/{folder.group(1)}/index.html",  # the package's, not the page's
        f"/docs/{folder.group(1)}/..%2Fswagger-ui-bundle.js",
        "/docs/swagger-ui-0.0.1/swagger-ui-bundle.js",  # another version: not here
        f"/docs/{folder.group(1)}/swagger-ui.css/more",
    ):
        r = await client.get(path)
        assert r.status_code == 404, path
        assert r.headers["content-type"] == PROBLEM
        assert "/docs" in r.json()["detail"], path
    r = await client.post("/docs")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
    r = await client.get("/nowhere")
    assert "/docs" in r.json()["detail"]


async def test_the_page_works_where_the_api_is_mounted(server: EmbeddedServer) -> None:
    """Its links are relative: under app.mount("/delayq", ...), they resolve under /delayq."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    api = create_app(server.url, token=TOKEN)
    outer = Starlette(routes=[Mount("/delayq", app=api)])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=outer), base_url="http://app"
    ) as c:
        page = await c.get("/delayq/docs")
        assert page.status_code == 200, page.text
        for link in LINKS.findall(page.text):
            url = urljoin("http://app/delayq/docs", link)
            assert url.startswith("http://app/delayq/docs/"), url
            assert (await c.get(url)).status_code == 200, url
        assert (await c.get(urljoin("http://app/delayq/docs", "openapi.json"))).status_code == 200
    await api.state.api.aclose()


# -- in a real browser, against delayq api -----------------------------------------------------


@pytest.fixture
def api_process(server: EmbeddedServer, tmp_path: Path) -> Iterator[str]:
    """``delayq api`` as a real process on a free port; its base URL."""
    port = free_port()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    log = tmp_path / "api.log"
    token, quiet = ["--token-file", str(token_file)], ["--log-level", "warning"]
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "delayq", "api", "--port", str(port), *token, *quiet],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "DELAYQ_REDIS_URL": server.url},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "delayq api did not start"
            time.sleep(0.1)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def browser_page() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        context = chromium.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(15_000)
        yield page
        context.close()
        chromium.close()


def test_the_page_lists_the_operations_and_try_it_out_schedules_a_task_with_the_token(
    api_process: str, browser_page: Any, server: EmbeddedServer, qname: str
) -> None:
    from playwright.sync_api import expect

    page, base = browser_page, api_process
    requested: list[str] = []
    problems: list[str] = []
    page.on("request", lambda req: requested.append(req.url))
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(f"{base}/docs")

    # Every operation of the document is listed, by its summary.
    doc = httpx.get(f"{base}/openapi.json", timeout=10).json()
    summaries = [op["summary"] for ops in doc["paths"].values() for op in ops.values()]
    expect(page.locator(".opblock")).to_have_count(len(summaries))
    shown = page.locator(".opblock-summary-description").all_inner_texts()
    assert sorted(shown) == sorted(summaries)

    # Authorize with the API's token (the bearer scheme of the document).
    page.locator("button.authorize").first.click()
    page.locator(".modal-ux input").fill(TOKEN)
    page.locator(".modal-ux button.modal-btn.auth.authorize").click()
    page.locator(".modal-ux button.btn-done").click()

    # Schedule a task through "Try it out" on POST /v1/queues/{queue}/tasks.
    op = page.locator(".opblock-post", has_text="Schedule a task.")
    op.locator(".opblock-summary").click()
    op.locator("button.try-out__btn").click()
    op.locator("tr[data-param-name='queue'] input").fill(qname)
    body = {"kind": "order.close", "payload": {"order": 42}, "delay": 3600, "id": "from-docs"}
    op.locator("textarea.body-param__text").fill(json.dumps(body))
    op.locator("button.execute").click()
    status = op.locator(".live-responses-table tbody .response-col_status").first
    expect(status).to_have_text("201")
    answer = json.loads(op.locator(".live-responses-table tbody .microlight").first.inner_text())
    assert answer["id"] == "from-docs" and answer["status"] == "created"

    with Queue(qname, url=server.url) as q:
        info = q.get("from-docs")
        assert info is not None and info.state == "scheduled"
        assert (info.kind, info.payload) == ("order.close", {"order": 42})
    # Nothing came from anywhere but the API, and the page raised nothing.
    assert requested and all(url.startswith(base + "/") for url in requested), requested
    assert not problems, problems
