"""The commands behave the same way, on real servers through click's runner (and as real
processes where a terminal, a pipe or the environment matters): a queue no process has
written is refused by name, exit codes follow one table (docs/operations-cli.md), tables
are not cut when piped, and every worker option can come from the environment."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner, Result

from delayq import Queue, Worker
from delayq.embedded import EmbeddedServer

from .conftest import WorkerThread
from .support.helpers import wait_for


@pytest.fixture
def cli(server: EmbeddedServer) -> Callable[..., Result]:
    """``delayq ARGS`` against the test server (URL from the environment, as users do)."""
    from delayq.cli.main import main

    def run(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
        runner = CliRunner(env={"DELAYQ_REDIS_URL": server.url, "DELAYQ_QUEUE": "", **(env or {})})
        return runner.invoke(main, list(args), input=input, catch_exceptions=False)

    return run


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
