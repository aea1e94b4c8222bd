"""The reference Node producer (clients/node) on a real local Redis Cluster (3 primaries, 3
replicas): what Node schedules, cancels and reschedules on a queue, unsplit or sharded over
every primary, a Python worker runs once each and never early; each call goes to its first
key's slot, loads its script there after NOSCRIPT, and follows MOVED, ASK and TRYAGAIN while
a slot moves.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from delayq import Queue, Task, Worker
from delayq.keys import shard_of
from delayq.protocol.version import PROTOCOL_VERSION
from delayq.scripts import SCRIPTS

from .support.helpers import wait_for
from .support.topology import Cluster, Node
from .test_node_client import NODE_DIR, node, run_node

__all__ = ["node"]  # the fixture (node, npm ci done), shared with test_node_client

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster3() -> Iterator[Cluster]:
    with Cluster() as c:
        yield c


def created(result: dict[str, Any], task_id: str) -> bool:
    """A Node schedule result for a task it created: its id, status and stored due time."""
    return result == {"id": task_id, "status": "created", "dueAt": result.get("dueAt")} and bool(
        result["dueAt"]
    )


def _slot(key: str) -> int:
    return int(key_slot(key.encode()))


def _errors(n: Node, kind: str) -> int:
    """How many errors of ``kind`` (MOVED, ASK, TRYAGAIN, NOSCRIPT) the node answered."""
    with n.client() as r:
        stats = r.info("errorstats")
    return int(stats.get(f"errorstat_{kind}", {}).get("count", 0))


def _has_script(n: Node, name: str) -> bool:
    with n.client() as r:
        return bool(r.script_exists(SCRIPTS[name].sha)[0])


def _flush_scripts(cluster: Cluster) -> None:
    for p in cluster.primaries():
        with p.client() as r:
            r.script_flush()


# How the Node side reaches the cluster: the redis+cluster:// URL (as Python's), a client of
# createCluster passed in, or root nodes.
CONNECT = {
    "url": "new delayq.Queue(name, { shards })",
    "client": """(await (async () => {
        const { createCluster } = require(require.resolve('redis', { paths: [DIR] }));
        const cluster = createCluster({ rootNodes: ROOTS.map((url) => ({ url })) });
        cluster.on('error', () => {});
        await cluster.connect();
        onClose.push(() => cluster.quit());
        return new delayq.Queue(name, { client: cluster, shards });
      })())""",
    "rootNodes": "new delayq.Queue(name, { rootNodes: ROOTS.slice(0, 2), shards })",
}


def _prelude(cluster: Cluster, qname: str, shards: int) -> str:
    roots = [f"redis://{h}:{p}" for h, p in cluster.startup_nodes]
    return (
        f"const name = {json.dumps(qname)}, shards = {shards};\n"
        f"const ROOTS = {json.dumps(roots)};\n"
        "const onClose = [];\n"
        f"const DIR = {json.dumps(str(NODE_DIR))};\n"
    )


@pytest.mark.parametrize(("shards", "how"), [(1, "url"), (16, "client"), (4, "rootNodes")])
def test_node_schedules_cancels_and_reschedules_on_a_cluster_and_each_task_runs_once_on_time(
    node: str, cluster3: Cluster, qname: str, run_worker: Any, shards: int, how: str
) -> None:
    queue = Queue(qname, url=cluster3.url, shards=shards)
    worker = Worker(queue, concurrency=50)
    ran: list[tuple[str, float, float, Any]] = []  # id, started, due, payload
    lock = threading.Lock()

    @worker.handler("node.job")
    async def job(task: Task) -> None:
        started = time.time()
        with lock:
            ran.append((task.id, started, task.due_at.timestamp(), task.payload))

    with run_worker(worker):
        started = time.time()
        # 300 tasks: 250 in one scheduleMany, 50 one at a time. t0-t59 (due 2-2.6 s) are
        # cancelled; t60-t79 (due in 1 s) are moved to 2.5 s, t80-t99 (due in 60 s) to 1.5 s.
        out = run_node(
            node,
            cluster3.url,
            _prelude(cluster3, qname, shards)
            + f"""
            const q = {CONNECT[how]};
            const delay = (i) => i < 60 ? 2 + (i % 10) / 10 : i < 80 ? 1 : i < 100 ? 60
              : 1 + (i % 10) / 10;
            const task = (i) => ({{ kind: 'node.job', payload: {{ i }}, taskId: `t${{i}}`,
                                    delay: delay(i) }});
            const results = await q.scheduleMany(Array.from({{ length: 250 }}, (_, i) => task(i)));
            for (let i = 250; i < 300; i++) {{
              const {{ kind, payload, ...options }} = task(i);
              results.push(await q.schedule(kind, payload, options));
            }}
            const cancelled = await Promise.all(
              Array.from({{ length: 60 }}, (_, i) => q.cancel(`t${{i}}`)));
            const moved = await Promise.all(Array.from({{ length: 40 }}, (_, i) =>
              q.reschedule(`t${{60 + i}}`, {{ delay: i < 20 ? 2.5 : 1.5 }})));
            const info = await q.get('t299');
            const gone = await q.get('t0');
            const version = await q.protocolVersion();
            await q.close();
            for (const close of onClose) await close();
            return {{ results, cancelled, moved, info, gone, version, cluster: q.cluster }};
            """,
        )
        assert out["cluster"] is True
        assert Counter(r["status"] for r in out["results"]) == {"created": 300}
        assert [r["id"] for r in out["results"]] == [f"t{i}" for i in range(300)]
        assert out["cancelled"] == [True] * 60 and out["moved"] == [True] * 40
        assert out["gone"]["state"] == "cancelled" and out["version"] == PROTOCOL_VERSION
        info = out["info"]
        assert (info["state"], info["kind"], info["payload"]) == (
            "scheduled",
            "node.job",
            {"i": 299},
        )
        wait_for(lambda: len(ran) >= 240, timeout=30)
        # Past the last due time of a cancelled task (2.6 s), with a margin: none of them runs.
        time.sleep(max(0.0, started + 4.0 - time.time()))
    ids = Counter(task_id for task_id, _, _, _ in ran)
    assert ids == Counter({f"t{i}": 1 for i in range(60, 300)})  # each exactly once
    assert all(payload == {"i": int(task_id[1:])} for task_id, _, _, payload in ran)
    early = [(task_id, due - began) for task_id, began, due, _ in ran if began < due]
    assert early == []  # none started before its due time
    due = {task_id: d for task_id, _, d, _ in ran}
    assert all(due[f"t{i}"] - started > 2.4 for i in range(60, 80))  # moved later
    assert all(due[f"t{i}"] - started < 10 for i in range(80, 100))  # moved earlier
    lateness = sorted(b - d for _, b, d, _ in ran)
    # Generous: other test runs share two cores; an idle machine starts within ms.
    assert lateness[len(lateness) // 2] < 0.5 and lateness[-1] < 3.0, lateness[-10:]
    assert queue.stats().scheduled == 0
    for core in queue.shards.cores:  # each task was written to the shard Python reads
        assert queue.client.zcard(core.keys.done) == sum(
            1 for i in range(60, 300) if shard_of(f"t{i}", shards) == core.shard
        )
    if shards == 16:  # the shards' tags spread over every primary
        holders = Counter(cluster3.owner(_slot(c.keys.done)).port for c in queue.shards.cores)
        assert len(holders) == 3 and sum(holders.values()) == 16, holders
    queue.close()


def test_node_loads_each_script_on_the_owner_of_the_calls_slot_after_noscript(
    node: str, cluster3: Cluster, qname: str
) -> None:
    _flush_scripts(cluster3)
    owner = cluster3.owner(_slot(f"dq:{{{qname}}}:scheduled"))
    others = [p for p in cluster3.primaries() if p is not owner]
    assert len(others) == 2
    out = run_node(
        node,
        cluster3.url,
        f"""
        const q = new delayq.Queue({json.dumps(qname)});
        const made = await q.schedule('k', 1, {{ taskId: 'a', delay: 60 }});
        await q.close();
        return made;
        """,
    )
    assert created(out, "a")
    # Loaded where the calls went, and only there: the script cache is per node.
    for name in ("shards", "schedule"):
        assert _has_script(owner, name) and not any(_has_script(p, name) for p in others)
    # A split queue's calls go to every primary: each loads its scripts on NOSCRIPT.
    split = f"{qname}-split"
    out = run_node(
        node,
        cluster3.url,
        f"""
        const q = new delayq.Queue({json.dumps(split)}, {{ shards: 16 }});
        const made = await q.scheduleMany(
          Array.from({{ length: 200 }}, (_, i) => ({{ kind: 'k', payload: i, delay: 60 }})));
        const found = await Promise.all(made.map((m) => q.get(m.id)));
        await q.close();
        return found.map((f) => f.payload);
        """,
    )
    assert out == list(range(200))
    assert all(_has_script(p, name) for p in cluster3.primaries() for name in ("schedule", "get"))
    with Queue(split, url=cluster3.url, shards=16) as queue:
        assert queue.stats().scheduled == 200


class NodeSteps:
    """Node running ``body`` with ``step(value)`` (write ``value`` as a JSON line, then wait
    for a line on stdin) and ``say(value)`` (write it only); what ``body`` returns is the
    last line. A context manager: the process is stopped and its pipes closed at the end."""

    def __init__(self, node_bin: str, url: str, body: str) -> None:
        script = (
            f"const delayq = require({json.dumps(str(NODE_DIR))});\n"
            "const lines = require('node:readline').createInterface({ input: process.stdin });\n"
            "const next = lines[Symbol.asyncIterator]();\n"
            "const say = (v) => process.stdout.write(JSON.stringify(v) + '\\n');\n"
            "const step = async (v) => { say(v); await next.next(); };\n"
            f"(async () => {{ {body} }})().then(\n"
            "  (out) => { say(out === undefined ? null : out); process.exit(0); },\n"
            "  (err) => { console.error(err && err.stack || err); process.exit(1); });\n"
        )
        self.proc = subprocess.Popen(
            [node_bin, "-e", script],
            env={**os.environ, "DELAYQ_REDIS_URL": url},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def read(self) -> Any:
        """The next line Node writes, as JSON; a Node that failed fails the test."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            raise AssertionError(f"node failed:\n{self.proc.stderr.read()}")
        return json.loads(line)

    def go_on(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def finish(self) -> Any:
        out = self.read()
        assert self.proc.wait(timeout=30) == 0
        return out

    def __enter__(self) -> NodeSteps:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def test_node_follows_moved_when_the_queues_slot_moves_and_loads_its_scripts_there(
    node: str, cluster3: Cluster, qname: str
) -> None:
    slot = _slot(f"dq:{{{qname}}}:scheduled")
    source = cluster3.owner(slot)
    target = next(p for p in cluster3.primaries() if p is not source)
    session = NodeSteps(
        node,
        cluster3.url,
        f"""
        const q = new delayq.Queue({json.dumps(qname)});
        const first = await q.schedule('k', 1, {{ taskId: 'a', delay: 60 }});
        await step(first);  // the slot moves here: the client's slot map is stale
        const second = await q.schedule('k', 2, {{ taskId: 'b', delay: 60 }});
        const moved = await q.reschedule('a', {{ delay: 120 }});
        const cancelled = await q.cancel('b');
        const info = await q.get('a');
        await q.close();
        return {{ second, moved, cancelled, info }};
        """,
    )
    try:
        with session:
            assert created(session.read(), "a")
            assert cluster3.migrate_slot(slot, target) >= 3
            with target.client() as r:
                r.script_flush()  # so the calls meet NOSCRIPT on the new owner, after MOVED
            moved_before = _errors(source, "MOVED")
            session.go_on()
            out = session.finish()
    finally:
        cluster3.migrate_slot(slot, source)  # the shared cluster as it was
    assert created(out["second"], "b")
    assert out["moved"] is True and out["cancelled"] is True
    assert out["info"]["state"] == "scheduled" and out["info"]["payload"] == 1
    assert _errors(source, "MOVED") > moved_before  # the old owner answered MOVED


def test_node_follows_ask_and_tryagain_while_the_queues_slot_is_migrating(
    node: str, cluster3: Cluster, qname: str
) -> None:
    slot = _slot(f"dq:{{{qname}}}:scheduled")
    source = cluster3.owner(slot)
    target = next(p for p in cluster3.primaries() if p is not source)
    with Queue(qname, url=cluster3.url) as queue:
        queue.schedule("k", 1, task_id="a", delay=60)
        scheduled = queue.shards.home.keys.scheduled
    session = NodeSteps(
        node,
        cluster3.url,
        f"""
        const q = new delayq.Queue({json.dumps(qname)});
        await step((await q.get('a')).state);  // the queue checked, before the slot moves
        // reschedule touches one key, the scheduled set: the source answers ASK, and the
        // target runs it once the script is loaded there.
        const moved = await q.reschedule('a', {{ delay: 120 }});
        say(moved);
        // schedule's keys are on both sides: TRYAGAIN until the migration is finished.
        const made = await q.schedule('k', 2, {{ taskId: 'b', delay: 60 }});
        const info = await q.get('a');
        await q.close();
        return {{ made, info }};
        """,
    )
    try:
        with session:
            assert session.read() == "scheduled"
            # Half-way through a migration: the scheduled set is on the target, the rest
            # still on the source; the target has no scripts.
            with source.client() as s, target.client() as d:
                d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
                s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
                s.execute_command(
                    "MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", scheduled
                )
                d.script_flush()
            asks, tries = _errors(source, "ASK"), _errors(source, "TRYAGAIN")
            session.go_on()
            assert session.read() is True
            with target.client() as d:
                d.execute_command("ASKING")
                due = float(d.zscore(scheduled, "a") or 0)
            assert 110 < due / 1000 - time.time() <= 120  # moved on the target
            assert _has_script(target, "reschedule")  # loaded where ASK sent the call
            assert _errors(source, "ASK") > asks
            wait_for(lambda: _errors(source, "TRYAGAIN") > tries, timeout=10)
            assert cluster3.migrate_slot(slot, target) >= 1  # finished while Node retries
            out = session.finish()
    finally:
        cluster3.migrate_slot(slot, source)
    assert created(out["made"], "b")
    assert out["info"]["state"] == "scheduled" and out["info"]["payload"] == 1
    with Queue(qname, url=cluster3.url) as queue:
        b = queue.get("b")
        assert b is not None and b.payload == 2 and queue.stats().scheduled == 2


def test_node_takes_only_one_way_to_connect_and_reads_a_cluster_url_as_python_does(
    node: str, cluster3: Cluster
) -> None:
    out = run_node(
        node,
        cluster3.url,
        f"const DIR = {json.dumps(str(NODE_DIR))};\n"
        + """
        const refused = [];
        for (const options of [
          { url: 'redis://127.0.0.1:1', rootNodes: ['redis://127.0.0.1:2'] },
          { rootNodes: [] },
          { url: 'redis+cluster://127.0.0.1' },
          { url: 'redis+cluster://127.0.0.1:7000/1' },
          { url: 'redis+cluster://127.0.0.1:7000?x=1' },
        ]) {
          try { new delayq.Queue('q', options); refused.push(null); }
          catch (err) { refused.push([err.name, err.message]); }
        }
        const q = new delayq.Queue('q');  // $DELAYQ_REDIS_URL, a redis+cluster:// URL
        const { clusterOptions } = require(`${DIR}/cluster.js`);
        const parsed = clusterOptions('rediss+cluster://ann:p%40ss@h1:7000,[::1]:7001/0', Error);
        return { refused, cluster: q.cluster, parsed };
        """,
    )
    wanted = [
        "pass one of client, url or rootNodes",
        "rootNodes must be a non-empty array",
        "is not host:port",
        "has only database 0",
        "is not of the form redis+cluster://",
    ]
    for got, want in zip(out["refused"], wanted, strict=True):
        assert got is not None and got[0] == "ConfigurationError" and want in got[1], (got, want)
    assert out["cluster"] is True
    assert out["parsed"] == {
        "rootNodes": [
            {"socket": {"host": "h1", "port": 7000}},
            {"socket": {"host": "::1", "port": 7001}},
        ],
        "defaults": {"username": "ann", "password": "p@ss", "socket": {"tls": True}},
    }
