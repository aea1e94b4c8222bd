"""The commands behave the same way, on real servers through click's runner (and as real
processes where a terminal, a pipe or the environment matters): a queue no process has
written is refused by name, exit codes follow one table (docs/operations-cli.md), tables
are not cut when piped, and every worker option can come from the environment."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from delayq import ConnectionFailed, Fail, Queue, Worker
from delayq.embedded import EmbeddedServer, free_port

from .conftest import ROOT, WorkerThread
from .support.helpers import wait_for


@pytest.fixture
def cli(server: EmbeddedServer) -> Callable[..., Result]:
    """``delayq ARGS`` against the test server (URL from the environment, as users do)."""
    from delayq.cli.main import main

    def run(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
        runner = CliRunner(env={"DELAYQ_REDIS_URL": server.url, "DELAYQ_QUEUE": "", **(env or {})})
        return runner.invoke(main, list(args), input=input, catch_exceptions=False)

    return run


NOWHERE = "redis://127.0.0.1:1/0"  # nothing listens: a worker that used it would fail


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# -- a queue never written ------------------------------------------------------------------


def test_check_and_info_refuse_a_queue_never_written_and_name_those_there(
    cli: Callable[..., Result], queue: Queue, qname: str
) -> None:
    queue.schedule("later", delay=3600)
    typo = qname + "-typo"
    for command in ("check", "info"):
        refused = cli(command, "-q", typo)
        assert refused.exit_code == 2, refused.output
        assert f"no queue '{typo}'" in refused.output
        assert queue.name in refused.output  # the queues that exist
        assert "--allow-empty" in refused.output
    probe = cli("check", "-q", typo, "--json")
    assert probe.exit_code == 2 and probe.stdout == ""  # no {"ok": true} for a typo
    # --allow-empty: a new deploy's queue, checked (and shown) as empty.
    new = as_json(cli("check", "-q", typo, "--allow-empty", "--json"))
    assert new["ok"] is True and {c["queue"] for c in new["checks"]} == {typo}
    [shown] = as_json(cli("info", "-q", typo, "--allow-empty", "--json"))
    assert (shown["queue"], shown["scheduled"]) == (typo, 0)
    # Several queues: the one written passes, the unwritten one is named.
    both = cli("check", "-q", queue.name, "-q", typo)
    assert both.exit_code == 2 and f"'{typo}'" in both.output
    assert cli("check", "-q", queue.name).exit_code == 0


def test_a_worker_that_started_makes_its_queue_known(
    cli: Callable[..., Result], queue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    """The probes in deploy/ run beside a started worker: its start writes the queue, so they
    need no --allow-empty."""
    assert cli("check", "-q", queue.name).exit_code == 2
    worker = Worker(queue)
    worker.handler("x")(lambda task: None)
    with run_worker(worker):
        wait_for(lambda: cli("check", "-q", queue.name, "--min-workers", "1").exit_code == 0)


def test_commands_on_existing_tasks_refuse_an_unknown_queue_and_writers_create_one(
    cli: Callable[..., Result], queue: Queue, qname: str
) -> None:
    queue.schedule("later", delay=3600, task_id="t1")
    typo = qname + "-typo"
    for args in (
        ("dead", "ls", "-q", typo),
        ("dead", "replay", "t1", "-q", typo),
        ("dead", "purge", "t1", "-q", typo, "--yes"),
        ("task", "cancel", "t1", "-q", typo),
        ("task", "run-now", "t1", "-q", typo),
        ("task", "show", "t1", "-q", typo),
    ):
        refused = cli(*args)
        assert refused.exit_code == 2, (args, refused.output)
        assert f"no queue '{typo}'" in refused.output and queue.name in refused.output
        assert "--allow-empty" not in refused.output  # they have no such option
    # Writing to a new queue is how a queue begins: schedule, limit, pause, resume (a
    # queue's controls may be set before its first task).
    assert cli("limit", "10/s", "-q", typo).exit_code == 0
    assert cli("pause", "-q", typo + "2").exit_code == 0
    assert cli("schedule", "-q", typo + "3", "x").exit_code == 0
    assert cli("check", "-q", typo, "-q", typo + "2", "-q", typo + "3").exit_code == 0


def test_check_on_a_server_without_queues_checks_nothing_only_when_told(
    make_server: Callable[..., EmbeddedServer],
) -> None:
    from delayq.cli.main import main

    srv = make_server()
    runner = CliRunner(env={"DELAYQ_REDIS_URL": srv.url, "DELAYQ_QUEUE": ""})
    empty = runner.invoke(main, ["check"])
    assert empty.exit_code == 2 and "no queues on" in empty.output
    allowed = runner.invoke(main, ["check", "--allow-empty"])
    assert allowed.exit_code == 0 and "nothing else to check" in allowed.output


# -- tables on a pipe ------------------------------------------------------------------------


def piped(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``delayq ARGS`` as a real process, its stdout a pipe, with no $COLUMNS."""
    base = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [sys.executable, "-m", "delayq", *args],
        cwd=ROOT,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_info_and_dead_ls_are_not_cut_at_80_columns_on_a_pipe(
    server: EmbeddedServer, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    name = "a-queue-whose-name-is-long-enough-to-matter-" + os.urandom(4).hex()
    with Queue(name, url=server.url) as queue:
        queue.schedule("later", delay=3600)
        kind = "report.build.a-kind-of-task-with-a-long-name"
        queue.schedule(kind, task_id="dead-one")
        worker = Worker(queue)

        @worker.handler(kind)
        def fails(task: Any) -> None:
            raise Fail("a reason long enough to reach past the eightieth column of a terminal")

        with run_worker(worker):
            wait_for(lambda: queue.stats().dead == 1)
        env = {"DELAYQ_REDIS_URL": server.url}
        info = piped("info", "-q", name, env=env)
        assert info.returncode == 0, info.stderr
        header = next(line for line in info.stdout.splitlines() if "oldest overdue" in line)
        assert "queue" in header
        for column in ("scheduled", "due now", "oldest overdue", "next due", "controls"):
            assert column in header, info.stdout
        assert any(name in line for line in info.stdout.splitlines()), info.stdout
        assert "…" not in info.stdout
        dead = piped("dead", "ls", "-q", name, env=env)
        assert dead.returncode == 0, dead.stderr
        row = next(line for line in dead.stdout.splitlines() if "dead-one" in line)
        assert kind in row and "past the eightieth column of a terminal" in row, dead.stdout


# -- exit codes -----------------------------------------------------------------------------


def test_dead_replay_and_purge_of_an_id_that_is_not_dead_exit_1_as_task_cancel_does(
    cli: Callable[..., Result], queue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    queue.schedule("bad", task_id="d1")
    queue.schedule("bad", task_id="d2")
    worker = Worker(queue)

    @worker.handler("bad")
    def bad(task: Any) -> None:
        raise Fail("no")

    with run_worker(worker):
        wait_for(lambda: queue.stats().dead == 2)
    queue.schedule("later", delay=3600, task_id="waiting")
    q = ("-q", queue.name)
    assert cli("task", "cancel", "nosuchid", *q).exit_code == 1  # the model
    unknown = cli("dead", "replay", "nosuchid", *q)
    assert unknown.exit_code == 1 and "0 of the 1" in unknown.output
    some = cli("dead", "replay", "d1", "waiting", *q, "--json")
    assert some.exit_code == 1
    assert json.loads(some.stdout) == {
        "queue": queue.name, "replayed": 1, "asked": 2, "ok": False
    }  # fmt: skip
    assert (t := queue.get("waiting")) is not None and t.state == "scheduled"
    purge = cli("dead", "purge", "d2", "waiting", *q, "--yes")
    assert purge.exit_code == 1 and "purged 1 of the 2" in purge.output
    assert cli("dead", "purge", "nosuchid", *q, "--yes").exit_code == 1
    # --all with nothing dead asked for no id in particular: done, exit 0.
    assert cli("dead", "replay", "--all", *q, "--yes").exit_code == 0
    assert cli("dead", "purge", "--all", *q, "--yes").exit_code == 0


def _commands() -> list[str]:
    """Every command a user can run: ``delayq worker``, ``delayq dead ls``, ..."""
    import click

    from delayq.cli.main import main

    out = []

    def walk(group: click.Group, path: str) -> None:
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            assert cmd is not None
            if isinstance(cmd, click.Group):
                walk(cmd, f"{path} {name}")
            else:
                out.append(f"{path} {name}")

    walk(main, "delayq")
    return out


def test_one_table_gives_the_exit_codes_of_every_command() -> None:
    page = (ROOT / "docs" / "operations-cli.md").read_text()
    section = page.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `delayq ")]
    listed = {line.split("`")[1] for line in rows}
    commands = _commands()
    assert {"delayq worker", "delayq dead replay", "delayq task cancel"} <= set(commands)
    assert set(commands) - listed == set(), "add these commands to the exit codes table"
    assert listed - set(commands) == set(), "the table lists commands that do not exist"


# -- the worker's options from the environment -----------------------------------------------


def test_every_worker_option_but_url_comes_from_the_environment_and_says_so() -> None:
    import click

    from delayq.cli.main import worker

    options = [p for p in worker.params if isinstance(p, click.Option)]
    for option in options:
        if option.name in ("url", "help"):
            continue
        assert isinstance(option.envvar, str) and option.envvar.startswith("DELAYQ_"), option
        assert option.show_envvar, option.name
    text = CliRunner().invoke(worker, ["--help"]).output
    for var in ("CONCURRENCY", "LEASE", "LOG_LEVEL", "LOG_FORMAT", "METRICS_PORT", "PROCESSES"):
        assert f"DELAYQ_{var}" in text


def _stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def _metrics(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return str(r.read().decode())
    except OSError:
        return ""


def test_a_worker_configured_only_by_the_environment(server: EmbeddedServer, queue: Queue) -> None:
    """DELAYQ_PROCESSES, _CONCURRENCY, _LEASE, _LOG_FORMAT, _LOG_LEVEL and _METRICS_PORT: the
    supervisor serves the metrics on that port, and its worker processes, which inherit the
    environment, do not try to as well."""
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DQ_", "DELAYQ_"))},
        "DELAYQ_REDIS_URL": server.url,
        "DQ_QUEUE": queue.name,
        "DELAYQ_PROCESSES": "2",
        "DELAYQ_CONCURRENCY": "3",
        "DELAYQ_LEASE": "7s",
        "DELAYQ_LOG_FORMAT": "json",
        "DELAYQ_LOG_LEVEL": "info",
        "DELAYQ_METRICS_PORT": str(port),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "delayq", "worker", "tests.support.apps.cli_app:worker"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: len([w for w in queue.workers() if w.alive]) == 2, timeout=30)
        assert {w.concurrency for w in queue.workers()} == {3}  # the app says 16
        tid = queue.schedule("hold", {"seconds": 3})
        wait_for(lambda: (t := queue.get(tid)) is not None and t.lease_deadline is not None)
        task = queue.get(tid)
        assert task is not None and task.lease_deadline is not None
        assert (task.lease_deadline - queue.stats().now).total_seconds() <= 7.5  # the app: 30
        assert "delayq_queue_scheduled" in wait_for(lambda: _metrics(port))
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines and all(json.loads(line)["level"] for line in lines), out
    assert "cannot serve metrics" not in out, out


def test_embedded_port_keeps_the_servers_port(tmp_path: Path) -> None:
    """$DELAYQ_EMBEDDED_PORT (or --embedded-port): the private server on that port, served by
    two worker processes (which inherit the variable, and take the supervisor's --url); a
    second worker asking for the same port is refused, not pointed at the first's server."""
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DQ_", "DELAYQ_"))}
    env = {**base, "PYTHONPATH": str(ROOT), "DQ_QUEUE": "embedded", "REDIS_URL": NOWHERE}
    app = "tests.support.apps.cli_app:worker"
    first = subprocess.Popen(
        [sys.executable, "-m", "delayq", "worker", app, "--processes", "2"],
        cwd=tmp_path,
        env={**env, "DELAYQ_EMBEDDED_PORT": str(port)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        with Queue("embedded", url=f"redis://127.0.0.1:{port}/0") as queue:
            wait_for(lambda: _alive(queue) == 2, timeout=30)
            second = subprocess.run(
                [sys.executable, "-m", "delayq", "worker", app, "--embedded-port", str(port)],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert second.returncode == 1, second.stderr
            assert f"cannot start the embedded server on port {port}" in second.stderr
            assert _alive(queue) == 2
    finally:
        code = _stop(first)
    assert code == 0
    assert (tmp_path / ".delayq" / "data").is_dir()


def _alive(queue: Queue) -> int:
    try:
        return len([w for w in queue.workers() if w.alive])
    except ConnectionFailed:
        return 0


# -- addresses and messages -------------------------------------------------------------------


def test_the_dashboard_on_every_address_prints_urls_a_browser_can_open(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from delayq.cli.ops import _announce

    _announce("http://0.0.0.0:8000", "tok", True, False, "redis://127.0.0.1:6379/0")
    out = capsys.readouterr()
    assert "open http://127.0.0.1:8000/?token=tok" in out.out
    assert f"http://{socket.gethostname()}:8000/?token=tok" in out.out
    assert "0.0.0.0" not in out.out
    assert "TLS" in out.err  # still warned: it listens beyond this machine
    _announce("http://[::]:8000", "tok", False, True, "redis://127.0.0.1:6379/0")
    assert "open http://[::1]:8000/?token=<your token>" in capsys.readouterr().out
    _announce("http://127.0.0.1:8000", "tok", True, False, "redis://127.0.0.1:6379/0")
    out = capsys.readouterr()
    assert "open http://127.0.0.1:8000/?token=tok" in out.out and out.err == ""


def test_a_worker_that_cannot_reach_redis_says_so_first() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    proc = subprocess.Popen(
        [sys.executable, "-m", "delayq", "worker", "tests.support.apps.cli_app:worker"],
        cwd=ROOT,
        env={**os.environ, "DELAYQ_REDIS_URL": url, "DELAYQ_LOG_FORMAT": "json"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = json.loads(proc.stderr.readline())
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stderr:
            proc.stderr.close()
    assert first["level"] == "WARNING"
    assert first["message"].startswith(f"cannot reach Redis at {url.removeprefix('redis://')}")
    assert "shard count" not in first["message"]
