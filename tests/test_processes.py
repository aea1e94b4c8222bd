"""``delayq worker APP --processes N``: a real supervisor and real worker processes, found
by PID (children of the supervisor, from /proc), on a private server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from delayq import Queue
from delayq.embedded import free_port

from .conftest import ROOT
from .support.helpers import wait_for

APP = "tests.support.apps.processes_app:worker"
STUCK_APP = "tests.support.apps.stuck_app:worker"


def children(pid: int) -> set[int]:
    """The live child processes of ``pid`` (zombies left out), read from /proc."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()  # after the command's name
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


class Supervised:
    """``python -m delayq worker APP --processes N ...``, its output in a file."""

    def __init__(self, app: str, env: dict[str, str], *args: str) -> None:
        self.out = tempfile.NamedTemporaryFile(prefix="delayq-sup-", suffix=".log")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "delayq", "worker", app, "--log-level", "info", *args],
            cwd=ROOT,
            env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            stdout=self.out,
            stderr=subprocess.STDOUT,
        )
        self.seen: set[int] = set()  # every child pid seen, to stop them all at the end

    def children(self) -> set[int]:
        now = children(self.proc.pid)
        self.seen |= now
        return now

    def output(self) -> str:
        return Path(self.out.name).read_text(errors="replace")

    def n_children(self, n: int, without: int = 0) -> set[int] | None:
        """The children, once there are ``n`` of them and ``without`` is not one."""
        now = self.children()
        return now if len(now) == n and without not in now else None

    def serving(self, n: int) -> bool:
        return self.output().count("is serving") >= n

    def close(self) -> None:
        for pid in [self.proc.pid, *self.seen, *self.children()]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)
        self.out.close()


@pytest.fixture
def supervise() -> Iterator[Any]:
    started: list[Supervised] = []

    def start(app: str, env: dict[str, str], *args: str) -> Supervised:
        s = Supervised(app, env, *args)
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


@pytest.fixture
def setup(make_server: Any, tmp_path: Path, qname: str) -> Iterator[tuple[Queue, dict[str, str]]]:
    srv = make_server(appendonly=False)
    queue = Queue(qname, url=srv.url)
    log = tmp_path / "runs.log"
    log.touch()
    yield queue, {"DQ_QUEUE": qname, "DELAYQ_REDIS_URL": srv.url, "DQ_LOG": str(log)}
    queue.close()


def runs(env: dict[str, str]) -> list[tuple[str, str, int]]:
    lines = Path(env["DQ_LOG"]).read_text().splitlines()
    return [(w, tid, int(pid)) for w, tid, pid in (line.split() for line in lines)]


def test_a_killed_worker_process_is_replaced_and_nothing_is_lost(
    setup: tuple[Queue, dict[str, str]], supervise: Any
) -> None:
    queue, env = setup
    before = queue.schedule_many(
        [{"kind": "rec", "payload": {"sleep": 0.05}, "delay": i * 0.01} for i in range(300)]
    )
    sup = supervise(APP, env, "--processes", "3")
    wait_for(lambda: sup.serving(3), timeout=30)
    first = wait_for(lambda: sup.n_children(3), timeout=10)
    wait_for(lambda: len(runs(env)) >= 60, timeout=30)  # they are working
    victim = sorted(first)[0]
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    replaced = wait_for(lambda: sup.n_children(3, without=victim), timeout=10, interval=0.01)
    assert time.monotonic() - killed_at < 2.0, "not replaced within 2 s"
    assert len(replaced - first) == 1
    after = queue.schedule_many([{"kind": "rec", "payload": {}} for _ in range(100)])
    wanted = set(before) | set(after)
    # The killed one's tasks come back when their lease (5 s) ends.
    wait_for(lambda: wanted <= {t for w, t, _ in runs(env) if w == "end"}, timeout=60)
    assert "was killed by SIGKILL" in sup.output()
    os.kill(sup.proc.pid, signal.SIGTERM)
    assert sup.proc.wait(40) == 0, sup.output()


def test_sigterm_lets_every_worker_process_finish_its_tasks_then_exits_0(
    setup: tuple[Queue, dict[str, str]], supervise: Any
) -> None:
    queue, env = setup
    ids = queue.schedule_many([{"kind": "rec", "payload": {"sleep": 3}} for _ in range(8)])
    sup = supervise(APP, env, "--processes", "2")
    wait_for(lambda: sup.serving(2), timeout=30)
    kids = wait_for(lambda: sup.n_children(2), timeout=10)
    wait_for(lambda: len(runs(env)) == 8, timeout=30)  # 8 started, 4 per process
    assert {pid for _, _, pid in runs(env)} == kids
    os.kill(sup.proc.pid, signal.SIGTERM)
    assert sup.proc.wait(40) == 0, sup.output()
    ran = runs(env)
    started = {(t, p) for w, t, p in ran if w == "start"}
    ended = {(t, p) for w, t, p in ran if w == "end"}
    assert started == ended and {t for t, _ in ended} == set(ids)  # finished, not cut off
    assert queue.stats().done == 8  # and acked, not handed back
    assert not any(alive(pid) for pid in kids)
    assert "SIGTERM received" in sup.output()


def test_an_app_that_cannot_be_imported_fails_at_once(
    setup: tuple[Queue, dict[str, str]], supervise: Any
) -> None:
    _, env = setup
    t0 = time.monotonic()
    sup = supervise("tests.support.apps.no_such_module:worker", env, "--processes", "3")
    assert sup.proc.wait(30) != 0
    assert time.monotonic() - t0 < 15
    out = sup.output()
    assert "cannot import 'tests.support.apps.no_such_module'" in out, out
    assert "started (pid" not in out  # no worker process was started


def test_worker_processes_that_keep_failing_at_start_stop_the_supervisor(
    setup: tuple[Queue, dict[str, str]], supervise: Any, tmp_path: Path
) -> None:
    _, env = setup
    count = tmp_path / "imports"
    t0 = time.monotonic()
    sup = supervise(
        "tests.support.apps.start_fails_app:worker", {**env, "DQ_COUNT": str(count)},
        "--processes", "2",
    )  # fmt: skip
    assert sup.proc.wait(60) == 1, sup.output()
    assert time.monotonic() - t0 < 30
    out = sup.output()
    assert "cannot start in a worker process (on purpose)" in out
    assert "keep failing at start" in out
    # The supervisor's import, then a few per slot at most: no restart loop.
    imports = len(count.read_text().splitlines())
    assert 1 + 3 <= imports <= 1 + 2 * 3, imports


def _scrape(port: int) -> list[tuple[str, dict[str, str], float]]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def test_metrics_of_every_worker_process_on_one_port(
    setup: tuple[Queue, dict[str, str]], supervise: Any
) -> None:
    queue, env = setup
    dirs_before = set(Path(tempfile.gettempdir()).glob("delayq-metrics-*"))
    port = free_port()
    ids = queue.schedule_many([{"kind": "rec", "payload": {"sleep": 0.05}} for _ in range(100)])
    sup = supervise(APP, env, "--processes", "2", "--metrics-port", str(port))
    wait_for(lambda: queue.stats().done == 100, timeout=60)
    assert len({pid for _, _, pid in runs(env)}) == 2  # both did some of the work
    samples = _scrape(port)
    succeeded = [
        (lab, v)
        for n, lab, v in samples
        if n == "delayq_tasks_succeeded_total" and lab.get("kind") == "rec"
    ]
    assert succeeded == [({"queue": queue.name, "kind": "rec"}, 100.0)]  # summed, one series
    # The queue's gauges are read by the supervisor, once: not one per child.
    done = [v for n, lab, v in samples if n == "delayq_queue_done" and lab["queue"] == queue.name]
    assert done == [len(ids)]
    os.kill(sup.proc.pid, signal.SIGTERM)
    assert sup.proc.wait(40) == 0, sup.output()
    assert set(Path(tempfile.gettempdir()).glob("delayq-metrics-*")) == dirs_before  # removed


def test_a_second_signal_makes_every_worker_process_hand_back_at_once(
    setup: tuple[Queue, dict[str, str]], supervise: Any
) -> None:
    queue, env = setup
    ids = queue.schedule_many([{"kind": "rec", "payload": {"sleep": 60}} for _ in range(4)])
    sup = supervise(APP, env, "--processes", "2")
    wait_for(lambda: sup.serving(2), timeout=30)
    wait_for(lambda: len(runs(env)) == 4, timeout=30)
    os.kill(sup.proc.pid, signal.SIGTERM)
    time.sleep(1.0)
    t0 = time.monotonic()
    os.kill(sup.proc.pid, signal.SIGINT)
    assert sup.proc.wait(30) == 0, sup.output()
    assert time.monotonic() - t0 < 15  # not the 20 s grace, nor the 60 s handlers
    assert "second signal" in sup.output()
    # Handed back, not counted: waiting to run again.
    infos = [queue.get(i) for i in ids]
    assert all(i is not None and i.state == "scheduled" for i in infos), infos


def test_process_count_and_exit_reasons() -> None:
    from delayq.errors import ConfigurationError
    from delayq.processes.supervisor import exit_reason, process_count

    assert process_count("auto") == len(os.sched_getaffinity(0))
    assert process_count("3") == 3
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(ConfigurationError, match="--processes takes a number"):
            process_count(bad)
    assert exit_reason(-signal.SIGKILL) == "was killed by SIGKILL"
    assert exit_reason(3) == "exited with code 3"
    out = subprocess.run(
        [sys.executable, "-m", "delayq", "worker", APP, "--processes", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 2 and "--processes takes a number" in out.stderr


def test_a_worker_process_with_a_stuck_sync_handler_is_recycled(
    setup: tuple[Queue, dict[str, str]], supervise: Any
) -> None:
    """``--recycle-stuck 1``: a sync handler runs past its 0.3 s timeout and never returns.
    A second later its process stops gracefully, handing back the task it had claimed ahead,
    and exits; the supervisor starts another at once, which runs that task once."""
    queue, env = setup
    sup = supervise(STUCK_APP, env, "--processes", "1", "--recycle-stuck", "1")
    wait_for(lambda: sup.serving(1), timeout=30)
    (first,) = wait_for(lambda: sup.n_children(1), timeout=10)
    hung = queue.schedule("stuck", None)
    later = queue.schedule("rec", None, delay=4)  # claimed ahead by the first process
    wait_for(lambda: queue.stats().active == 2, timeout=10)
    (second,) = wait_for(lambda: sup.n_children(1, without=first), timeout=15)
    assert not alive(first)
    wait_for(lambda: ("rec", later) in {(k, t) for k, t, _ in runs(env)}, timeout=20)
    ran = runs(env)
    assert [(k, t, p) for k, t, p in ran if t == later] == [("rec", later, second)]
    assert [(k, t, p) for k, t, p in ran if t == hung] == [("stuck", hung, first)]
    out = sup.output()
    assert "runs on past its timeout of 0.3 s" in out
    assert "recycling this worker process" in out and "recycled itself" in out
    assert queue.stats().counters.get("released", 0) == 1  # the task claimed ahead
    assert queue.get(hung).state == "scheduled"  # its retry, written at the timeout
    os.kill(sup.proc.pid, signal.SIGTERM)
    assert sup.proc.wait(40) == 0, out
