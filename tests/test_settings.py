"""A queue's settings live with the queue (delayq/settings.py, protocol 1.1): `delayq
settings` shows and sets them, ``Queue.settings``/``update_settings`` (and AsyncQueue's) read
and store them, every producer follows them (the Python Queue, the worker's dedupe window,
the HTTP API), a process given another value is refused naming both, and a queue with
nothing stored keeps today's defaults."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import redis

from delayq import AsyncQueue, ConfigurationError, Queue, Task, Worker
from delayq.admin.inspect import Admin
from delayq.embedded import EmbeddedServer
from delayq.errors import PayloadTooLarge
from delayq.http import create_app
from delayq.settings import DEFAULTS, parse_size

from .conftest import ROOT, WorkerThread
from .support.helpers import wait_for

TOKEN = "s3cret-token-for-tests"


def cli(server: EmbeddedServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delayq", "settings", "--url", server.url, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def stored_fields(server: EmbeddedServer, qname: str) -> dict[bytes, bytes]:
    r = redis.Redis.from_url(server.url)
    try:
        return dict(r.hgetall(f"dq:{{{qname}}}:shards"))
    finally:
        r.close()


@pytest.fixture
def plain(server: EmbeddedServer, qname: str) -> Iterator[Queue]:
    """A queue opened with no settings given: it follows the queue's."""
    q = Queue(qname, url=server.url)
    yield q
    q.close()


# -- delayq settings ---------------------------------------------------------------------------


def test_cli_sets_then_shows_the_settings_as_text_and_json(
    server: EmbeddedServer, qname: str
) -> None:
    done = cli(
        server, "-q", qname, "--dedupe-window", "1h", "--max-payload", "16KiB", "--allow-empty"
    )
    assert done.returncode == 0, done.stderr
    assert "1h" in done.stdout and "16 KiB (16384 bytes)" in done.stdout
    fields = stored_fields(server, qname)
    assert fields[b"dedupe_ms"] == b"3600000" and fields[b"max_payload"] == b"16384"
    assert b"codec" not in fields  # only what was set
    shown = cli(server, "-q", qname, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {
        "queue": qname,
        "dedupe_window": 3600.0,
        "max_payload": 16384,
        "codec": "json",
        "stored": ["dedupe_window", "max_payload"],
    }
    text = cli(server, "-q", qname).stdout
    assert "codec" in text and "default" in text and "stored with the queue" in text


def test_cli_refuses_a_queue_never_written_unless_allow_empty_to_show_or_set(
    server: EmbeddedServer, qname: str
) -> None:
    """Review of issue 31, item 6: setting (``--max-payload 1000``) wrote to a queue never
    written, a probable typo showing refuses."""
    refused = cli(server, "-q", qname)
    assert refused.returncode == 2 and f"no queue '{qname}'" in refused.stderr
    assert "--allow-empty" in refused.stderr
    empty = cli(server, "-q", qname, "--allow-empty", "--json")
    assert empty.returncode == 0, empty.stderr
    assert json.loads(empty.stdout)["max_payload"] == 64 * 1024
    with Admin(server.url) as admin:
        assert not admin.exists(qname)  # showing wrote nothing
        typo = cli(server, "-q", qname, "--max-payload", "1000")
        assert typo.returncode == 2 and f"no queue '{qname}'" in typo.stderr, typo.stderr
        assert "--allow-empty" in typo.stderr
        assert not admin.exists(qname) and stored_fields(server, qname) == {}
        assert cli(server, "-q", qname, "--codec", "json", "--allow-empty").returncode == 0
        assert admin.exists(qname)  # setting with --allow-empty began it
        assert cli(server, "-q", qname, "--max-payload", "1000").returncode == 0  # known now


def test_cli_refuses_bad_values_with_exit_2_naming_the_option(
    server: EmbeddedServer, qname: str
) -> None:
    bad = cli(server, "-q", qname, "--max-payload", "lots")
    assert bad.returncode == 2 and "--max-payload" in bad.stderr and "16KiB" in bad.stderr
    zero = cli(server, "-q", qname, "--max-payload", "0", "--allow-empty")
    assert zero.returncode == 2 and "max_payload must be a whole number" in zero.stderr
    soon = cli(server, "-q", qname, "--dedupe-window", "soon")
    assert soon.returncode == 2 and "--dedupe-window" in soon.stderr
    assert stored_fields(server, qname) == {}  # nothing written


def test_sizes_as_the_cli_writes_them() -> None:
    assert parse_size("1000") == parse_size("1000B") == 1000
    assert parse_size("16KiB") == parse_size("16K") == 16384
    assert parse_size("1MiB") == 1024**2 and parse_size("2KB") == 2000
    with pytest.raises(ValueError, match=r"cannot read size '1\.5k'"):
        parse_size("1.5k")


# -- Queue.settings / update_settings ----------------------------------------------------------


def test_nothing_stored_is_todays_defaults(plain: Queue, server: EmbeddedServer) -> None:
    s = plain.settings()
    assert s == DEFAULTS and s.stored == ()
    assert (s.dedupe_window, s.max_payload, s.codec) == (24 * 3600.0, 64 * 1024, "json")
    assert plain.schedule("k", "x" * 60_000).status == "created"  # under 64 KiB
    with pytest.raises(PayloadTooLarge, match="limit of 65536"):
        plain.schedule("k", "x" * 70_000)
    assert b"max_payload" not in stored_fields(server, plain.name)  # a write stores none


def test_update_settings_stores_them_and_every_queue_follows_them(
    plain: Queue, server: EmbeddedServer, qname: str
) -> None:
    s = plain.update_settings(max_payload=1000, dedupe_window=60)
    assert (s.max_payload, s.dedupe_window, s.codec) == (1000, 60.0, "json")
    assert s.stored == ("dedupe_window", "max_payload")
    with pytest.raises(PayloadTooLarge, match="limit of 1000"):
        plain.schedule("k", "x" * 1500)  # the queue that set them follows them at once
    with Queue(qname, url=server.url) as other:  # a new process: on its first call
        with pytest.raises(PayloadTooLarge, match="limit of 1000"):
            other.schedule("k", "x" * 1500)
        assert other.settings().max_payload == 1000
    with Queue(qname, url=server.url) as many, pytest.raises(PayloadTooLarge, match="of 1000"):
        many.schedule_many([{"kind": "k", "payload": "x" * 1500}])
    assert plain.stats().scheduled == 0


def test_a_stored_limit_above_the_default_is_followed_on_the_first_call(
    server: EmbeddedServer, qname: str
) -> None:
    with Queue(qname, url=server.url) as setter:
        setter.update_settings(max_payload=256 * 1024)
    with Queue(qname, url=server.url) as q:  # its first call: a payload over 64 KiB
        assert q.schedule("k", "x" * 100_000).status == "created"
    with Queue(qname, url=server.url) as q:
        assert q.schedule_many([{"kind": "k", "payload": "y" * 100_000}])[0].status == "created"


def test_a_constructor_argument_that_disagrees_is_refused_naming_both(
    server: EmbeddedServer, qname: str
) -> None:
    with Queue(qname, url=server.url) as setter:
        setter.update_settings(max_payload=1000, dedupe_window=3600, codec="json")
    with Queue(qname, url=server.url, max_payload=2000) as q:
        with pytest.raises(ConfigurationError) as e:
            q.schedule("k", 1)
        assert "max_payload=1000 bytes" in str(e.value)
        assert "max_payload=2000 bytes" in str(e.value)
        assert "delayq settings" in str(e.value)
    window = pytest.raises(ConfigurationError, match=r"dedupe_window=3600s.+dedupe_window=60s")
    with Queue(qname, url=server.url, dedupe_window=60) as q, window:
        q.get("a")  # a read is refused as well
    codec = pytest.raises(ConfigurationError, match=r"codec='json'.+codec='msgpack'")
    with Queue(qname, url=server.url, codec="msgpack") as q, codec:
        q.settings()
    # The same values given are no disagreement.
    same = Queue(qname, url=server.url, max_payload=1000, dedupe_window=3600, codec="json")
    with same:
        assert same.schedule("k", 1).status == "created"
    assert stored_fields(server, qname)[b"max_payload"] == b"1000"


def test_a_running_producer_keeps_what_it_read_until_it_reads_again(
    plain: Queue, server: EmbeddedServer, qname: str
) -> None:
    assert plain.schedule("k", "x" * 1500).status == "created"  # read: nothing stored
    with Queue(qname, url=server.url) as admin:
        admin.update_settings(max_payload=1000)
    assert plain.schedule("k", "x" * 1500).status == "created"  # kept what it read
    assert plain.settings().max_payload == 1000  # reading them again: followed from now on
    with pytest.raises(PayloadTooLarge, match="limit of 1000"):
        plain.schedule("k", "x" * 1500)


def test_the_worker_follows_the_stored_dedupe_window(
    server: EmbeddedServer, qname: str, run_worker: type[WorkerThread]
) -> None:
    with Queue(qname, url=server.url) as setter:
        setter.update_settings(dedupe_window=1)
    ran: list[str] = []
    worker_queue = AsyncQueue(qname, url=server.url)
    worker = Worker(worker_queue, concurrency=2)

    @worker.handler("k")
    def k(task: Task) -> None:
        ran.append(task.id)

    with Queue(qname, url=server.url) as q, run_worker(worker):
        q.schedule("k", task_id="once")
        wait_for(lambda: ran == ["once"], timeout=10)
        wait_for(lambda: q.get("once") is not None and q.get("once").state == "done")  # type: ignore[union-attr]
        assert q.schedule("k", task_id="once").status == "unchanged"  # within the window
        time.sleep(1.2)  # the stored window (1 s) has passed; the default would be 24 h
        assert q.schedule("k", task_id="once").status == "created"
        wait_for(lambda: ran == ["once", "once"], timeout=10)


async def test_async_queue_reads_stores_and_refuses_the_same_way(
    server: EmbeddedServer, qname: str
) -> None:
    q = AsyncQueue(qname, url=server.url)
    try:
        assert await q.settings() == DEFAULTS
        s = await q.update_settings(max_payload=1000, dedupe_window=7200)
        assert (s.max_payload, s.dedupe_window, s.stored) == (
            1000,
            7200.0,
            ("dedupe_window", "max_payload"),
        )
        with pytest.raises(PayloadTooLarge, match="limit of 1000"):
            await q.schedule("k", "x" * 1500)
    finally:
        await q.close()
    other = AsyncQueue(qname, url=server.url)
    try:
        assert (await other.settings()).max_payload == 1000
        with pytest.raises(PayloadTooLarge, match="limit of 1000"):
            await other.schedule_many([{"kind": "k", "payload": "x" * 1500}])
    finally:
        await other.close()
    given = AsyncQueue(qname, url=server.url, max_payload=500)
    try:
        with pytest.raises(ConfigurationError, match=r"max_payload=1000 bytes.+max_payload=500"):
            await given.schedule("k", 1)
    finally:
        await given.close()


def test_update_settings_refuses_nothing_to_set_and_bad_values(plain: Queue) -> None:
    with pytest.raises(ConfigurationError, match="at least one of"):
        plain.update_settings()
    with pytest.raises(ValueError, match="max_payload must be a whole number"):
        plain.update_settings(max_payload=0)
    with pytest.raises(ValueError, match="unknown payload codec"):
        plain.update_settings(codec="pickle")


# -- the HTTP API ------------------------------------------------------------------------------


@pytest.fixture
async def api(server: EmbeddedServer) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(server.url, token=TOKEN)
    transport = httpx.ASGITransport(app=app)
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://api", headers=headers) as c:
        yield c
    await app.state.api.aclose()


async def test_the_api_refuses_a_payload_over_the_stored_max_payload_with_413(
    api: httpx.AsyncClient, server: EmbeddedServer, qname: str
) -> None:
    assert cli(server, "-q", qname, "--max-payload", "1000", "--allow-empty").returncode == 0
    big = {"kind": "k", "payload": "x" * 1498}  # 1,500 bytes encoded
    r = await api.post(f"/v1/queues/{qname}/tasks", json=big)
    assert r.status_code == 413, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert "1000" in r.json()["detail"] and "1500" in r.json()["detail"]
    assert "until restarted" in r.json()["detail"]  # (review 31: the API keeps what it read)
    r = await api.post(f"/v1/queues/{qname}/tasks/batch", json={"tasks": [{"kind": "k"}, big]})
    assert r.status_code == 413, r.text
    assert "1000" in r.json()["detail"] and "until restarted" in r.json()["detail"]
    ok = await api.post(f"/v1/queues/{qname}/tasks", json={"kind": "k", "payload": "x" * 900})
    assert ok.status_code == 201, ok.text


def _script_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def test_the_settings_cost_no_round_trip_of_their_own_and_nothing_per_schedule(
    server: EmbeddedServer, qname: str
) -> None:
    """Read with the shard count on the first call (shards.lua's reply), never per call."""
    with Queue(qname, url=server.url) as setter:
        setter.update_settings(max_payload=1000)
        setter.schedule("k", 1)  # every script the queue uses is loaded on the server
    r = redis.Redis.from_url(server.url)
    try:
        with Queue(qname, url=server.url) as q:
            before = _script_calls(r)
            for i in range(50):
                q.schedule("k", i, delay=60)
            after = _script_calls(r)
            assert q.core.max_payload == 1000  # (the settings were read: followed)
        assert after - before == 1 + 50  # the shard check once, then one call per task
    finally:
        r.close()
