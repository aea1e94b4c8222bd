"""``delayq check`` (a health probe), ``delayq dashboard`` and ``delayq reshard``."""

from __future__ import annotations

import secrets
import sys
from typing import Any

import click

from delayq.admin import operate
from delayq.admin.inspect import QueueOverview
from delayq.cli.common import (
    allow_empty_option,
    browsable,
    connect,
    duration,
    echo_json,
    json_option,
    known_queues,
    need_queue,
    queue_option,
    queues_option,
    safe,
    url_option,
)
from delayq.cli.web import checked_token, limits_options
from delayq.errors import MissingExtra
from delayq.keys import MAX_SHARDS
from delayq.web.serve import Limits

# -- check ------------------------------------------------------------------------------------


def _checks(
    ov: QueueOverview, max_overdue: float, max_dead: int | None, min_workers: int
) -> list[dict[str, Any]]:
    s = ov.stats
    out = [
        {
            "queue": ov.name,
            "check": "oldest_overdue",
            "value": round(s.oldest_due_age, 3),
            "limit": max_overdue,
            "ok": s.oldest_due_age <= max_overdue,
        },
        {
            "queue": ov.name,
            "check": "live_workers",
            "value": len(ov.live_workers),
            "limit": min_workers,
            "ok": len(ov.live_workers) >= min_workers,
        },
    ]
    if max_dead is not None:
        out.append(
            {
                "queue": ov.name,
                "check": "dead",
                "value": s.dead,
                "limit": max_dead,
                "ok": s.dead <= max_dead,
            }
        )
    return out


@click.command()
@queues_option
@click.option(
    "--max-overdue",
    default="60s",
    show_default=True,
    metavar="DURATION",
    help="Fail when a due task has waited longer than this.",
)
@click.option(
    "--max-dead",
    type=click.IntRange(min=0),
    default=None,
    help="Fail when the dead set holds more tasks than this [default: no limit].",
)
@click.option(
    "--min-workers",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Fail when fewer live workers serve a queue.",
)
@allow_empty_option
@url_option
@json_option
def check(
    queues: tuple[str, ...],
    max_overdue: str,
    max_dead: int | None,
    min_workers: int,
    allow_empty: bool,
    url: str | None,
    as_json: bool,
) -> None:
    """Health probe: exit 0 if healthy, 1 if not.

    Checks that Redis answers and runs delayq's scripts, and for each queue (--queue, or
    every queue found) that no due task has waited longer than --max-overdue (workers keep
    up), that at least --min-workers workers are alive, and with --max-dead that the dead
    set is no larger than that. Unreachable Redis exits 1 too. A --queue that no process
    has written (a typo), or no queue at all on the server, exits 2 with the queues there
    are, unless --allow-empty (a new deploy): then it is checked as an empty queue.
    """
    overdue = duration(max_overdue, "--max-overdue") or 0.0
    try:
        with connect(url, queues) as admin:
            known_queues(admin, queues, allow_empty)
            results = [
                c for ov in admin.overviews() for c in _checks(ov, overdue, max_dead, min_workers)
            ]
            where = admin.where
            if not results and not allow_empty:
                raise click.UsageError(
                    f"no queues on {where}: nothing to check. Pass --queue NAME, or "
                    "--allow-empty for a new deploy whose workers have not started yet"
                )
    except click.UsageError:
        raise
    except click.ClickException as e:
        if as_json:
            echo_json({"ok": False, "error": e.message, "checks": []})
        else:
            click.echo(f"FAIL redis: {e.message}", err=True)
        sys.exit(1)
    ok = all(r["ok"] for r in results)
    if as_json:
        echo_json({"ok": ok, "redis": where, "checks": results})
    else:
        click.echo(f"OK   redis: {where} answers")
        for r in results:
            click.echo(
                f"{'OK  ' if r['ok'] else 'FAIL'} {r['queue']}: {r['check']} {r['value']} "
                f"(limit {r['limit']})"
            )
        if not results:
            click.echo("     no queues found: nothing else to check")
    sys.exit(0 if ok else 1)


# -- dashboard ---------------------------------------------------------------------------------


@click.command()
@url_option
@queues_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--token",
    envvar="DELAYQ_DASHBOARD_TOKEN",
    metavar="TOKEN",
    help="Access token [default: $DELAYQ_DASHBOARD_TOKEN, else a new one, printed].",
)
@click.option("--read-only", is_flag=True, help="Show everything, change nothing.")
@click.option(
    "--log-level",
    default="warning",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@limits_options
def dashboard(
    url: str | None,
    queues: tuple[str, ...],
    host: str,
    port: int,
    token: str | None,
    read_only: bool,
    log_level: str,
    limits: Limits,
) -> None:
    """Serve the web dashboard and /metrics (token required; 127.0.0.1 unless --host).

    Needs the dashboard extra: pip install 'delayq[dashboard]'.
    """
    try:
        from delayq.dashboard import bind, serve
        from delayq.dashboard.auth import MIN_TOKEN
    except MissingExtra as e:
        raise click.ClickException(str(e)) from None

    generated = not token
    token = checked_token(
        token or secrets.token_urlsafe(24),
        least=MIN_TOKEN,
        what="the dashboard token",
        param_hint="--token",
    )
    with connect(url, queues) as admin:
        admin.ping()
        try:
            sock = bind(host, port)
        except OSError as e:
            raise click.ClickException(f"cannot listen on {host}:{port}: {e}") from None
        serve(
            admin,
            token=token,
            read_only=read_only,
            log_level=log_level,
            announce=lambda base: _announce(base, token, generated, read_only, admin.where),
            sock=sock,
            limits=limits,
        )


def _announce(base: str, token: str, generated: bool, read_only: bool, where: str) -> None:
    mode = " (read-only)" if read_only else ""
    click.echo(f"delayq dashboard{mode} for {where}")
    here, *elsewhere = browsable(base)
    shown = token if generated else "<your token>"
    bearer = "" if generated else "  (or send Authorization: Bearer <token>)"
    click.echo(f"open {here}/?token={shown}{bearer}")
    for url in elsewhere:
        click.echo(f"  from another machine: {url}/?token={shown}")
    if not base.startswith(("http://127.", "http://[::1]", "http://localhost")):
        click.echo(
            "warning: listening beyond this machine; put TLS in front (a reverse proxy) so "
            "the token never crosses the network in clear text",
            err=True,
        )


# -- reshard ----------------------------------------------------------------------------------


@click.command()
@queue_option
@click.option(
    "--shards",
    type=click.IntRange(1, MAX_SHARDS),
    required=True,
    help="The new shard count.",
)
@url_option
@json_option
def reshard(queue: str | None, shards: int, url: str | None, as_json: bool) -> None:
    """Change a queue's shard count (exit 1 if refused).

    Finished tasks still inside the dedupe window move to their new shards, so an id that
    finished before is still not run again; cron schedules and watched keys (with their
    waiting tasks) move to the new home shard. Refused while tasks wait, run or are dead,
    or a worker is alive: stop every producer and worker first. Processes that open the
    queue while it moves are refused; run the command again to finish a move cut short.
    """
    with connect(url) as admin:
        name = need_queue(admin, queue, new=True)
        result = operate.reshard(admin, name, shards)
    if as_json:
        echo_json(
            {
                "queue": name,
                "ok": result.ok,
                "message": result.message,
                "old": result.old,
                "new": result.new,
                "done": result.done,
                "waiting": result.waiting,
                "fields": result.fields,
            }
        )
    else:
        click.echo(safe(result.message), err=not result.ok)
    if not result.ok:
        sys.exit(1)
