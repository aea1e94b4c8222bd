"""The operator commands (schedule, info, task, dead, check) through click's runner on real
servers, and ``info --watch`` once as a real subprocess."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner, Result

from delayq import Fail, Queue, Worker
from delayq.embedded import EmbeddedServer, free_port

from .conftest import ROOT, WorkerThread
from .support.helpers import wait_for


@pytest.fixture
def cli(server: EmbeddedServer) -> Callable[..., Result]:
    """Run ``delayq ARGS`` against the test server (URL from the environment, as users do)."""
    from delayq.cli.main import main

    def run(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
        runner = CliRunner(env={"DELAYQ_REDIS_URL": server.url, "DELAYQ_QUEUE": "", **(env or {})})
        return runner.invoke(main, list(args), input=input, catch_exceptions=False)

    return run


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def bury(queue: Queue, run_worker: Callable[[Worker], WorkerThread], n: int) -> list[str]:
    """``n`` dead tasks, killed for real by a worker (reason: Fail)."""
    ids = queue.schedule_many([{"kind": "bad", "payload": {"n": i}} for i in range(n)])
    worker = Worker(queue, concurrency=4, lease=5)

    @worker.handler("bad")
    def bad(task: Any) -> None:
        raise Fail(f"no good: {task.payload['n']}")

    with run_worker(worker):
        wait_for(lambda: queue.stats().dead == n)
    return ids


# -- schedule and task --------------------------------------------------------------------


def test_schedule_with_a_human_delay_then_show_cancel(
    cli: Callable[..., Result], queue: Queue
) -> None:
    tid = f"order:42:{queue.name}"  # unique on the shared server: show searches every queue
    payload = '{"order_id": 42}'
    args = ["--payload", payload, "--delay", "15m", "--id", tid, "--json"]
    out = as_json(cli("schedule", "-q", queue.name, "order.close", *args))
    assert out["id"] == tid and out["state"] == "scheduled"
    info = queue.get(tid)
    assert info is not None and info.payload == {"order_id": 42} and info.due_at is not None
    ahead = (info.due_at - queue.stats().now).total_seconds()
    assert 890 < ahead <= 900

    shown = as_json(cli("task", "show", tid, "--json"))  # found without --queue
    assert shown["queue"] == queue.name and shown["kind"] == "order.close"
    text = cli("task", "show", tid, "-q", queue.name)
    assert text.exit_code == 0 and "order.close" in text.output and '"order_id": 42' in text.output

    assert cli("task", "cancel", tid, "-q", queue.name).exit_code == 0
    gone = queue.get(tid)
    assert gone is not None and gone.state == "cancelled"  # remembered (issue 32 item 7)
    again = cli("task", "cancel", tid, "-q", queue.name)
    assert again.exit_code == 1 and "is cancelled: only a waiting task" in again.output
    shown = cli("task", "show", tid, "-q", queue.name)
    assert shown.exit_code == 0 and re.search(r"state  cancelled\n", shown.output), shown.output
    assert re.search(r"cancelled  \d{4}-\d\d-\d\dT[\d:.]+\+00:00 \(", shown.output)
    missing = cli("task", "show", "never-" + tid, "-q", queue.name)
    assert missing.exit_code == 1 and "no task" in missing.output


def test_task_show_without_a_queue_passes_over_a_queue_it_cannot_open(
    cli: Callable[..., Result], queue: Queue
) -> None:
    """`task show ID` looks in every queue; one whose stored shard count no delayq wrote
    (another test's, or another program's, on this shared server) made the whole search
    fail ("shards must be a whole number from 1 to 1,024 ... got 2000")."""
    queue.client.hset(f"dq:{{{queue.name}-broken}}:shards", mapping={"n": 2000})
    tid = f"found:{queue.name}"
    queue.schedule("k", {}, task_id=tid, delay=60)
    shown = cli("task", "show", tid, "--json")
    assert shown.exit_code == 0, shown.output
    assert as_json(shown)["queue"] == queue.name
    assert cli("task", "show", tid, "-q", f"{queue.name}-broken").exit_code != 0


def test_schedule_with_a_priority_shows_it(cli: Callable[..., Result], queue: Queue) -> None:
    tid = f"p:{queue.name}"
    out = as_json(cli("schedule", "-q", queue.name, "k", "--priority", "8", "--id", tid, "--json"))
    assert out["priority"] == 8 and queue.get(tid).priority == 8  # type: ignore[union-attr]
    assert "priority" in cli("task", "show", tid, "-q", queue.name).output
    bad = cli("schedule", "-q", queue.name, "k", "--priority", "10")
    assert bad.exit_code == 2 and "--priority" in bad.output


def test_schedule_at_an_iso_time_and_refuses_bad_input(
    cli: Callable[..., Result], queue: Queue
) -> None:
    at = "2030-01-01T02:00:00Z"
    out = as_json(cli("schedule", "-q", queue.name, "report", "--at", at, "--json"))
    assert out["due_at"] == "2030-01-01T02:00:00+00:00"
    naive = cli("schedule", "-q", queue.name, "report", "--at", "2030-01-01T02:00:00")
    assert naive.exit_code == 2 and "UTC offset" in naive.output
    both = cli("schedule", "-q", queue.name, "report", "--at", "1", "--delay", "1s")
    assert both.exit_code == 2 and "not both" in both.output
    bad_json = cli("schedule", "-q", queue.name, "report", "--payload", "{nope")
    assert bad_json.exit_code == 2 and "not JSON" in bad_json.output
    bad_delay = cli("schedule", "-q", queue.name, "report", "--delay", "soon")
    assert bad_delay.exit_code == 2 and "15m" in bad_delay.output
    assert queue.stats().scheduled == 1


def test_schedule_takes_the_queue_from_the_environment_like_every_command(
    cli: Callable[..., Result], queue: Queue
) -> None:
    out = as_json(cli("schedule", "report", "--json", env={"DELAYQ_QUEUE": queue.name}))
    assert out["queue"] == queue.name and queue.get(out["id"]) is not None
    none = cli("schedule", "report")
    assert none.exit_code == 2 and "--queue" in none.output


def test_schedule_positional_queue_still_works_with_a_deprecation_note(
    cli: Callable[..., Result], queue: Queue
) -> None:
    old = cli("schedule", queue.name, "report", "--id", "old-form", "--json")
    assert old.exit_code == 0, old.output
    assert json.loads(old.stdout)["queue"] == queue.name
    assert "deprecated" in old.stderr and f"delayq schedule -q {queue.name} report" in old.stderr
    assert (t := queue.get("old-form")) is not None and t.kind == "report"
    quiet = cli("schedule", "-q", queue.name, "report")
    assert quiet.exit_code == 0 and "deprecated" not in quiet.stderr
    # The positional queue wins over $DELAYQ_QUEUE, but not over an explicit -q.
    env = {"DELAYQ_QUEUE": "elsewhere"}
    assert cli("schedule", queue.name, "report", "--id", "env-form", env=env).exit_code == 0
    assert queue.get("env-form") is not None
    twice = cli("schedule", "-q", queue.name, queue.name, "report")
    assert twice.exit_code == 2 and "once" in twice.output
    many = cli("schedule", "-q", queue.name, "a", "b", "c")
    assert many.exit_code == 2 and "3 words" in many.output
    assert queue.stats().scheduled == 3


def test_run_now_makes_a_waiting_task_due_and_replays_a_dead_one(
    cli: Callable[..., Result], queue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    [dead_id] = bury(queue, run_worker, 1)
    assert cli("task", "run-now", dead_id, "-q", queue.name).exit_code == 0
    info = queue.get(dead_id)
    assert info is not None and info.state == "scheduled" and info.attempts == 0
    queue.schedule("later", task_id="-dash", delay=3600)  # generated ids may start so
    assert as_json(cli("task", "show", "-dash", "-q", queue.name, "--json"))["id"] == "-dash"
    assert cli("task", "cancel", "-dash", "-q", queue.name).exit_code == 0
    queue.schedule("later", task_id="w", delay=3600)
    out = as_json(cli("task", "run-now", "w", "-q", queue.name, "--json"))
    assert out["ok"] is True
    assert queue.stats().due == 2


def test_a_command_without_a_queue_names_the_queues_there(
    cli: Callable[..., Result], queue: Queue
) -> None:
    queue.schedule("x", delay=60)
    result = cli("dead", "ls")
    assert result.exit_code == 2
    assert "--queue" in result.output and "DELAYQ_QUEUE" in result.output
    assert queue.name in result.output
    env = cli("dead", "ls", "--json", env={"DELAYQ_QUEUE": queue.name})
    assert as_json(env)["queue"] == queue.name


# -- info ---------------------------------------------------------------------------------------


def test_info_counts_each_state_and_lists_live_workers(
    cli: Callable[..., Result], queue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    bury(queue, run_worker, 2)
    queue.schedule_many([{"kind": "later", "delay": 3600} for _ in range(3)])
    queue.schedule_many([{"kind": "late", "at": time.time() - 30} for _ in range(2)])
    [q] = as_json(cli("info", "-q", queue.name, "--json"))
    assert (q["scheduled"], q["due"], q["active"], q["dead"]) == (5, 2, 0, 2)
    assert 29 < q["oldest_due_age"] < 60
    assert q["workers_alive"] == 0  # the worker that buried them stopped and unregistered

    worker = Worker(queue, concurrency=2, lease=5)
    worker.handler("nothing")(lambda task: None)
    with run_worker(worker):
        live = wait_for(
            lambda: as_json(cli("info", "-q", queue.name, "--json"))[0]["workers_alive"]
        )
        assert live == 1
        text = cli("info", "-q", queue.name)
    assert text.exit_code == 0
    assert queue.name in text.output and "alive" in text.output


def test_info_watch_runs_as_a_real_process_until_interrupted(
    server: EmbeddedServer, queue: Queue
) -> None:
    queue.schedule("later", delay=60)
    proc = subprocess.Popen(
        [sys.executable, "-m", "delayq", "info", "--watch", "--json", "--interval", "200ms",
         "--queue", queue.name],
        cwd=ROOT,
        env={**os.environ, "DELAYQ_REDIS_URL": server.url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [json.loads(proc.stdout.readline()) for _ in range(2)]
        assert all(doc[0]["queue"] == queue.name and doc[0]["scheduled"] == 1 for doc in lines)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


# -- dead -----------------------------------------------------------------------------------------


def test_dead_ls_replay_and_purge(
    cli: Callable[..., Result], queue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    ids = bury(queue, run_worker, 5)
    listed = as_json(cli("dead", "ls", "-q", queue.name, "--limit", "3", "--json"))
    assert listed["total"] == 5 and len(listed["tasks"]) == 3
    assert listed["tasks"][0]["last_error"].startswith("Fail: no good")
    text = cli("dead", "ls", "-q", queue.name)
    assert "Fail: no good" in text.output and "5 dead" in text.output

    refused = cli("dead", "replay", "--all", "-q", queue.name, input="n\n")
    assert refused.exit_code == 1 and "--yes" in refused.output
    assert queue.stats().dead == 5
    usage = cli("dead", "replay", "-q", queue.name)
    assert usage.exit_code == 2 and "--all" in usage.output

    one = as_json(cli("dead", "replay", ids[0], "-q", queue.name, "--json"))
    assert one == {"queue": queue.name, "replayed": 1, "asked": 1, "ok": True}
    purged = as_json(cli("dead", "purge", ids[1], ids[2], "-q", queue.name, "--yes", "--json"))
    assert purged["purged"] == 2
    kept = cli("dead", "purge", "--older-than", "1h", "-q", queue.name, "--yes")
    assert kept.exit_code == 0 and "purged 0" in kept.output
    rest = cli("dead", "replay", "--all", "-q", queue.name, "--yes")
    assert rest.exit_code == 0 and "replayed 2" in rest.output
    stats = queue.stats()
    assert (stats.dead, stats.scheduled) == (0, 3)
    assert queue.get(ids[1]) is None


def test_dead_purge_all_asks_first(
    cli: Callable[..., Result], queue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    bury(queue, run_worker, 3)
    result = cli("dead", "purge", "--all", "-q", queue.name, input="y\n")
    assert result.exit_code == 0 and "purged 3" in result.output
    assert queue.stats().dead == 0


# -- check and connection errors ----------------------------------------------------------


def test_check_exit_codes_follow_what_it_checks(cli: Callable[..., Result], queue: Queue) -> None:
    queue.schedule("later", delay=3600)
    ok = as_json(cli("check", "-q", queue.name, "--json"))
    assert ok["ok"] is True
    assert cli("check", "-q", queue.name, "--min-workers", "1").exit_code == 1
    queue.schedule("late", at=time.time() - 120)
    overdue = cli("check", "-q", queue.name, "--json")
    assert overdue.exit_code == 1
    failed = [c for c in json.loads(overdue.stdout)["checks"] if not c["ok"]]
    assert [c["check"] for c in failed] == ["oldest_overdue"]
    assert cli("check", "-q", queue.name, "--max-overdue", "5m").exit_code == 0
    assert cli("check", "-q", queue.name, "--max-overdue", "5m", "--max-dead", "0").exit_code == 0


def test_unreachable_redis_says_where_it_tried_and_how_to_set_the_url(
    cli: Callable[..., Result],
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = cli("info", "--url", url)
    assert result.exit_code == 1
    assert f"cannot reach Redis at {url} (from --url)" in result.output
    assert "DELAYQ_REDIS_URL" in result.output
    from_env = cli("dead", "ls", "-q", "x", env={"DELAYQ_REDIS_URL": url})
    assert "from $DELAYQ_REDIS_URL" in from_env.output
    probe = cli("check", "--url", url)
    assert probe.exit_code == 1 and "FAIL" in probe.output
