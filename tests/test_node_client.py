"""The reference Node producer (clients/node) against a real server and a Python worker:
what Node schedules runs once, on time; what it cancels never runs; sharded queues route
alike in both languages; the protocol version is checked as the Python producer checks it.

Needs ``node`` and ``npm`` (``.ci/run`` installs them): the session runs ``npm ci`` in
clients/node when its node_modules is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from delayq import ConfigurationError, Queue, Task, Worker
from delayq.embedded import EmbeddedServer
from delayq.keys import shard_of
from delayq.leasing import claim
from delayq.protocol.version import PROTOCOL_VERSION
from delayq.runner import SyncRunner

from .support.helpers import wait_for

NODE_DIR = Path(__file__).resolve().parent.parent / "clients" / "node"


@pytest.fixture(scope="session")
def node() -> str:
    """The node binary, with the client's dependencies installed (``npm ci``)."""
    binary, npm = shutil.which("node"), shutil.which("npm")
    if binary is None or npm is None:
        pytest.fail(
            "the Node client's tests need node and npm on PATH: install them "
            "(apt-get install nodejs npm, as .ci/run does) and run the tests again"
        )
    if not (NODE_DIR / "node_modules" / "redis").is_dir():
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, f"npm ci in {NODE_DIR} failed:\n{done.stderr}"
    return binary


def run_node(node: str, url: str, body: str) -> Any:
    """Run ``body`` inside an async function with ``delayq`` (the client) in scope; what it
    returns comes back as JSON. A rejection fails the test with Node's stderr."""
    script = (
        f"const delayq = require({json.dumps(str(NODE_DIR))});\n"
        f"(async () => {{ {body} }})().then(\n"
        "  (out) => { process.stdout.write(JSON.stringify(out === undefined ? null : out)); },\n"
        "  (err) => { console.error(err && err.stack || err); process.exit(1); });\n"
    )
    done = subprocess.run(
        [node, "-e", script],
        env={**os.environ, "DELAYQ_REDIS_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"node failed:\n{done.stderr}"
    return json.loads(done.stdout)


def _keys(url: str, qname: str) -> set[bytes]:
    r = redis.Redis.from_url(url)
    try:
        return {k for k in r.scan_iter(match="dq:{*") if k.decode().startswith(f"dq:{{{qname}")}
    finally:
        r.close()


@pytest.mark.parametrize("shards", [1, 4])
def test_node_schedules_and_cancels_and_a_python_worker_runs_the_rest_once_on_time(
    node: str, server: EmbeddedServer, qname: str, run_worker: Any, shards: int
) -> None:
    queue = Queue(qname, url=server.url, shards=shards)
    worker = Worker(queue, concurrency=50)
    ran: list[tuple[str, float, Any]] = []
    lock = threading.Lock()

    @worker.handler("node.job")
    async def job(task: Task) -> None:
        late = time.time() - task.due_at.timestamp()
        with lock:
            ran.append((task.id, late, task.payload))

    with run_worker(worker):
        started = time.time()
        # 1,000 tasks due 1 to 3 s from now: 900 in one scheduleMany, 100 one at a time;
        # the 200 cancelled ones are due 2 s or more ahead, so the cancel always wins.
        out = run_node(
            node,
            server.url,
            f"""
            const q = new delayq.Queue({json.dumps(qname)}, {{ shards: {shards} }});
            const task = (i) => ({{
              kind: 'node.job', payload: {{ i }}, taskId: `t${{i}}`,
              delay: i < 200 ? 2 + (i % 100) / 100 : 1 + (i % 200) / 100,
            }});
            const many = [];
            for (let i = 0; i < 900; i++) many.push(task(i));
            const results = await q.scheduleMany(many);
            for (let i = 900; i < 1000; i++) {{
              const {{ kind, payload, ...options }} = task(i);
              results.push(await q.schedule(kind, payload, options));
            }}
            const cancelled = await Promise.all(
              Array.from({{ length: 200 }}, (_, i) => q.cancel(`t${{i}}`)));
            const info = await q.get('t999');
            const version = await q.protocolVersion();
            await q.close();
            return {{ results, cancelled, info, version }};
            """,
        )
        assert Counter(r["status"] for r in out["results"]) == {"created": 1000}
        assert [r["id"] for r in out["results"]] == [f"t{i}" for i in range(1000)]
        assert out["cancelled"] == [True] * 200
        info = out["info"]
        assert (info["state"], info["kind"], info["payload"]) == (
            "scheduled",
            "node.job",
            {"i": 999},
        )
        assert out["version"] == PROTOCOL_VERSION
        wait_for(lambda: len(ran) >= 800, timeout=60)
        # Past the last due time of a cancelled task, with a margin: none of them runs.
        time.sleep(max(0.0, started + 4.5 - time.time()))
    ids = Counter(task_id for task_id, _, _ in ran)
    assert ids == Counter({f"t{i}": 1 for i in range(200, 1000)})  # each exactly once
    assert all(payload == {"i": int(task_id[1:])} for task_id, _, payload in ran)
    lateness = sorted(late for _, late, _ in ran)
    # Generous: four other test runs share two cores; an idle machine starts within ms.
    assert lateness[len(lateness) // 2] < 0.5, lateness[-10:]
    assert lateness[-1] < 3.0, lateness[-10:]
    assert queue.stats().scheduled == 0
    for core in queue.shards.cores:  # each task was written to the shard Python reads
        assert queue.client.zcard(core.keys.done) == sum(
            1 for i in range(200, 1000) if shard_of(f"t{i}", shards) == core.shard
        )
    queue.close()


def test_node_and_python_put_every_id_on_the_same_shard(node: str, server: EmbeddedServer) -> None:
    ids = ["order:42", "é-ü", "日本語", "x:home", "cron:home", "a" * 256, "🙂", "t0"]
    ids += [f"task-{i}" for i in range(200)]
    got = run_node(
        node,
        server.url,
        f"return {json.dumps(ids)}.map((id) => [1, 2, 7, 1024].map((n) => delayq.shardOf(id, n)));",
    )
    assert got == [[shard_of(i, n) for n in (1, 2, 7, 1024)] for i in ids]


def test_what_node_writes_python_reads_and_the_scripts_load_on_noscript(
    node: str, server: EmbeddedServer, qname: str
) -> None:
    r = redis.Redis.from_url(server.url)
    r.script_flush()  # the client must load the scripts itself (NOSCRIPT)
    r.close()
    at = time.time() + 3600.25
    out = run_node(
        node,
        server.url,
        f"""
        const q = new delayq.Queue({json.dumps(qname)});
        const a = await q.schedule('mail.send', {{ to: 'ann', n: 1.5, big: 12345678901234567 }},
          {{ taskId: 'a', at: {at!r}, maxAttempts: 3, headers: {{ tenant: 'acme' }} }});
        const again = await q.schedule('mail.send', null, {{ taskId: 'a', delay: 5 }});
        const moved = await q.schedule('mail.send', 2, {{ taskId: 'a', delay: 7, replace: true }});
        const movedInfo = await q.get('a');
        const b = await q.schedule('other');
        const bInfo = await q.get(b.id);
        const rescheduled = await q.reschedule('a', {{ delay: 60 }});
        const unknown = await q.get('nope');
        const info = await q.get('a');
        await q.close();
        return {{ a, again, moved, movedInfo, b, bInfo, rescheduled, unknown, info }};
        """,
    )
    assert out["a"] == {"id": "a", "status": "created", "dueAt": out["a"]["dueAt"]}
    assert out["again"]["status"] == "unchanged" and out["moved"]["status"] == "replaced"
    # dueAt: the due time the script stored (protocol 1.1), what get answers; null when the
    # call left the task as it was.
    a_due = datetime.fromisoformat(out["a"]["dueAt"].replace("Z", "+00:00")).timestamp()
    assert abs(a_due - at) < 0.001 and out["again"]["dueAt"] is None
    assert out["moved"]["dueAt"] == out["movedInfo"]["dueAt"] is not None
    assert out["b"]["dueAt"] == out["bInfo"]["dueAt"] is not None
    assert len(out["b"]["id"]) == 16 and out["b"]["status"] == "created"
    assert out["rescheduled"] is True and out["unknown"] is None
    assert out["info"]["payload"] == 2 and out["info"]["headers"] == {}
    with Queue(qname, url=server.url) as queue:
        info = queue.get("a")
        assert info is not None and info.payload == 2 and info.max_attempts == 0
        assert info.due_at is not None and 55 < info.due_at.timestamp() - time.time() < 61
        other = queue.get(out["b"]["id"])
        assert other is not None and other.kind == "other" and other.payload is None
        # The first record, as Node wrote it, read by Python: header fields, numbers intact.
        queue.schedule("x", task_id="c")
    out = run_node(
        node,
        server.url,
        f"""
        const q = new delayq.Queue({json.dumps(qname)});
        await q.schedule('mail.send', {{ to: 'ann', n: 1.5, big: 123456789012345 }},
          {{ taskId: 'h', at: {at!r}, maxAttempts: 3, headers: {{ tenant: 'acme' }} }});
        const c = await q.get('c');
        await q.close();
        return {{ c }};
        """,
    )
    assert out["c"]["kind"] == "x" and out["c"]["state"] == "scheduled"
    with Queue(qname, url=server.url) as queue:
        info = queue.get("h")
        assert info is not None
        assert info.payload == {"to": "ann", "n": 1.5, "big": 123456789012345}
        assert (info.kind, info.max_attempts, info.headers) == ("mail.send", 3, {"tenant": "acme"})
        assert info.due_at is not None and abs(info.due_at.timestamp() - at) < 0.001
        assert info.created_at is not None and abs(info.created_at.timestamp() - time.time()) < 60


def test_node_refuses_a_queue_of_a_newer_protocol_major_and_writes_nothing(
    node: str, server: EmbeddedServer, qname: str
) -> None:
    r = redis.Redis.from_url(server.url)
    r.hset(f"dq:{{{qname}}}:shards", "protocol", "2.0")
    r.close()
    before = _keys(server.url, qname)
    out = run_node(
        node,
        server.url,
        f"""
        const q = new delayq.Queue({json.dumps(qname)});
        const errors = [];
        for (const call of [() => q.schedule('k', 1), () => q.get('a'), () => q.cancel('a'),
                            () => q.protocolVersion()]) {{
          try {{ await call(); errors.push(null); }}
          catch (err) {{ errors.push([err.name, err.message, err.stored, err.ours,
                                      err instanceof delayq.ConfigurationError]); }}
        }}
        await q.close();
        return errors;
        """,
    )
    for name, message, stored, ours, is_configuration in out:
        assert (name, stored, ours, is_configuration) == (
            "ProtocolVersionError",
            "2.0",
            PROTOCOL_VERSION,
            True,
        )
        assert f"speaks delayq protocol 2.0; this client speaks {PROTOCOL_VERSION}" in message
    assert _keys(server.url, qname) == before


def test_node_follows_the_stored_shard_count_and_refuses_another(
    node: str, server: EmbeddedServer, qname: str
) -> None:
    with Queue(qname, url=server.url, shards=4) as queue:
        queue.schedule("k", 0, task_id="first", delay=60)  # stores 4
        out = run_node(
            node,
            server.url,
            f"""
            const stored = new delayq.Queue({json.dumps(qname)}, {{ shards: 'stored' }});
            const made = await stored.scheduleMany(
              Array.from({{ length: 40 }}, (_, i) => ({{ kind: 'k', payload: i, delay: 60 }})));
            const n = stored.n;
            await stored.close();
            const wrong = new delayq.Queue({json.dumps(qname)}, {{ shards: 2 }});
            let refused = null;
            try {{ await wrong.schedule('k', 1); }} catch (err) {{ refused = err.message; }}
            await wrong.close();
            return {{ ids: made.map((r) => r.id), n, refused }};
            """,
        )
        assert out["n"] == 4
        assert "split into 4 shard(s), but was opened with shards=2" in out["refused"]
        for i, task_id in enumerate(out["ids"]):
            info = queue.get(task_id)
            assert info is not None and info.payload == i
        assert queue.stats().scheduled == 41


def test_node_refuses_bad_tasks_with_a_clear_error_and_writes_nothing(
    node: str, server: EmbeddedServer, qname: str
) -> None:
    out = run_node(
        node,
        server.url,
        f"""
        const q = new delayq.Queue({json.dumps(qname)}, {{ maxPayload: 100 }});
        const refused = [];
        for (const tasks of [
          [{{ kind: '' }}],
          [{{ kind: 'k\\n' }}],
          [{{ kind: 'k', taskId: 'x'.repeat(257) }}],
          [{{ kind: 'k', payload: 'x'.repeat(200) }}],
          [{{ kind: 'k', payload: {{ n: 10n }} }}],
          [{{ kind: 'k', delay: -1 }}],
          [{{ kind: 'k', delay: 1, at: 5 }}],
          [{{ kind: 'k', maxAttempts: 1.5 }}],
          [{{ kind: 'k', headers: {{ tenant: 7 }} }}],
          [{{ kind: 'k', taskId: 'a' }}, {{ kind: 'k', taskId: 'a' }}],
          [{{ kind: 'ok', taskId: 'good' }}, {{ kind: 'k', taskId: '\\ud800' }}],
        ]) {{
          try {{ await q.scheduleMany(tasks); refused.push(null); }}
          catch (err) {{ refused.push([err.name, err.message]); }}
        }}
        await q.close();
        return refused;
        """,
    )
    wanted = [
        "kind must be a non-empty string",
        "contains control characters",
        "over the limit of 256",
        "over the queue's limit of 100",
        "not JSON-serialisable",
        "must not be negative",
        "either delay or at",
        "maxAttempts must be a whole number",
        "header values must be strings",
        "appears twice",
        "lone surrogate",
    ]
    assert len(out) == len(wanted)
    for got, want in zip(out, wanted, strict=True):
        assert got is not None and got[0] == "InvalidTaskError" and want in got[1], (got, want)
    assert _keys(server.url, qname) == set()  # nothing written, not even the shard count


def test_node_refuses_a_stored_shard_count_over_max_shards_as_python_does(
    node: str, server: EmbeddedServer, qname: str
) -> None:
    r = redis.Redis.from_url(server.url)
    r.hset(f"dq:{{{qname}}}:shards", mapping={"n": 2000, "protocol": "1.0"})  # no delayq's
    r.close()
    before = _keys(server.url, qname)
    out = run_node(
        node,
        server.url,
        f"""
        const refused = [];
        for (const shards of ['stored', 1025]) {{
          try {{
            const q = new delayq.Queue({json.dumps(qname)}, {{ shards }});
            try {{ await q.schedule('k', 1); refused.push(null); }} finally {{ await q.close(); }}
          }} catch (err) {{ refused.push([err.name, err.message]); }}
        }}
        return refused;
        """,
    )
    assert out[0] is not None and out[0][0] == "ConfigurationError"
    assert (
        "stored a shard count of 2000, not one from 1 to the protocol's max_shards (1024)"
        in out[0][1]
    )
    assert out[1] == [
        "ConfigurationError",
        "shards must be an integer from 1 to 1024 or 'stored', got 1025",
    ]
    assert _keys(server.url, qname) == before
    stored = r"stored a shard count of 2000, not one from 1 to the protocol's max_shards \(1024\)"
    with pytest.raises(ConfigurationError, match=stored):  # Python refuses it too
        Queue(qname, url=server.url, shards="stored")  # (it reads the count as it opens)


def test_node_takes_a_payload_of_exactly_max_payload_bytes_and_counts_utf8_bytes(
    node: str, server: EmbeddedServer, qname: str
) -> None:
    out = run_node(
        node,
        server.url,
        f"""
        const q = new delayq.Queue({json.dumps(qname)}, {{ maxPayload: 100 }});
        const results = [];
        for (const payload of ['x'.repeat(98), 'é'.repeat(49), 'x'.repeat(99), 'é'.repeat(50)]) {{
          try {{ results.push((await q.schedule('k', payload, {{ delay: 60 }})).status); }}
          catch (err) {{ results.push(err.message); }}
        }}
        await q.close();
        return results;
        """,
    )
    assert out[:2] == ["created", "created"]  # 100 bytes each: the limit is inclusive
    assert "payload is 101 bytes encoded, over the queue's limit of 100" in out[2]
    assert "payload is 102 bytes encoded, over the queue's limit of 100" in out[3]


def test_node_follows_the_queues_stored_settings_and_refuses_another_value(
    node: str, server: EmbeddedServer, qname: str
) -> None:
    """The settings `delayq settings` stores come with the shard check's reply (protocol
    1.1): Node follows them, and refuses a constructor value that disagrees, naming both."""
    untouched = run_node(
        node,
        server.url,
        f"""
        const q = new delayq.Queue({json.dumps(qname)});
        const s = await q.settings();
        await q.close();
        return s;
        """,
    )
    assert untouched == {"dedupeWindow": 86400, "maxPayload": 65536, "codec": "json", "stored": []}
    with Queue(qname, url=server.url) as q:
        q.update_settings(max_payload=1000, dedupe_window=3600)
    out = run_node(
        node,
        server.url,
        f"""
        const name = {json.dumps(qname)};
        const q = new delayq.Queue(name);
        const results = [];
        try {{ await q.schedule('k', 'x'.repeat(1498), {{ delay: 60 }}); }}
        catch (err) {{ results.push(err.message); }}
        results.push((await q.schedule('k', 'x'.repeat(998), {{ delay: 60 }})).status);
        results.push(await q.settings());
        await q.close();
        const given = new delayq.Queue(name, {{ maxPayload: 2000 }});
        try {{ await given.schedule('k', 1); }} catch (err) {{ results.push(err.message); }}
        await given.close();
        const same = new delayq.Queue(name, {{ maxPayload: 1000, dedupeWindow: 3600 }});
        results.push((await same.schedule('k', 1)).status);
        await same.close();
        return results;
        """,
    )
    assert "payload is 1500 bytes encoded, over the queue's limit of 1000" in out[0]
    assert out[1] == "created"  # 1000 bytes: the limit is inclusive
    assert out[2] == {
        "dedupeWindow": 3600,
        "maxPayload": 1000,
        "codec": "json",
        "stored": ["dedupe_window", "max_payload"],
    }
    assert "max_payload=1000 bytes" in out[3] and "maxPayload=2000 bytes" in out[3]
    assert out[4] == "created"
    with Queue(qname, url=server.url) as q:
        assert q.stats().scheduled == 2


def test_node_takes_a_stored_limit_above_the_default_on_its_first_call(
    node: str, server: EmbeddedServer, qname: str
) -> None:
    with Queue(qname, url=server.url) as q:
        q.update_settings(max_payload=256 * 1024)
    out = run_node(
        node,
        server.url,
        f"""
        const q = new delayq.Queue({json.dumps(qname)});
        const s = await q.schedule('k', 'x'.repeat(100000), {{ delay: 60 }});
        await q.close();
        return s.status;
        """,
    )
    assert out == "created"


def test_node_get_answers_cancelled_with_its_time_as_python_does(
    node: str, server: EmbeddedServer, qname: str
) -> None:
    """A cancel (Node's or Python's) is remembered for the dedupe window: Node's get answers
    state 'cancelled' and when (issue 32 item 7), and the id is free to schedule again."""
    out = run_node(
        node,
        server.url,
        f"""
        const q = new delayq.Queue({json.dumps(qname)});
        await q.schedule('k', {{ n: 1 }}, {{ taskId: 'a', delay: 60 }});
        const before = Date.now();
        const cancelled = await q.cancel('a');
        const info = await q.get('a');
        const again = await q.schedule('k', {{ n: 2 }}, {{ taskId: 'a', delay: 60 }});
        const live = await q.get('a');
        await q.close();
        return {{ cancelled, info, before, again: again.status, live }};
        """,
    )
    assert out["cancelled"] is True
    info = out["info"]
    assert (info["state"], info["kind"], info["payload"]) == ("cancelled", "", None)
    finished = datetime.fromisoformat(info["finishedAt"].replace("Z", "+00:00")).timestamp()
    assert abs(finished * 1000 - out["before"]) < 5000
    assert out["again"] == "created" and out["live"]["state"] == "scheduled"
    assert out["live"]["payload"] == {"n": 2}
    with Queue(qname, url=server.url) as q:
        assert (i := q.get("a")) is not None and i.state == "scheduled"
        q.schedule("k", task_id="b", delay=60)
        assert q.cancel("b")
    python_cancel = run_node(
        node,
        server.url,
        f"const q = new delayq.Queue({json.dumps(qname)}); const i = await q.get('b');"
        " await q.close(); return i;",
    )
    assert python_cancel["state"] == "cancelled" and python_cancel["finishedAt"]


def test_node_schedules_with_a_priority_that_python_claims_first_and_replace_keeps(
    node: str, server: EmbeddedServer, qname: str
) -> None:
    at = time.time() - 1
    out = run_node(
        node,
        server.url,
        f"""
        const q = new delayq.Queue({json.dumps(qname)});
        await q.scheduleMany([
          {{ kind: 'k', payload: 1, taskId: 'plain', at: {at - 1!r} }},
          {{ kind: 'k', payload: 2, taskId: 'high', at: {at!r}, priority: 7 }},
        ]);
        const moved = await q.schedule('k', 3, {{ taskId: 'high', at: {at!r}, replace: true }});
        const info = await q.get('high');
        let refused = null;
        try {{ await q.schedule('k', 4, {{ priority: 10 }}); }} catch (e) {{ refused = e.message; }}
        await q.close();
        return {{ moved, info, refused }};
        """,
    )
    assert out["moved"]["status"] == "replaced" and out["moved"]["dueAt"] is not None
    assert out["info"]["priority"] == 7 and out["info"]["payload"] == 3  # kept by the replace
    assert out["refused"] is not None and "priority" in out["refused"]
    with Queue(qname, url=server.url) as queue:
        assert queue.get("high").priority == 7  # type: ignore[union-attr]
        got = SyncRunner(queue.client).run(claim(queue.core, limit=10, lease_ms=30_000))
        assert [c.id for c in got.tasks] == ["high", "plain"]  # due later, claimed first


def test_node_gets_a_finished_tasks_tombstone_and_result_as_python_does(
    node: str, server: EmbeddedServer, qname: str
) -> None:
    """Protocol 1.1: a done task's get answers from its tombstone, with its result; an
    aborted one too; and Node's cancel tells whoever waits for the task."""
    from delayq.testing import VirtualClock, drain

    with Queue(qname, url=server.url, clock=VirtualClock()) as queue:
        worker = Worker(queue)
        worker.handler("order.close")(lambda task: {"closed": task.payload["n"]})
        worker.handler("plain")(lambda task: None)
        queue.schedule("order.close", {"n": 42}, task_id="r")
        queue.schedule("plain", {"n": 1}, task_id="p")
        queue.schedule("plain", {"n": 2}, task_id="x", delay=600)
        drain(worker)
        assert queue.abort("x")
        python = {i: queue.get(i) for i in ("r", "p", "x")}
    out = run_node(
        node,
        server.url,
        f"""
        const q = new delayq.Queue({json.dumps(qname)});
        const got = {{ r: await q.get('r'), p: await q.get('p'), x: await q.get('x') }};
        await q.close();
        return got;
        """,
    )
    for tid, info in python.items():
        assert info is not None
        got = out[tid]
        assert (got["state"], got["kind"], got["attempts"]) == (
            info.state,
            info.kind,
            info.attempts,
        )
        assert (got["payload"], got["result"], got["maxAttempts"]) == (None, info.result, 0)
        assert got["finishedAt"] is not None and got["createdAt"] is None
        due = got["dueAt"] and datetime.fromisoformat(got["dueAt"].replace("Z", "+00:00"))
        assert due == info.due_at
    assert out["r"]["result"] == {"closed": 42} and out["p"]["result"] is None
