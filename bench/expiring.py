"""Expiring keys: callback lateness and losses, delayq beside the plain keyspace-event recipe.

On one fresh server (``notify-keyspace-events Ex``), two sets of keys with the same
deadlines, falling due evenly for 10 s starting ~2 s after the last set, each key's TTL
computed from its deadline when it is set:

- delayq: ``queue.expiring.set`` keys and one worker process (``worker_proc.py --mode
  expire``) whose async ``on_expire`` callback records ``time.time() -
  expired.deadline.timestamp()``, the key and ``expired.via``;
- the plain recipe: ``SET key value PX ms`` keys (the deadline in the key's name) and one
  subscriber process (``keyevent_sub.py``, redis-py only) on ``__keyevent@0__:expired``
  recording arrival time minus the deadline.

Both processes append every arrival to a file as it happens, so a killed one leaves what it
saw. A listener in the runner (never restarted) counts the plain keys' expired events as
the server publishes them: once all have been published and the subscriber had a second
to catch up, nothing more can arrive. Otherwise a key not delivered within 30 s after the
last deadline is missing. Run twice: undisturbed, then with both processes SIGKILLed half
way through the window and restarted a second later. Then ``used_memory`` per watched key
against a plain key with the same value and TTL, on fresh servers (AOF off), Valkey 8.1
and Redis 7.0.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from common import (
    BENCH_DIR,
    Report,
    WorkerProcess,
    client,
    fresh_server,
    percentile,
    short_version,
    wait_until,
)

from delayq import Queue
from delayq.expiring.ops import encode_value
from delayq.scripts import SCRIPTS

NAME = "expiring"
TITLE = "Expiring keys: callback lateness and losses, delayq beside the plain recipe"

COUNT = 10_000  # keys of each kind (1,000 with --quick)
DURATION = 10.0  # seconds over which they expire, evenly (1 s with --quick)
LEAD = 2.0  # the first deadline is this long after the last set (estimated beforehand)
CALIBRATE = 200  # throwaway pairs of sets timed to estimate how long the sets take
KILL_AT = 0.5  # restart run: both processes are SIGKILLed this far into the window ...
DOWN_FOR = 1.0  # ... and started again this much later (not scaled by --quick)
GRACE = 30.0  # a key not delivered this long after the last deadline is missing
PLAIN_SETTLE = 1.0  # once the server has published every plain key's event
CONCURRENCY = 64
LEASE = 5.0  # the worker's lease: a killed worker's claimed keys run again after this
VALUE = {"order": 123456, "user": 42}
MEM_COUNT = 100_000  # 10,000 with --quick
MEM_TTL_MS = 3_600_000  # nothing expires while memory is measured
P99_BAR_MS = 10.0


def run(rep: Report) -> None:
    n = rep.n(COUNT)
    duration = DURATION * rep.scale
    rep.line(
        f"{n:,} delayq watched keys and {n:,} plain keys (value {VALUE}), the same deadlines "
        f"spread evenly over {duration:g} s, the first ~{LEAD:g} s after the last set"
    )
    rep.line(
        f"delayq: one worker process, async on_expire callback, concurrency {CONCURRENCY}, "
        f"lease {LEASE:g} s; plain: SET key value PX ms + one redis-py subscriber process on "
        f"__keyevent@0__:expired; both on one server, at the same time"
    )
    with fresh_server() as srv:
        meter = client(srv.url)
        meter.config_set("notify-keyspace-events", "Ex")
        rep.line(f"server: {short_version(srv)}, AOF everysec, notify-keyspace-events Ex")
        try:
            pair(rep, srv.url, n, duration, restart=False)
            pair(rep, srv.url, n, duration, restart=True)
        finally:
            meter.close()
    memory(rep, rep.n(MEM_COUNT))


# -- processes --------------------------------------------------------------------------------


class SubscriberProcess(WorkerProcess):
    """``bench/keyevent_sub.py`` in its own interpreter; the same start/stop/report as a
    worker process (it prints ``ready``, stops on SIGTERM or stdin EOF, writes JSON)."""

    def __init__(self, url: str, prefix: str, events: str) -> None:
        super().__init__(url, "unused")
        self.argv = [
            self.argv[0],
            str(BENCH_DIR / "keyevent_sub.py"),
            "--url",
            url,
            "--prefix",
            prefix,
            "--events",
            events,
            "--out",
            self.out_path,
        ]


def expire_worker(url: str, queue: str, pattern: str, events: str, log: str) -> WorkerProcess:
    w = WorkerProcess(url, queue, mode="expire", concurrency=CONCURRENCY, lease=LEASE)
    w.argv += ["--pattern", pattern, "--events", events, "--log", log]
    return w


def kill_now(proc: WorkerProcess) -> dict[str, Any]:
    """SIGKILL by PID (no report, no cleanup: a crash), then reap it."""
    if proc.pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    return proc.stop(timeout=10)


def start_all(procs: list[WorkerProcess]) -> dict[int, float]:
    """Start the processes at once (each waits for its own ``ready``); when each was ready."""
    ready: dict[int, float] = {}
    errors: list[BaseException] = []

    def one(i: int, p: WorkerProcess) -> None:
        try:
            p.start()
            ready[i] = time.time()
        except BaseException as e:  # re-raised below, in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i, p), daemon=True) for i, p in enumerate(procs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    if len(ready) != len(procs):
        raise RuntimeError("a process did not start within 60 s")
    return ready


class Referee:
    """The runner's own listener on the expired channel, never restarted: it sees the plain
    keys' events as the server publishes them, so the benchmark knows when no more can come."""

    def __init__(self, url: str, prefix: str) -> None:
        self.r = client(url)
        self.pubsub = self.r.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe("__keyevent@0__:expired")
        while True:  # the subscribe confirmation
            msg = self.pubsub.get_message(timeout=5)
            if msg is None or msg["type"] == "subscribe":
                break
        self.prefix = prefix.encode()
        self.published: set[bytes] = set()
        self.last_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while not self._stop.is_set():
            msg = self.pubsub.get_message(timeout=0.2)
            if msg and msg["type"] == "message" and msg["data"].startswith(self.prefix):
                self.published.add(msg["data"])
                self.last_at = time.time()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            self.pubsub.close()
            self.r.close()


def read_events(path: str) -> list[list[str]]:
    with contextlib.suppress(FileNotFoundError), open(path) as f:
        return [line.rstrip("\n").split("\t") for line in f if line.endswith("\n")]
    return []


# -- one run of the pair -------------------------------------------------------------------------


@dataclass
class Side:
    """What one side (delayq or plain) delivered in one run."""

    name: str
    n: int
    first: dict[int, float] = field(default_factory=dict)  # key index -> first lateness (s)
    runs: Counter[int] = field(default_factory=Counter)
    via: Counter[str] = field(default_factory=Counter)
    stray: int = 0  # arrivals for keys not of this run

    def add(self, index: int | None, late: float, via: str = "") -> None:
        if index is None or not 0 <= index < self.n:
            self.stray += 1
            return
        self.runs[index] += 1
        self.first.setdefault(index, late)
        if via:
            self.via[via] += 1

    @property
    def once(self) -> int:
        return sum(1 for c in self.runs.values() if c == 1)

    @property
    def duplicated(self) -> int:
        return sum(1 for c in self.runs.values() if c > 1)

    @property
    def extra_runs(self) -> int:
        return sum(c - 1 for c in self.runs.values() if c > 1)

    @property
    def missing(self) -> int:
        return self.n - len(self.runs)

    def lateness_ms(self, indexes: range | None = None) -> list[float]:
        idx = self.first if indexes is None else (i for i in indexes if i in self.first)
        return sorted(self.first[i] * 1000 for i in idx)


def stats_of(lat: list[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "max_ms": lat[-1] if lat else float("nan"),
    }


def fmt_lat(lat: list[float]) -> str:
    s = stats_of(lat)
    return f"p50 {s['p50_ms']:.2f}  p99 {s['p99_ms']:.2f}  max {s['max_ms']:.2f}"


@dataclass
class Outcome:
    """One run of the pair: what each side delivered, and when things happened."""

    n: int
    t0: float  # first deadline
    step: float  # seconds between deadlines
    last: float  # last deadline
    dq: Side
    plain: Side
    finished: bool = False
    done: int = 0  # delayq stats at the end
    dead: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    left: str = ""  # what the queue still holds at the end
    warnings: Counter[str] = field(default_factory=Counter)
    published: int = 0  # plain keys' expired events the server published
    graceful: list[int] = field(default_factory=list)  # arrivals in the final JSON reports
    exit_codes: list[int | None] = field(default_factory=list)  # of the graceful stops
    kill_at: float = 0.0
    restarted_at: float = 0.0
    ready: dict[int, float] = field(default_factory=dict)  # 0 worker, 1 subscriber

    def index_at(self, t: float) -> int:
        """How many deadlines fall before ``t``."""
        return max(0, min(self.n, int((t - self.t0) / self.step) + 1)) if t >= self.t0 else 0


class Pair:
    """The worker and the subscriber of one run, their event files, and the sets."""

    def __init__(self, url: str, n: int, duration: float) -> None:
        self.url = url
        self.n = n
        self.duration = duration
        self.tag = secrets.token_hex(3)
        self.queue_name = f"exp-{self.tag}"
        self.wprefix = f"xw{self.tag}:"  # watched keys: xw<tag>:<index>
        self.pprefix = f"xp{self.tag}:"  # plain keys:   xp<tag>:<index>:<deadline ms>
        self.files: list[str] = []
        self.wev: list[str] = []
        self.sev: list[str] = []
        self.logs: list[str] = []
        self.procs: list[WorkerProcess] = []
        self.reports: list[dict[str, Any]] = []

    def _tmp(self, what: str) -> str:
        fd, path = tempfile.mkstemp(prefix=f"delayq-bench-{what}-", suffix=".tsv")
        os.close(fd)
        self.files.append(path)
        return path

    def new_procs(self) -> list[WorkerProcess]:
        self.wev.append(self._tmp("expire"))
        self.sev.append(self._tmp("keyevent"))
        self.logs.append(self._tmp("log"))
        self.procs = [
            expire_worker(
                self.url, self.queue_name, self.wprefix + "*", self.wev[-1], self.logs[-1]
            ),
            SubscriberProcess(self.url, self.pprefix, self.sev[-1]),
        ]
        return self.procs

    def kill(self) -> None:
        self.reports += [kill_now(p) for p in self.procs]

    def stop(self) -> None:
        self.reports += [p.stop() for p in self.procs]

    def set_keys(self, queue: Queue, r: Any) -> tuple[float, float]:
        """Set both kinds of keys, deadlines in order; returns (first deadline, sets' end)."""
        data = encode_value(queue.core, VALUE)  # the very bytes delayq stores in the key
        # Time a few throwaway pairs of sets (deleted again, so they never expire).
        # A queue of their own, so the measured queue's counters stay clean.
        k = min(CALIBRATE, self.n)
        with Queue(f"cal-{self.tag}", client=queue.client) as cal:
            c0 = time.perf_counter()
            for i in range(k):
                cal.expiring.set(f"cal{self.tag}:{i}", VALUE, ttl=3600)
                r.set(f"cap{self.tag}:{i}", data, px=MEM_TTL_MS)
            per_pair = (time.perf_counter() - c0) / k
            for i in range(k):
                cal.expiring.delete(f"cal{self.tag}:{i}")
        r.delete(*(f"cap{self.tag}:{i}" for i in range(k)))

        t0 = time.time() + LEAD + 1.5 * per_pair * self.n
        step = self.duration / self.n
        for i in range(self.n):
            d = t0 + i * step
            if d - time.time() < 0.05:
                raise RuntimeError(f"the sets fell behind the deadlines at key {i:,}")
            queue.expiring.set(f"{self.wprefix}{i}", VALUE, ttl=d - time.time())
            d_ms = round(d * 1000)
            r.set(f"{self.pprefix}{i}:{d_ms}", data, px=max(1, round(d_ms - time.time() * 1000)))
        return t0, time.time()

    def collect(self) -> tuple[Side, Side]:
        dq = Side("delayq", self.n)
        for path in self.wev:
            for key, late, via in read_events(path):
                idx = key[len(self.wprefix) :] if key.startswith(self.wprefix) else ""
                dq.add(int(idx) if idx.isdigit() else None, float(late), via)
        plain = Side("plain", self.n)
        for path in self.sev:
            for key, late in read_events(path):
                parts = key[len(self.pprefix) :].split(":") if key.startswith(self.pprefix) else []
                plain.add(int(parts[0]) if parts and parts[0].isdigit() else None, float(late))
        return dq, plain

    def warnings(self) -> Counter[str]:
        """The workers' warnings, by kind (task ids and numbers blanked out)."""
        kinds: Counter[str] = Counter()
        for path in self.logs:
            with contextlib.suppress(FileNotFoundError), open(path) as f:
                for line in f:
                    msg = line.rstrip("\n").partition(" ")[2]
                    if msg and not msg.startswith(" "):  # skip traceback lines
                        kinds[re.sub(r"\d+", "N", re.sub(r"x:\S+", "<task>", msg))[:110]] += 1
        return kinds

    def cleanup(self) -> None:
        for path in self.files:
            with contextlib.suppress(OSError):
                os.unlink(path)


def pair(rep: Report, url: str, n: int, duration: float, *, restart: bool) -> None:
    label = "restart" if restart else "steady"
    p = Pair(url, n, duration)
    referee: Referee | None = None
    r = client(url)
    out: Outcome | None = None
    try:
        start_all(p.new_procs())
        referee = Referee(url, p.pprefix)
        with Queue(p.queue_name, url=url) as queue:
            s0 = time.time()
            t0, s1 = p.set_keys(queue, r)
            rep.line()
            rep.line(
                f"{label}: {n:,} + {n:,} sets took {s1 - s0:.2f} s (timing included); first "
                f"deadline {t0 - s1:.2f} s after the last set"
            )
            step = duration / n
            out = Outcome(n, t0, step, t0 + (n - 1) * step, Side("delayq", n), Side("plain", n))
            if restart:
                time.sleep(max(0.0, t0 + KILL_AT * duration - time.time()))
                out.kill_at = time.time()
                p.kill()
                procs = p.new_procs()
                time.sleep(max(0.0, out.kill_at + DOWN_FOR - time.time()))
                out.restarted_at = time.time()
                out.ready = start_all(procs)
            out.finished = wait_until(
                lambda: settled(out, p, queue, referee),
                timeout=max(0.0, out.last + GRACE - time.time()),
                interval=0.25,
            )
            st = queue.stats()
            out.done, out.dead, out.counters = st.done, st.dead, dict(st.counters)
            if st.scheduled or st.active:
                nxt = st.next_due_at.timestamp() - time.time() if st.next_due_at else 0.0
                out.left = (
                    f"{st.scheduled:,} waiting (next due in {nxt:.0f} s), {st.active:,} leased"
                )
    finally:
        p.stop()
        if referee:
            referee.close()
        r.close()
        if out is not None:
            out.published = len(referee.published) if referee else 0
            out.dq, out.plain = p.collect()
            out.warnings = p.warnings()
            out.graceful = [int(rep_.get("started", 0)) for rep_ in p.reports[-2:]]
            out.exit_codes = [rep_.get("exit_code") for rep_ in p.reports[-2:]]
        p.cleanup()
    assert out is not None
    report_common(rep, out)
    if restart:
        report_restart(rep, out)
    else:
        report_steady(rep, out, duration)


def settled(out: Outcome, p: Pair, queue: Queue, referee: Referee | None) -> bool:
    """Everything that can still arrive has: delayq acked (or buried) every key; the plain
    subscriber saw every key, or the server published them all a while ago."""
    if time.time() <= out.last:
        return False
    st = queue.stats()
    if st.done + st.dead < out.n:
        return False
    if sum(len(read_events(path)) for path in p.sev) >= out.n:
        return True
    assert referee is not None
    return len(referee.published) >= out.n and time.time() - referee.last_at > PLAIN_SETTLE


def report_common(rep: Report, out: Outcome) -> None:
    rep.line(
        f"{'':9s}cross-check: final JSON reports {out.graceful[0]:,} + {out.graceful[1]:,} "
        f"arrivals; delayq stats done {out.done:,}, dead {out.dead}; plain events published "
        f"{out.published:,} of {out.n:,}"
        f"{'' if out.finished else f'; TIMED OUT ({GRACE:g} s after the last deadline)'}"
    )
    if any(code != 0 for code in out.exit_codes):
        rep.line(f"{'':9s}exit codes after SIGTERM (worker, subscriber): {out.exit_codes}")
    counters = ", ".join(
        f"{k} {v:,}" for k, v in sorted(out.counters.items()) if k not in ("claim_seq",)
    )
    rep.line(f"{'':9s}delayq queue counters: {counters}")
    if out.left:
        rep.line(f"{'':9s}delayq tasks not finished at the end: {out.left}")
    if out.warnings:
        rep.line(f"{'':9s}delayq worker warnings ({sum(out.warnings.values()):,}):")
        for msg, count in out.warnings.most_common(4):
            rep.line(f"{'':11s}{count:6,} x {msg}")
    for side in (out.dq, out.plain):
        via = ""
        if side.via:
            via = "; via " + ", ".join(f"{k} {v:,}" for k, v in sorted(side.via.items()))
        stray = f", {side.stray} stray" if side.stray else ""
        rep.line(
            f"{'':9s}{side.name:6s}: delivered {len(side.runs):,} of {out.n:,} (once "
            f"{side.once:,}, duplicated {side.duplicated:,} keys / {side.extra_runs:,} extra "
            f"runs), missing {side.missing:,}{via}{stray}"
        )


def side_figure(side: Side) -> dict[str, Any]:
    return {
        "delivered": len(side.runs),
        "once": side.once,
        "duplicated": side.duplicated,
        "extra_runs": side.extra_runs,
        "missing": side.missing,
        "via": dict(side.via),
    }


def tenths_of(n: int) -> list[range]:
    return [range(n * i // 10, n * (i + 1) // 10) for i in range(10)]


def report_steady(rep: Report, out: Outcome, duration: float) -> None:
    fig: dict[str, Any] = {"n": out.n, "duration_s": duration, "finished": out.finished}
    for side in (out.dq, out.plain):
        lat = side.lateness_ms()
        rep.line(f"{'':9s}{side.name:6s} lateness ms (first delivery): {fmt_lat(lat)}")
        tenths = [percentile(side.lateness_ms(idx), 99) for idx in tenths_of(out.n)]
        rep.line(
            f"{'':9s}{'':6s} p99 ms per tenth of the window: "
            + " | ".join(f"{v:.0f}" if v >= 10 else f"{v:.1f}" for v in tenths)
        )
        fig[side.name] = {**stats_of(lat), **side_figure(side), "p99_ms_by_tenth": tenths}
    rep.figure("steady", fig)
    complete = out.finished and out.dq.missing == 0
    p99 = percentile(out.dq.lateness_ms(), 99) if complete else float("nan")
    rep.bar(f"delayq p99 lateness, {out.n:,} keys over {duration:g} s", p99, "<=", P99_BAR_MS, "ms")


def report_restart(rep: Report, out: Outcome) -> None:
    """Deadlines before the kill, while the side was down (until ready), after restart."""
    k_kill = out.index_at(out.kill_at)
    rep.line(
        f"{'':9s}both SIGKILLed {out.kill_at - out.t0:.2f} s into the window, started again "
        f"{out.restarted_at - out.kill_at:.2f} s later; ready {out.ready[0] - out.kill_at:.2f} s "
        f"(worker) and {out.ready[1] - out.kill_at:.2f} s (subscriber) after the kill"
    )
    fig: dict[str, Any] = {
        "n": out.n,
        "finished": out.finished,
        "killed_at_s": out.kill_at - out.t0,
    }
    for i, side in enumerate((out.dq, out.plain)):
        k_up = out.index_at(out.ready[i])
        groups = {
            "before the kill": range(0, k_kill),
            "while down": range(k_kill, k_up),
            "after restart": range(k_up, out.n),
        }
        fig[side.name] = {**side_figure(side), "down_s": out.ready[i] - out.kill_at}
        for gname, idx in groups.items():
            got = sum(1 for j in idx if j in side.runs)
            lat = side.lateness_ms(idx)
            rep.line(
                f"{'':9s}{side.name:6s} deadline {gname:15s}: {len(idx):6,} keys, delivered "
                f"{got:6,}, lost {len(idx) - got:6,}; lateness ms {fmt_lat(lat)}"
            )
            fig[side.name][gname.replace(" ", "_")] = {
                "keys": len(idx),
                "delivered": got,
                **stats_of(lat),
            }
    rep.figure("restart", fig)


# -- memory -------------------------------------------------------------------------------------


def _used(r: Any) -> int:
    return int(r.info("memory")["used_memory"])


def memory(rep: Report, n: int) -> None:
    rep.line()
    rep.line(
        f"memory: {n:,} keys with TTL {MEM_TTL_MS // 1000} s, value {VALUE}, 11-character "
        "names, on fresh servers (AOF off); used_memory delta per key"
    )
    for flavour in ("valkey", "redis"):
        plain, _ = mem_one(flavour, n, delayq=False)
        watched, extra = mem_one(flavour, n, delayq=True)
        over = (watched - plain) / n
        server = extra["server"]
        rep.line(
            f"{server:12s} plain SET PX: {plain / n:.0f} B/key; delayq watched: "
            f"{watched / n:.0f} B/key -> delayq's overhead {over:.0f} B per watched key"
        )
        rep.line(
            f"{'':12s} delayq record {extra['record']} B; MEMORY USAGE per key: "
            + ", ".join(f"{k} {v / n:.0f} B" for k, v in extra["usage"].items())
        )
        rep.figure(
            f"memory-{flavour}",
            {
                "n": n,
                "server": server,
                "plain_per_key": plain / n,
                "watched_per_key": watched / n,
                "overhead_per_key": over,
                "record_bytes": extra["record"],
                "memory_usage_per_key": {k: v / n for k, v in extra["usage"].items()},
            },
        )


def mem_one(flavour: str, n: int, *, delayq: bool) -> tuple[int, dict[str, Any]]:
    """used_memory delta for ``n`` keys (watched through delayq, or plain), and details."""
    tag = secrets.token_hex(3)
    extra: dict[str, Any] = {}
    with fresh_server(flavour, appendonly=False) as srv:
        extra["server"] = short_version(srv)
        meter = client(srv.url)
        for name in ("expire_set", "stats"):
            meter.script_load(SCRIPTS[name].source)
        time.sleep(0.2)
        base = _used(meter)
        if delayq:
            with Queue(f"mem-{tag}", url=srv.url) as q:
                for i in range(n):
                    q.expiring.set(f"mw:{i:08d}", VALUE, ttl=MEM_TTL_MS / 1000)
                keys = q.core.keys
        else:
            with Queue(f"mem-{tag}", url=srv.url) as q:
                data = encode_value(q.core, VALUE)  # the bytes delayq would store
            producer = client(srv.url)
            for start in range(0, n, 1000):
                pipe = producer.pipeline(transaction=False)
                for i in range(start, min(n, start + 1000)):
                    pipe.set(f"mp:{i:08d}", data, px=MEM_TTL_MS)
                pipe.execute()
            producer.close()
        time.sleep(0.5)  # let the server free the producer's connection and buffers
        used = _used(meter)
        if delayq:
            some = meter.hget(keys.xkeys, "mw:00000000")
            extra["record"] = int(meter.hstrlen(keys.tasks, some or b""))
            extra["usage"] = {
                k: int(meter.memory_usage(getattr(keys, k), samples=0) or 0)
                for k in ("scheduled", "tasks", "xkeys")
            }
            assert int(meter.zcard(keys.scheduled)) == n, "not every watched key was recorded"
        meter.close()
    return used - base, extra
