"""Operator commands: schedule, info, task show|cancel|abort|run-now.

``delayq dead ...`` is in cli/dead.py, ``check`` and ``dashboard`` in cli/ops.py.
Everything that prints data takes ``--json``.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from datetime import datetime
from typing import Any

import click
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from delayq.admin import operate
from delayq.admin.inspect import Admin, QueueOverview
from delayq.admin.present import controls_text
from delayq.cli.common import (
    IDS_MAY_START_WITH_DASH,
    QUEUE_ENV,
    allow_empty_option,
    connect,
    console,
    duration,
    echo_json,
    human_seconds,
    json_option,
    known_queues,
    need_queue,
    one_line,
    payload_text,
    queue_option,
    queues_option,
    relative,
    safe,
    task_dict,
    url_option,
)
from delayq.errors import InvalidTaskError
from delayq.task import TaskInfo

# -- schedule ---------------------------------------------------------------------------------


def _payload(text: str | None) -> Any:
    if text is None:
        return None
    source = "--payload"
    if text == "-":
        text, source = sys.stdin.read(), "standard input"
    elif text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as f:
                text, source = f.read(), text[1:]
        except OSError as e:
            raise click.BadParameter(
                f"cannot read {text[1:]}: {e}", param_hint="--payload"
            ) from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise click.BadParameter(
            f"{source} is not JSON ({e}); quote strings, e.g. --payload '\"hello\"'",
            param_hint="--payload",
        ) from None


def _at(text: str | None) -> datetime | float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither an ISO 8601 time nor a Unix timestamp", param_hint="--at"
        ) from None
    if at.tzinfo is None:
        raise click.BadParameter(
            f"{text!r} has no UTC offset: add one, e.g. {text}+00:00 or {text}Z", param_hint="--at"
        )
    return at


def _headers(items: tuple[str, ...]) -> dict[str, str] | None:
    headers: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(
                f"{item!r} is not NAME=VALUE, e.g. --header tenant=a", param_hint="--header"
            )
        headers[name] = value
    return headers or None


def _queue_and_kind(words: tuple[str, ...], queue: str | None) -> tuple[str | None, str]:
    """KIND with -q/--queue (or $DELAYQ_QUEUE); the older ``QUEUE KIND`` still works."""
    if len(words) == 1:
        return queue, words[0]
    if len(words) != 2:
        raise click.UsageError(
            f"expected KIND (and the queue in -q/--queue), got {len(words)} words"
        )
    ctx = click.get_current_context()
    if queue and ctx.get_parameter_source("queue") == click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("give the queue once: -q/--queue NAME, not also as an argument")
    click.echo(
        f"warning: 'delayq schedule QUEUE KIND' is deprecated; "
        f"use 'delayq schedule -q {words[0]} {words[1]}' (or set ${QUEUE_ENV})",
        err=True,
    )
    return words[0], words[1]


@click.command()
@click.argument("words", nargs=-1, required=True, metavar="KIND")
@queue_option
@click.option("--payload", metavar="JSON", help="Payload as JSON; @FILE reads a file, - stdin.")
@click.option("--delay", metavar="DURATION", help="Run after this long: 90s, 15m, 2h, 1d.")
@click.option(
    "--at", "at_text", metavar="TIME", help="Run at an ISO 8601 time with offset, or a Unix time."
)
@click.option("--id", "task_id", metavar="ID", help="Task id (default: a random one).")
@click.option(
    "--replace",
    is_flag=True,
    help="Move a waiting task with this id; re-create a done or dead one.",
)
@click.option(
    "--max-attempts",
    type=click.IntRange(min=0),
    default=0,
    help="Attempt limit (0: the handler's).",
)
@click.option(
    "--priority",
    type=click.IntRange(0, 9),
    default=None,
    help="0-9: among due tasks the higher runs first (default: none; kept on --replace).",
)
@click.option(
    "--header",
    "header_items",
    multiple=True,
    metavar="NAME=VALUE",
    help="A header for the task (task.headers); repeat for several.",
)
@url_option
@json_option
def schedule(
    words: tuple[str, ...],
    queue: str | None,
    payload: str | None,
    delay: str | None,
    at_text: str | None,
    task_id: str | None,
    replace: bool,
    max_attempts: int,
    priority: int | None,
    header_items: tuple[str, ...],
    url: str | None,
    as_json: bool,
) -> None:
    """Schedule a task of KIND on the --queue (due now unless --delay or --at).

    The older form 'delayq schedule QUEUE KIND' still works, with a deprecation warning.
    """
    queue, kind = _queue_and_kind(words, queue)
    if delay is not None and at_text is not None:
        raise click.UsageError("pass --delay or --at, not both")
    data, at, secs = _payload(payload), _at(at_text), duration(delay, "--delay")
    headers = _headers(header_items)
    with connect(url) as admin:
        queue = need_queue(admin, queue, new=True)
        q = admin.queue(queue)
        try:
            tid = q.schedule(
                kind,
                data,
                delay=secs,
                at=at,
                task_id=task_id,
                replace=replace,
                max_attempts=max_attempts,
                headers=headers,
                priority=priority,
            )
        except InvalidTaskError as e:
            raise click.ClickException(str(e)) from None
        info, now = q.get(tid), q.stats().now
    if as_json:
        echo_json(task_dict(info) if info else {"id": tid, "queue": queue, "state": None})
        return
    if info is None:  # a worker ran it and the dedupe window is 0
        click.echo(f"{tid}: scheduled on {queue}")
    elif info.state == "scheduled":
        due = info.due_at.isoformat() if info.due_at else "?"
        click.echo(f"{safe(tid)}: due {due} ({relative(info.due_at, now)}) on queue {queue}")
    else:
        click.echo(f"{safe(tid)}: already {info.state} on queue {queue}; unchanged (use --replace)")


# -- info ---------------------------------------------------------------------------------------


def _queue_table(overviews: list[QueueOverview]) -> Table:
    table = Table(title=None, header_style="bold")
    for col in (
        "queue",
        "scheduled",
        "due now",
        "active",
        "dead",
        "aborted",
        "oldest overdue",
        "next due",
        "workers",
        "controls",
    ):
        table.add_column(col, justify="left" if col == "queue" else "right")
    for ov in overviews:
        s = ov.stats
        dead_workers = len(ov.workers) - len(ov.live_workers)
        table.add_row(
            Text(ov.name),
            str(s.scheduled),
            Text(str(s.due), style="yellow" if s.due else ""),
            str(s.active),
            Text(str(s.dead), style="red" if s.dead else ""),
            str(s.aborted),
            human_seconds(s.oldest_due_age) if s.due else "-",
            relative(s.next_due_at, s.now),
            f"{len(ov.live_workers)}" + (f" (+{dead_workers} gone)" if dead_workers else ""),
            Text(
                controls_text(ov.paused, ov.rate_limit, ov.throttle_backlog),
                style="yellow" if ov.paused else "",
            ),
        )
    return table


def _worker_table(overviews: list[QueueOverview]) -> Table | None:
    rows = [(ov, w) for ov in overviews for w in ov.workers]
    if not rows:
        return None
    table = Table(header_style="bold")
    for col in ("queue", "worker", "pid", "in flight", "started", "last seen", "state"):
        table.add_column(col)
    for ov, w in rows:
        table.add_row(
            Text(ov.name),
            Text(safe(w.host)),
            str(w.pid),
            f"{w.in_flight}/{w.concurrency}",
            relative(w.started_at, ov.stats.now),
            relative(w.last_seen, ov.stats.now),
            Text("alive", style="green") if w.alive else Text("gone", style="red"),
        )
    return table


def _info_view(admin: Admin) -> Group | Text:
    overviews = admin.overviews()
    if not overviews:
        return Text(f"no queues found on {admin.where}")
    parts: list[Any] = [_queue_table(overviews)]
    workers = _worker_table(overviews)
    if workers is not None:
        parts.append(workers)
    return Group(*parts)


@click.command()
@queues_option
@click.option("--watch", is_flag=True, help="Refresh until Ctrl-C.")
@click.option(
    "--interval",
    default="2s",
    show_default=True,
    metavar="DURATION",
    help="Refresh interval with --watch.",
)
@allow_empty_option
@url_option
@json_option
def info(
    queues: tuple[str, ...],
    watch: bool,
    interval: str,
    allow_empty: bool,
    url: str | None,
    as_json: bool,
) -> None:
    """Per queue: scheduled, due now, active, dead, aborted, oldest overdue, next due, live
    workers, and its controls (paused; the rate limit and how long it needs for what is due
    now).

    With --watch --json, prints one JSON document per line, one line per refresh.
    """
    every = duration(interval, "--interval") or 2.0
    with connect(url, queues) as admin:
        known_queues(admin, queues, allow_empty)
        if not watch:
            if as_json:
                echo_json([ov.as_dict() for ov in admin.overviews()])
            else:
                console().print(_info_view(admin))
            return
        with contextlib.suppress(KeyboardInterrupt):
            _watch(admin, every, as_json)


def _watch(admin: Admin, every: float, as_json: bool) -> None:
    if as_json:
        while True:
            data = [ov.as_dict() for ov in admin.overviews()]
            click.echo(json.dumps(data, ensure_ascii=False, default=str))
            sys.stdout.flush()
            time.sleep(every)
    with Live(_info_view(admin), console=console(), auto_refresh=False) as live:
        while True:
            time.sleep(every)
            live.update(_info_view(admin), refresh=True)


# -- task ----------------------------------------------------------------------------------------


def _show(info: TaskInfo, now: datetime) -> None:
    rows = [
        ("id", info.id),
        ("queue", info.queue),
        ("state", info.state),
        ("kind", info.kind or "-"),
        (
            "attempts",
            f"{info.attempts}" + (f" of {info.max_attempts}" if info.max_attempts else ""),
        ),
        *([("priority", str(info.priority))] if info.priority else []),
        (
            "due",
            f"{info.due_at.isoformat()} ({relative(info.due_at, now)})" if info.due_at else "-",
        ),
        ("created", info.created_at.isoformat() if info.created_at else "-"),
    ]
    if info.lease_deadline:
        rows.append(
            (
                "lease until",
                f"{info.lease_deadline.isoformat()} ({relative(info.lease_deadline, now)})",
            )
        )
    if info.finished_at:
        label = {"dead": "died", "aborted": "aborted", "cancelled": "cancelled"}.get(
            info.state, "finished"
        )
        rows.append((label, f"{info.finished_at.isoformat()} ({relative(info.finished_at, now)})"))
    for label, value in rows:
        click.echo(f"{label:>12}  {safe(value)}")
    for i, (name, value) in enumerate(sorted(info.headers.items())):
        click.echo(f"{'headers' if i == 0 else '':>12}  {one_line(name)}: {one_line(value)}")
    click.echo(f"{'payload':>12}  " + payload_text(info.payload).replace("\n", "\n" + " " * 14))
    if info.result is not None:
        click.echo(f"{'result':>12}  " + payload_text(info.result).replace("\n", "\n" + " " * 14))
    if info.last_error:
        click.echo(f"{'last error':>12}  " + safe(info.last_error).replace("\n", "\n" + " " * 14))


@click.group()
def task() -> None:
    """Look at one task, cancel, abort or run it now."""


@task.command("show", context_settings=IDS_MAY_START_WITH_DASH)
@click.argument("task_id", metavar="ID")
@queues_option
@url_option
@json_option
def task_show(task_id: str, queues: tuple[str, ...], url: str | None, as_json: bool) -> None:
    """Show a task: state, times, attempts, headers, payload, last error (looks in every queue
    unless --queue is given).

    With --json: the task as an object, or a list when the id is in no queue or several.
    """
    with connect(url, queues) as admin:
        known_queues(admin, queues, flag=False)
        try:
            found = admin.find_task(task_id)
        except InvalidTaskError as e:
            raise click.BadParameter(str(e), param_hint="ID") from None
        now = admin.queue(found[0].queue).stats().now if found else None
    if as_json:
        echo_json(task_dict(found[0]) if len(found) == 1 else [task_dict(t) for t in found])
    elif not found:
        where = "queue(s) " + ", ".join(queues) if queues else "any queue"
        click.echo(f"no task {safe(task_id)!r} in {where}", err=True)
    else:
        assert now is not None
        for i, t in enumerate(found):
            if i:
                click.echo()
            _show(t, now)
    if not found:
        sys.exit(1)


def _act(action: str, task_id: str, queue: str | None, url: str | None, as_json: bool) -> None:
    with connect(url) as admin:
        q = admin.queue(need_queue(admin, queue))
        act = {"cancel": operate.cancel, "abort": operate.abort}.get(action, operate.run_now)
        try:
            result = act(q, task_id)
        except InvalidTaskError as e:
            raise click.BadParameter(str(e), param_hint="ID") from None
    if as_json:
        echo_json({"id": task_id, "queue": q.name, "ok": result.ok, "message": result.message})
    else:
        click.echo(safe(result.message), err=not result.ok)
    if not result.ok:
        sys.exit(1)


@task.command("cancel", context_settings=IDS_MAY_START_WITH_DASH)
@click.argument("task_id", metavar="ID")
@queue_option
@url_option
@json_option
def task_cancel(task_id: str, queue: str | None, url: str | None, as_json: bool) -> None:
    """Cancel a waiting task (exit 1 if it is not waiting)."""
    _act("cancel", task_id, queue, url, as_json)


@task.command("abort", context_settings=IDS_MAY_START_WITH_DASH)
@click.argument("task_id", metavar="ID")
@queue_option
@url_option
@json_option
def task_abort(task_id: str, queue: str | None, url: str | None, as_json: bool) -> None:
    """Abort a waiting or running task: a running handler is stopped, and the task is not
    retried; it shows as aborted (exit 1 if it was neither waiting nor running)."""
    _act("abort", task_id, queue, url, as_json)


@task.command("run-now", context_settings=IDS_MAY_START_WITH_DASH)
@click.argument("task_id", metavar="ID")
@queue_option
@url_option
@json_option
def task_run_now(task_id: str, queue: str | None, url: str | None, as_json: bool) -> None:
    """Make a waiting task due now, or replay a dead one (exit 1 otherwise)."""
    _act("run-now", task_id, queue, url, as_json)
