"""Memory: ``used_memory`` per waiting task, beyond the payload's own encoded bytes; and
per finished task held for the dedupe window.

100,000 tasks with one fixed small payload are scheduled an hour ahead on a fresh server
(AOF off, so no rewrite buffers sit in ``used_memory``), with generated ids and with
12-character business ids (``order:000042``). The baseline is taken with the scripts
already loaded and only the measuring connection open; the producer's connection is
closed before the second reading. Valkey 8.1 (bundled) and Redis 7.0 (/usr/bin).

Finished: 100,000 tasks with generated ids (16 characters) and a 30-byte payload are
scheduled due now, claimed and acked in batches of 500 as a worker does (no result), on a
fresh server; ``used_memory`` after, less before any was scheduled, per task. Once with the
default tombstones, once with ``keep_finished="record"`` (whole records, as before).
Bars: at most 230 B per finished task on Redis 7.0 and 150 B on Valkey 8.1 (issue 30).
"""

from __future__ import annotations

import secrets
import time

from common import Report, client, fresh_server, short_version

from delayq import Queue, TaskSpec, leasing
from delayq.codec import tombstone_prefix
from delayq.runner import SyncRunner
from delayq.scripts import SCRIPTS

NAME = "memory"
TITLE = "Memory per waiting task beyond the payload, and per finished task"

COUNT = 100_000
PAYLOAD = {"order": 123456, "user": 42}
KIND = "order.close"
BAR_BYTES = 200.0
FINISHED_PAYLOAD = {"order": 1234567890, "user": 42}  # 30 bytes as JSON
FINISHED_BARS = {"redis": 230.0, "valkey": 150.0}


def run(rep: Report) -> None:
    n = rep.n(COUNT)
    rep.line(f"{n:,} waiting tasks of kind {KIND!r}, payload {PAYLOAD}")
    for flavour in ("valkey", "redis"):
        for ids in ("generated", "business"):
            one(rep, flavour, ids, n)
    rep.line(f"{n:,} finished tasks of kind {KIND!r}, payload {FINISHED_PAYLOAD}, no result")
    for flavour in ("valkey", "redis"):
        for keep in ("tombstone", "record"):
            finished(rep, flavour, keep, n)


def _used(r: object) -> int:
    return int(r.info("memory")["used_memory"])  # type: ignore[attr-defined]


def one(rep: Report, flavour: str, ids: str, n: int) -> None:
    name = f"mem-{secrets.token_hex(3)}"
    with fresh_server(flavour, appendonly=False) as srv:
        meter = client(srv.url)
        meter.script_load(SCRIPTS["schedule"].source)
        time.sleep(0.2)
        base = _used(meter)
        with Queue(name, url=srv.url) as q:
            payload_bytes = len(q.core.codec.encode(PAYLOAD))
            specs = [
                TaskSpec(
                    KIND,
                    PAYLOAD,
                    delay=3600,
                    task_id=f"order:{i:06d}" if ids == "business" else None,
                )
                for i in range(n)
            ]
            record = len(q.core.encode_tasks(specs[:1])[1][2])
            id_len = len(q.core.encode_tasks(specs[:1])[0][0])
            q.schedule_many(specs)
            keys = q.core.keys
        time.sleep(0.5)  # let the server free the producer's connection and buffers
        used = _used(meter)
        waiting = int(meter.zcard(keys.scheduled))
        per_key = {
            k: int(meter.memory_usage(getattr(keys, k), samples=0) or 0)
            for k in ("scheduled", "tasks", "stats")
        }
        meter.close()
        per_task = (used - base) / n
        beyond = per_task - payload_bytes
        rep.line(
            f"{short_version(srv):12s} {ids:9s} ids ({id_len:2d} chars): {waiting:,} waiting, "
            f"used_memory +{(used - base) / 2**20:.1f} MiB = {per_task:.0f} B/task; "
            f"payload {payload_bytes} B -> {beyond:.0f} B beyond it"
        )
        zset, tasks = per_key["scheduled"] / n, per_key["tasks"] / n
        rep.line(
            f"{'':12s} record {record} B (header {record - payload_bytes - 1} B + newline + "
            f"payload); MEMORY USAGE per task: scheduled zset {zset:.0f} B, "
            f"tasks hash {tasks:.0f} B"
        )
        # Where the bytes go: the zset entry (id + score + skiplist node + dict entry), the
        # hash entry (id again + record + dict entry), and what neither key holds (the
        # allocator's rounding and the main dict's growth) by difference. A waiting task
        # has no attempts entry (written by its first claim) and no error.
        rep.line(
            f"{'':12s} per task: total {per_task:.0f} B = zset entry {zset:.0f} "
            f"(id {id_len} B + overhead {zset - id_len:.0f}) + hash entry {tasks:.0f} "
            f"(id {id_len} B + record {record} B + overhead {tasks - id_len - record:.0f}) "
            f"+ other {per_task - zset - tasks:.0f}; attempts entry 0 while waiting"
        )
        rep.figure(
            f"{flavour}-{ids}",
            {
                "n": n,
                "server": short_version(srv),
                "used_memory_delta": used - base,
                "per_task": per_task,
                "beyond_payload": beyond,
                "payload_bytes": payload_bytes,
                "record_bytes": record,
                "id_chars": id_len,
                "memory_usage_per_task": {k: v / n for k, v in per_key.items()},
            },
        )
        if flavour == "valkey":
            rep.bar(
                f"Valkey 8, {ids} ids: bytes per waiting task beyond payload",
                beyond,
                "<=",
                BAR_BYTES,
                "B",
            )


def finished(rep: Report, flavour: str, keep: str, n: int) -> None:
    """used_memory per task done and held for the dedupe window (see the docstring)."""
    name = f"mem-{secrets.token_hex(3)}"
    with fresh_server(flavour, appendonly=False) as srv:
        meter = client(srv.url)
        for script in ("schedule", "claim", "ack", "shards"):
            meter.script_load(SCRIPTS[script].source)
        time.sleep(0.2)
        base = _used(meter)
        with Queue(name, url=srv.url, keep_finished=keep) as q:  # type: ignore[arg-type]
            payload_bytes = len(q.core.codec.encode(FINISHED_PAYLOAD))
            ids = q.schedule_many(TaskSpec(KIND, FINISHED_PAYLOAD) for _ in range(n))
            run = SyncRunner(q.client)
            while got := run.run(leasing.claim(q.core, limit=500, lease_ms=600_000)).tasks:
                leases = [(c.id, c.token) for c in got]
                now = time.time() * 1000
                kinds = [
                    (tombstone_prefix(c.header.attempts, c.header.due_ms, now), c.header.kind, "")
                    for c in got
                ]
                run.run(leasing.ack(q.core, leases, finished=kinds))
            keys = q.core.keys
            id_len = len(ids[0])
        time.sleep(0.5)
        used = _used(meter)
        done = int(meter.zcard(keys.done))
        per_key = {
            k: int(meter.memory_usage(getattr(keys, k), samples=0) or 0) / max(done, 1)
            for k in ("done", "tasks", "attempts")
        }
        meter.close()
        per_task = (used - base) / n
        rep.line(
            f"{short_version(srv):12s} {keep:9s}: {done:,} done ({id_len}-char ids, payload "
            f"{payload_bytes} B): {per_task:.0f} B/task (MEMORY USAGE per task: done zset "
            f"{per_key['done']:.0f}, tasks hash {per_key['tasks']:.0f}, attempts hash "
            f"{per_key['attempts']:.0f})"
        )
        rep.figure(
            f"finished-{flavour}-{keep}",
            {"n": n, "server": short_version(srv), "per_task": per_task, "per_key": per_key},
        )
        if keep == "tombstone":
            rep.bar(
                f"{short_version(srv)}: bytes per finished task (tombstone, no result)",
                per_task,
                "<=",
                FINISHED_BARS[flavour],
                "B",
            )
