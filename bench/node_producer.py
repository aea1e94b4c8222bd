"""The Node producer (``clients/node``): ``scheduleMany`` throughput, beside Python's
``schedule_many`` on the same server in the same run.

100,000 tasks with a small payload, three runs each on fresh queues, alternating Node and
Python; the median run of each is reported. The Node process builds its task objects
before the clock starts (as the Python side builds its specs), connects and loads the
scripts with one ``schedule`` first; the time covers validation, encoding, the shard
check and the script calls (the client sends them all at once: node-redis pipelines the
calls of one tick). Needs ``node`` and ``npm``; runs ``npm ci`` in clients/node when its
node_modules is missing.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time

from common import ROOT, Report, client, fresh_server, median, server_cpu, short_version

from delayq import Queue, TaskSpec

NAME = "node_producer"
TITLE = "the Node producer's scheduleMany beside Python's schedule_many"

COUNT = 100_000
REPEATS = 3
PAYLOAD = {"order": 123456, "user": 42}
KIND = "order.close"
NODE_BAR = 50_000.0
NODE_DIR = ROOT / "clients" / "node"

_NODE_RUN = """
const { Queue } = require(%(client)s);
(async () => {
  const q = new Queue(process.argv[1], { url: process.env.DELAYQ_REDIS_URL });
  await q.schedule(%(kind)s, %(payload)s, { delay: 3600 });  // connect, load the scripts
  const tasks = [];
  for (let i = 0; i < %(n)d; i++) tasks.push({ kind: %(kind)s, payload: %(payload)s, delay: 3600 });
  const t = process.hrtime.bigint();
  const results = await q.scheduleMany(tasks);
  const seconds = Number(process.hrtime.bigint() - t) / 1e9;
  await q.close();
  if (results.length !== tasks.length) throw new Error('not every task was scheduled');
  process.stdout.write(JSON.stringify({ seconds }));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def _node() -> str:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise RuntimeError("node_producer needs node and npm: apt-get install nodejs npm")
    if not (NODE_DIR / "node_modules" / "redis").is_dir():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True)
    return node


def node_run(node: str, url: str, n: int) -> float:
    """Seconds the Node client took to schedule ``n`` tasks on a fresh queue."""
    script = _NODE_RUN % {
        "client": json.dumps(str(NODE_DIR)),
        "kind": json.dumps(KIND),
        "payload": json.dumps(PAYLOAD),
        "n": n,
    }
    done = subprocess.run(
        [node, "-e", script, f"node-{secrets.token_hex(3)}"],
        env={**os.environ, "DELAYQ_REDIS_URL": url},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the Node producer failed:\n{done.stderr}")
    return float(json.loads(done.stdout)["seconds"])


def python_run(url: str, n: int) -> float:
    """Seconds ``Queue.schedule_many`` took to schedule ``n`` tasks on a fresh queue."""
    with Queue(f"py-{secrets.token_hex(3)}", url=url) as q:
        q.schedule(KIND, PAYLOAD, delay=3600)  # connect and load the script first
        specs = [TaskSpec(KIND, PAYLOAD, delay=3600) for _ in range(n)]
        t = time.perf_counter()
        ids = q.schedule_many(specs)
        seconds = time.perf_counter() - t
        assert len(ids) == n
    return seconds


def run(rep: Report) -> None:
    node = _node()
    n = rep.n(COUNT)
    with fresh_server() as srv:
        rep.line(f"server {short_version(srv)} (AOF everysec); {n:,} tasks a run, {PAYLOAD}")
        meter = client(srv.url)
        rates: dict[str, list[float]] = {"node": [], "python": []}
        cpu: dict[str, list[float]] = {"node": [], "python": []}
        try:
            for _ in range(REPEATS):
                for side, timed in (
                    ("node", lambda: node_run(node, srv.url, n)),
                    ("python", lambda: python_run(srv.url, n)),
                ):
                    cpu0 = server_cpu(meter)
                    rates[side].append(n / timed())
                    cpu[side].append(server_cpu(meter) - cpu0)
                rep.line(
                    f"  run: Node scheduleMany {rates['node'][-1]:,.0f} tasks/s (server CPU "
                    f"{cpu['node'][-1]:.2f} s), Python schedule_many {rates['python'][-1]:,.0f} "
                    f"tasks/s (server CPU {cpu['python'][-1]:.2f} s)"
                )
        finally:
            meter.close()
    node_rate, py_rate = median(rates["node"]), median(rates["python"])
    rep.line(
        f"median: Node {node_rate:,.0f} tasks/s, Python {py_rate:,.0f} tasks/s "
        f"(Node / Python {node_rate / py_rate:.2f}); server CPU per task: Node "
        f"{1e6 * median(cpu['node']) / n:.1f} us, Python {1e6 * median(cpu['python']) / n:.1f} us"
    )
    rep.figure(
        "node_producer",
        {
            "n": n,
            "node_tasks_per_s": node_rate,
            "python_tasks_per_s": py_rate,
            "runs": rates,
            "server_cpu_s": cpu,
        },
    )
    rep.bar("Node scheduleMany throughput (median of 3)", node_rate, ">=", NODE_BAR, "tasks/s")
