"""Orchestrating the demo: server, database, worker processes, shoppers, the kill, the report."""

from __future__ import annotations

import heapq
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Group
from rich.live import Live
from rich.table import Table

from delayq.admin.present import console as make_console
from delayq.connection import redact
from delayq.demo import app
from delayq.demo.shop import Audit, Shop
from delayq.queue import Queue

console = make_console()  # piped, the report is laid out as on a wide terminal


@dataclass
class DemoConfig:
    url: str | None = None
    database_url: str | None = None
    duration: float = 20.0  # seconds of placing orders
    rate: float = 40.0  # orders per second
    close_after: float = 3.0  # 15 minutes in real life
    pay_share: float = 0.5
    race_share: float = 0.2  # of the paid orders: pay exactly at the deadline
    workers: int = 3
    lease: float = 2.0
    work_ms: float = 200.0  # the close's call to the payment provider: keeps tasks in flight
    kill: bool = True
    products: int = 20
    stock: int = 1_000_000
    seed: int = field(default_factory=lambda: random.randrange(1 << 30))


@dataclass
class Tally:
    placed: int = 0
    paid: int = 0
    races_won_by_payment: int = 0
    races_won_by_close: int = 0
    kills: list[str] = field(default_factory=list)


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


class WorkerPool:
    """Worker processes (``delayq worker``), logging to files, stopped by PID."""

    def __init__(self, env: dict[str, str], log_dir: Path, url: str, lease: float) -> None:
        self.env = env
        self.log_dir = log_dir
        self.url = url
        self.lease = lease
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "delayq",
                "worker",
                "delayq.demo.app:make_worker",
                "--url",
                self.url,
                "--lease",
                f"{self.lease:g}s",
                "--log-level",
                "warning",
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def stop(self) -> None:
        for p in self.alive():
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def _progress(shop: Shop, queue: Queue, tally: Tally, pool: WorkerPool, t0: float) -> Table:
    counts = shop.counts()
    stats = queue.stats()
    lat = [ms for ms, _ in shop.lateness_ms()]
    t = Table(title=f"delayq demo — {time.time() - t0:5.1f} s", show_header=False)
    t.add_column(justify="left")
    t.add_column(justify="right")
    t.add_row("orders placed", str(tally.placed))
    t.add_row("paid", str(counts.get("paid", 0)))
    t.add_row("closed unpaid (stock returned)", str(counts.get("closed", 0)))
    t.add_row("waiting for payment", str(counts.get("pending", 0)))
    t.add_row("close tasks waiting / running", f"{stats.scheduled} / {stats.active}")
    t.add_row(
        "close lateness p50 / p99", f"{percentile(lat, 50):.1f} / {percentile(lat, 99):.1f} ms"
    )
    t.add_row(
        "worker processes",
        f"{len(pool.alive())} alive"
        + (f", killed {', '.join(tally.kills)}" if tally.kills else ""),
    )
    return t


def run_demo(cfg: DemoConfig) -> int:
    rng = random.Random(cfg.seed)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="delayq-demo-")))
        # Only the server named by --url, never $REDIS_URL: the README promises a demo that
        # needs no Redis, and one that writes nowhere it was not told to.
        url = cfg.url
        if url is None:
            from delayq.embedded import EmbeddedServer

            server = stack.enter_context(EmbeddedServer(data_dir=tmp / "server"))
            url = server.url
            console.print(
                f"[bold]Redis-compatible server[/]: embedded {Path(server.binary).name} "
                f"on {url} (AOF on)"
            )
        else:
            console.print(f"[bold]Redis server[/]: {redact(url)} (--url)")
        db_url = cfg.database_url or f"sqlite:///{tmp / 'shop.db'}"
        console.print(f"[bold]business database[/]: {db_url.split('@')[-1]}")
        shop = Shop(db_url)
        stack.callback(shop.close)
        shop.create(cfg.products, cfg.stock)
        qname = f"demo-orders-{os.getpid()}"
        queue = Queue(qname, url=url)
        stack.callback(queue.close)
        # Runs after the workers have stopped (callbacks run last first), also on Ctrl-C.
        stack.callback(delete_queue_keys, queue)

        env = {
            **os.environ,
            app.QUEUE_ENV: qname,
            app.DB_ENV: db_url,
            app.WORK_ENV: str(cfg.work_ms),
        }
        pool = WorkerPool(env, tmp, url, cfg.lease)
        stack.callback(pool.stop)
        for _ in range(cfg.workers):
            pool.start()
        console.print(
            f"{cfg.workers} worker processes; placing {cfg.rate:g} orders/s "
            f"for {cfg.duration:g} s, "
            f"each closed {cfg.close_after:g} s later unless paid ({cfg.pay_share:.0%} pay, "
            f"{cfg.race_share:.0%} of them exactly at the deadline)"
        )
        tally = Tally()
        t0 = time.time()
        _shop_and_watch(cfg, rng, shop, queue, pool, tally, t0)
        pool.stop()
        return _report(cfg, shop, queue, tally, tmp)
    return 1


def queue_key_patterns(queue: Queue) -> list[str]:
    """SCAN patterns matching every key of ``queue``: its own hash tag and its shards'."""
    prefix, name = queue.core.keys.prefix, queue.name
    return [f"{prefix}:{{{name}}}:*", f"{prefix}:{{{name}#*}}:*"]


def delete_queue_keys(queue: Queue) -> int:
    """Delete every key of ``queue`` (found by SCAN, on every primary of a cluster)."""
    deleted = 0
    for pattern in queue_key_patterns(queue):
        for key in list(queue.client.scan_iter(match=pattern, count=1000)):
            deleted += queue.client.delete(key)
    return deleted


def _shop_and_watch(
    cfg: DemoConfig,
    rng: random.Random,
    shop: Shop,
    queue: Queue,
    pool: WorkerPool,
    tally: Tally,
    t0: float,
) -> None:
    payments: list[tuple[float, int]] = []  # (when, order id)
    next_order = t0
    order_id = 0
    killed = not cfg.kill
    end_of_orders = t0 + cfg.duration
    give_up = end_of_orders + cfg.close_after + cfg.lease * 3 + 30
    with Live(
        _progress(shop, queue, tally, pool, t0),
        console=console,
        refresh_per_second=4,
        transient=False,
    ) as live:
        last_draw = 0.0
        while True:
            now = time.time()
            if now < end_of_orders and now >= next_order:
                order_id += 1
                due = now + cfg.close_after
                if shop.place(order_id, rng.randrange(cfg.products), rng.randint(1, 3), due):
                    queue.schedule(
                        "order.close",
                        {"order_id": order_id, "deadline": due},
                        at=due,
                        task_id=f"order:{order_id}",
                    )
                    tally.placed += 1
                    if rng.random() < cfg.pay_share:
                        at_deadline = rng.random() < cfg.race_share
                        # Around the deadline, some before and some after the close commits.
                        when = (
                            due + rng.uniform(-0.05, 0.4)
                            if at_deadline
                            else now + rng.uniform(0.1, 0.9) * cfg.close_after
                        )
                        heapq.heappush(payments, (when, order_id))
                next_order += 1 / cfg.rate
            while payments and payments[0][0] <= now:
                _, oid = heapq.heappop(payments)
                if shop.pay(oid):
                    tally.paid += 1
                    if not queue.cancel(f"order:{oid}"):
                        # The close task was already claimed: its gate will find the order
                        # paid and discard itself.
                        tally.races_won_by_payment += 1
                else:
                    tally.races_won_by_close += 1  # closed first: the payment is refused
            if not killed and now >= t0 + cfg.duration / 2:
                victim = pool.alive()[0]
                victim.send_signal(signal.SIGKILL)
                tally.kills.append(f"pid {victim.pid}")
                pool.start()
                killed = True
            if now - last_draw > 0.25:
                live.update(_progress(shop, queue, tally, pool, t0))
                last_draw = now
            if now >= end_of_orders and not payments:
                counts = shop.counts()
                if counts.get("pending", 0) == 0 or now > give_up:
                    live.update(_progress(shop, queue, tally, pool, t0))
                    return
            time.sleep(min(0.005, max(0.0, next_order - time.time())))


def _report(cfg: DemoConfig, shop: Shop, queue: Queue, tally: Tally, tmp: Path) -> int:
    audit: Audit = shop.audit()
    counts = shop.counts()
    stats = queue.stats()
    closes = shop.lateness_ms()
    first = [ms for ms, attempt in closes if attempt == 1]
    everything = [ms for ms, _ in closes]
    recovered = stats.counters.get("leases_expired", 0)

    checks = [
        ("every unpaid order closed", audit.pending == 0, f"{audit.pending} still pending"),
        (
            "no paid order closed or restocked",
            audit.paid_restocked == 0,
            f"{audit.paid_restocked} restocked without being closed",
        ),
        (
            "every closed order restocked once",
            audit.closed_not_restocked == 0 and audit.restocked_twice == 0,
            f"{audit.closed_not_restocked} not restocked, {audit.restocked_twice} restocked twice",
        ),
        (
            "stock = start - paid, per product",
            audit.stock_mismatches == 0,
            f"{audit.stock_mismatches} products off",
        ),
        (
            "no order closed before its deadline",
            audit.closed_early == 0,
            f"{audit.closed_early} closed early",
        ),
        (
            "no close task lost or dead",
            stats.scheduled == 0 and stats.active == 0 and stats.dead == 0,
            f"{stats.scheduled} waiting, {stats.active} running, {stats.dead} dead",
        ),
    ]
    t = Table(title="delayq demo — report")
    t.add_column("")
    t.add_column("", justify="right")
    t.add_row("orders placed", str(tally.placed))
    t.add_row("paid (stock sold)", str(counts.get("paid", 0)))
    t.add_row("closed unpaid, stock returned", str(counts.get("closed", 0)))
    t.add_row(
        "races: paid while close in flight / closed first (payment refused)",
        f"{tally.races_won_by_payment} / {tally.races_won_by_close}",
    )
    t.add_row(
        "close lateness p50 / p99 / max (first attempts)",
        f"{percentile(first, 50):.1f} / {percentile(first, 99):.1f} / "
        f"{max(first, default=float('nan')):.1f} ms",
    )
    t.add_row(
        "close lateness max (all, incl. those a killed worker held)",
        f"{max(everything, default=float('nan')):.1f} ms",
    )
    t.add_row("worker killed (SIGKILL)", ", ".join(tally.kills) or "no")
    t.add_row("tasks run again after a lease expired", str(recovered))
    t.add_row("closes retried (any reason)", str(sum(1 for _, a in closes if a > 1)))
    checks_table = Table(show_header=False)
    ok = True
    for name, passed, detail in checks:
        ok = ok and passed
        checks_table.add_row(
            "[green]✓[/]" if passed else "[red]✗[/]", name, "" if passed else f"[red]{detail}[/]"
        )
    console.print(Group(t, checks_table))
    if not ok:
        console.print(f"[bold red]FAILED[/] — worker logs in {tmp} (kept until exit)")
        return 1
    console.print("[bold green]OK[/]: every unpaid order closed once, on time; stock exact.")
    return 0
