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
  const cpu0 = process.cpuUsage();
  const results = await q.scheduleMany(tasks);
  const seconds = Number(process.hrtime.bigint() - t) / 1e9;
  const used = process.cpuUsage(cpu0);
  const cpu = (used.user + used.system) / 1e6;
  await q.close();
  if (results.length !== tasks.length) throw new Error('not every task was scheduled');
  process.stdout.write(JSON.stringify({ seconds, cpu }));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def _node() -> str:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise RuntimeError("node_producer needs node and npm: apt-get install nodejs npm")
    if not (NODE_DIR / "node_modules" / "redis").is_dir():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True)
    return node


def node_run(node: str, url: str, n: int) -> tuple[float, float]:
    """Seconds the Node client took to schedule ``n`` tasks on a fresh queue, and the CPU
    seconds its process used meanwhile."""
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
    out = json.loads(done.stdout)
    return float(out["seconds"]), float(out["cpu"])


def python_run(url: str, n: int) -> tuple[float, float]:
    """Seconds ``Queue.schedule_many`` took to schedule ``n`` tasks on a fresh queue, and
    the CPU seconds this process used meanwhile."""
    with Queue(f"py-{secrets.token_hex(3)}", url=url) as q:
        q.schedule(KIND, PAYLOAD, delay=3600)  # connect and load the script first
        specs = [TaskSpec(KIND, PAYLOAD, delay=3600) for _ in range(n)]
        t, cpu = time.perf_counter(), time.process_time()
        ids = q.schedule_many(specs)
        seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
        assert len(ids) == n
    return seconds, cpu


def run(rep: Report) -> None:
    node = _node()
    n = rep.n(COUNT)
    with fresh_server() as srv:
        rep.line(f"server {short_version(srv)} (AOF everysec); {n:,} tasks a run, {PAYLOAD}")
        meter = client(srv.url)
        rates: dict[str, list[float]] = {"node": [], "python": []}
        cpu: dict[str, list[float]] = {"node": [], "python": []}  # the server's
        own: dict[str, list[float]] = {"node": [], "python": []}  # the producer's
        try:
            for _ in range(REPEATS):
                for side, timed in (
                    ("node", lambda: node_run(node, srv.url, n)),
                    ("python", lambda: python_run(srv.url, n)),
                ):
                    cpu0 = server_cpu(meter)
                    seconds, producer = timed()
                    cpu[side].append(server_cpu(meter) - cpu0)
                    rates[side].append(n / seconds)
                    own[side].append(producer)
                rep.line(
                    "  run: "
                    + ", ".join(
                        f"{label} {rates[side][-1]:,.0f} tasks/s (CPU: producer "
                        f"{own[side][-1]:.2f} s, server {cpu[side][-1]:.2f} s)"
                        for side, label in (
                            ("node", "Node scheduleMany"),
                            ("python", "Python schedule_many"),
                        )
                    )
                )
        finally:
            meter.close()
    node_rate, py_rate = median(rates["node"]), median(rates["python"])
    rep.line(
        f"median: Node {node_rate:,.0f} tasks/s, Python {py_rate:,.0f} tasks/s "
        f"(Node / Python {node_rate / py_rate:.2f}); CPU per task (producer + server): Node "
        f"{1e6 * median(own['node']) / n:.1f} + {1e6 * median(cpu['node']) / n:.1f} us, "
        f"Python {1e6 * median(own['python']) / n:.1f} + {1e6 * median(cpu['python']) / n:.1f} us"
    )
    rep.figure(
        "node_producer",
        {
            "n": n,
            "node_tasks_per_s": node_rate,
            "python_tasks_per_s": py_rate,
            "runs": rates,
            "server_cpu_s": cpu,
            "producer_cpu_s": own,
        },
    )
    rep.bar("Node scheduleMany throughput (median of 3)", node_rate, ">=", NODE_BAR, "tasks/s")
