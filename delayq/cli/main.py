"""The ``delayq`` command."""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from delayq.cli.admin import info, schedule, task
from delayq.cli.common import QUEUE_ENV, browsable, configure_logging
from delayq.cli.controls import limit, pause, resume
from delayq.cli.cron import cron
from delayq.cli.dead import dead
from delayq.cli.ops import check, dashboard, reshard
from delayq.cli.protocol import protocol
from delayq.cli.settings import settings
from delayq.cli.web import checked_token, limits_options
from delayq.cli.worker import load_app, worker
from delayq.connection import DEFAULT_URL, URL_ENV, redact, resolve_url
from delayq.embedded.server import BINARY_ENV
from delayq.errors import ConfigurationError, MissingExtra, ServerNotFound
from delayq.spec import TaskType
from delayq.web.serve import Limits
from delayq.web.tokens import MAKE_ONE

log = logging.getLogger("delayq.cli")


MAIN_EPILOG = f"""\b
Every command that talks to Redis takes --url and, where it acts on a queue,
-q/--queue; without them it reads:
  {URL_ENV[0]}, else {URL_ENV[1]}  Redis URL [else {DEFAULT_URL}]
  {QUEUE_ENV}  the queue (comma-separated where a command takes several)
  {BINARY_ENV}  server binary for an embedded server (demo, worker --embedded)
'delayq COMMAND --help' lists what each command reads.
"""


@click.group(epilog=MAIN_EPILOG)
@click.version_option(package_name="delayq")
def main() -> None:
    """delayq: reliable delayed tasks on Redis and Valkey."""


main.add_command(worker)


DEMO_HELP = f"""Close unpaid orders on time, once, with stock restored — while a worker is killed.

Runs on a private embedded server unless --url names one: it does not read
${URL_ENV[0]} or ${URL_ENV[1]}, so it never writes to a Redis you did not name. On
a server of yours it works on its own queue, demo-orders-PID, and deletes that queue's
keys when it ends, also on Ctrl-C.

\b
Environment:
  {BINARY_ENV}  server binary [else the delayq[embedded] one,
                     else valkey-server or redis-server on PATH]
"""


@main.command(help=DEMO_HELP)
@click.option(
    "--url",
    default=None,
    metavar="URL",
    help="Redis URL to run on [default: an embedded server; $REDIS_URL is not read].",
)
@click.option(
    "--database-url",
    default=None,
    help="Business database: sqlite:///FILE (default: a temporary file) or postgresql://...",
)
@click.option("--duration", default=20.0, show_default=True, help="Seconds of placing orders.")
@click.option("--rate", default=40.0, show_default=True, help="Orders per second.")
@click.option(
    "--close-after",
    default=3.0,
    show_default=True,
    help="Seconds an order may stay unpaid (15 minutes in real use).",
)
@click.option("--pay-share", default=0.5, show_default=True, help="Share of orders that pay.")
@click.option(
    "--race-share",
    default=0.2,
    show_default=True,
    help="Share of paying orders that pay exactly at the deadline.",
)
@click.option("--workers", default=3, show_default=True, help="Worker processes.")
@click.option("--no-kill", is_flag=True, help="Do not SIGKILL a worker halfway through.")
@click.option("--seed", type=int, default=None, help="Random seed, to replay a run.")
def demo(
    url: str | None,
    database_url: str | None,
    duration: float,
    rate: float,
    close_after: float,
    pay_share: float,
    race_share: float,
    workers: int,
    no_kill: bool,
    seed: int | None,
) -> None:
    from delayq.demo import DemoConfig, run_demo

    cfg = DemoConfig(
        url=url,
        database_url=database_url,
        duration=duration,
        rate=rate,
        close_after=close_after,
        pay_share=pay_share,
        race_share=race_share,
        workers=workers,
        kill=not no_kill,
    )
    if seed is not None:
        cfg.seed = seed
    try:
        code = run_demo(cfg)
    except ServerNotFound as e:
        raise click.ClickException(str(e)) from None
    sys.exit(code)


def load_task_types(spec: str) -> list[TaskType[Any, Any]]:
    """``--task-types``: the TaskTypes of a module (its attributes that are one), or of its
    attribute NAME (a TaskType, or a list or tuple of them)."""
    found = load_app(spec if ":" in spec else f"{spec}:__dict__")
    if isinstance(found, TaskType):
        return [found]
    values = list(found.values()) if isinstance(found, dict) else found
    if ":" not in spec:
        values = [v for v in values if isinstance(v, TaskType)]
    if not isinstance(values, list | tuple) or not all(isinstance(v, TaskType) for v in values):
        raise click.BadParameter(
            f"{spec} is not a TaskType or a list of them", param_hint="--task-types"
        )
    if not values:
        raise click.BadParameter(f"{spec} defines no TaskType", param_hint="--task-types")
    return list(values)


API_HELP = f"""Serve the HTTP API: schedule, look up, cancel and reschedule tasks, and set
watched keys, from any service (docs/http.md).

Every request under /v1 and /readyz must carry 'Authorization: Bearer TOKEN'; /healthz
and /openapi.json are open. A token is required: --token, $DELAYQ_API_TOKEN or
--token-file (at least 16 characters; spaces around it are dropped). With -q, only
the queues named are served. Listens on 127.0.0.1 unless --host says otherwise, and says
its URL once it listens. A slow client is cut off: see --header-timeout and
--body-timeout. With --task-types, each typed kind's payload schema is in /openapi.json and
a payload that does not match its type is refused (422).
Needs the http extra: pip install 'delayq[http]'.

\b
Environment:
  {URL_ENV[0]}, {URL_ENV[1]}  Redis URL [else {DEFAULT_URL}]
  {QUEUE_ENV}  the queues served, comma-separated [else any]
  DELAYQ_API_TOKEN  the token
"""


@main.command(help=API_HELP)
@click.option(
    "--url",
    default=None,
    metavar="URL",
    help=f"Redis URL [default: ${URL_ENV[0]}, else ${URL_ENV[1]}, else {DEFAULT_URL}].",
)
@click.option(
    "--queue",
    "-q",
    "queues",
    multiple=True,
    envvar=QUEUE_ENV,
    metavar="NAME",
    help=f"Serve only this queue (repeatable) [default: ${QUEUE_ENV}, comma-separated, else "
    "any queue].",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--token", envvar="DELAYQ_API_TOKEN", metavar="TOKEN", help="The bearer token clients send."
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    metavar="PATH",
    help="Read the token from this file (its first line), kept out of the process list.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@click.option("--access-log", is_flag=True, help="Log every request (never the token).")
@click.option(
    "--task-types",
    "task_types",
    multiple=True,
    metavar="MODULE[:NAME]",
    help="The TaskTypes a module defines (or its attribute NAME: one, or a list), whose "
    "payloads are described and checked (repeatable).",
)
@limits_options
def api(
    url: str | None,
    queues: tuple[str, ...],
    host: str,
    port: int,
    token: str | None,
    token_file: str | None,
    log_level: str,
    access_log: bool,
    task_types: tuple[str, ...],
    limits: Limits,
) -> None:
    types = [t for spec in task_types for t in load_task_types(spec)]
    try:
        from delayq.http import bind, serve
        from delayq.http.app import MIN_TOKEN
    except MissingExtra as e:
        raise click.ClickException(str(e)) from None

    token = _api_token(token, token_file, MIN_TOKEN)
    try:
        where = redact(resolve_url(url))
    except ConfigurationError as e:
        raise click.BadParameter(str(e), param_hint="--url") from None
    configure_logging(log_level)
    try:
        sock = bind(host, port)
    except OSError as e:
        raise click.ClickException(f"cannot listen on {host}:{port}: {e}") from None
    try:
        serve(
            url,
            token=token,
            sock=sock,
            queues=[q for item in queues for q in item.replace(",", " ").split()],
            log_level=log_level,
            access_log=access_log,
            limits=limits,
            announce=lambda base: _announce_api(base, where),
            task_types=types,
        )
    except ConfigurationError as e:
        raise click.ClickException(str(e)) from None


def _announce_api(base: str, where: str) -> None:
    """Said once the API listens: a client that reads the URL can connect at once."""
    here, *elsewhere = browsable(base)
    others = "".join(f", from another machine {url}" for url in elsewhere)
    click.echo(f"delayq HTTP API on {here}{others} (Redis {where})", err=True)


def _api_token(token: str | None, token_file: str | None, least: int) -> str:
    if token and token_file:
        raise click.UsageError("pass --token or --token-file, not both")
    hint = "--token"
    if token_file:
        hint = "--token-file"
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.readline()
        except OSError as e:
            raise click.BadParameter(f"cannot read it: {e}", param_hint=hint) from None
    elif not token:
        raise click.UsageError(
            "a token is required: pass --token-file PATH (or --token, or set "
            f"DELAYQ_API_TOKEN); make one with {MAKE_ONE}"
        )
    return checked_token(token, least=least, what="the API token", param_hint=hint)


main.add_command(schedule)
main.add_command(info)
main.add_command(task)
main.add_command(dead)
main.add_command(check)
main.add_command(dashboard)
main.add_command(reshard)
main.add_command(cron)
main.add_command(protocol)
main.add_command(limit)
main.add_command(pause)
main.add_command(resume)
main.add_command(settings)

if __name__ == "__main__":
    main()
