"""The ``delayq`` command."""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import click

from delayq.cli.admin import info, schedule, task
from delayq.cli.common import QUEUE_ENV, duration
from delayq.cli.controls import limit, pause, resume
from delayq.cli.dead import dead
from delayq.cli.ops import check, dashboard, reshard
from delayq.connection import DEFAULT_URL, URL_ENV, redact, resolve_url
from delayq.cron.cli import cron
from delayq.embedded.server import BINARY_ENV
from delayq.errors import ConfigurationError, MissingExtra, ServerNotFound
from delayq.protocol.cli import protocol
from delayq.worker.options import MAX_CONCURRENCY

log = logging.getLogger("delayq.cli")

RECYCLE_ENV = "DELAYQ_RECYCLE_STUCK"


def load_app(spec: str) -> Any:
    """Import ``module:attribute`` (the current directory is importable, as with uvicorn)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise click.BadParameter(f"{spec!r} is not MODULE:ATTRIBUTE, e.g. myapp.tasks:worker")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise click.BadParameter(f"cannot import {module_name!r}: {e}") from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise click.BadParameter(f"{module_name!r} has no attribute {attr!r}") from None
    return obj


def _is_factory(obj: Any) -> bool:
    """A function taking no arguments may build the Worker (``myapp:make_worker``)."""
    if not inspect.isfunction(obj):
        return False
    params = inspect.signature(obj).parameters.values()
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params
    )


def _logging(level: str, fmt: str = "text") -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        from delayq.logs import JsonFormatter

        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s")
        )
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])


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


WORKER_HELP = f"""Run the Worker found at APP (MODULE:ATTRIBUTE) until SIGINT or SIGTERM.

APP is a Worker, or a function of no arguments that returns one.

--url sets ${URL_ENV[0]} before APP is imported, so it is the URL of every Queue APP
builds without url= (a Queue reads ${URL_ENV[0]}, else ${URL_ENV[1]}, else
{DEFAULT_URL}). If the worker's queue was given another url= in code, --url is
refused rather than ignored. --concurrency and --lease replace the values APP passed
to Worker(...).

--processes N runs N worker processes under a supervisor (this process): each is
this command with --processes 1; one that dies is restarted (backoff 1 s to 30 s);
SIGTERM/SIGINT are forwarded to all of them, which finish their running tasks within
the worker's grace; children that keep failing at start make it exit 1. With
--metrics-port the supervisor serves all of their metrics on that one port.

--recycle-stuck SECONDS runs the worker processes under a supervisor (even one) and
recycles a process one of whose sync handlers has run SECONDS past its attempt (its
timeout passed, its lease was lost, or it was aborted: a thread cannot be stopped):
the process stops gracefully and a new one is started at once.

\b
Environment:
  {URL_ENV[0]}, {URL_ENV[1]}  Redis URL of APP's queues
  {BINARY_ENV}  server binary for --embedded
  {RECYCLE_ENV}  --recycle-stuck
"""


@main.command(help=WORKER_HELP)
@click.argument("app")
@click.option(
    "--url",
    default=None,
    metavar="URL",
    help=f"Redis URL for APP's queue [default: ${URL_ENV[0]}, else ${URL_ENV[1]}].",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, MAX_CONCURRENCY),
    default=None,
    help="Tasks run at once (handler threads) [default: APP's Worker(concurrency=)].",
)
@click.option(
    "--lease",
    metavar="DURATION",
    default=None,
    help="How long a claimed task is held, e.g. 30s, 2m [default: APP's Worker(lease=)].",
)
@click.option(
    "--embedded",
    is_flag=True,
    help="Start a private server (data in .delayq/data) and point the app at it.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@click.option(
    "--log-format",
    default="text",
    show_default=True,
    type=click.Choice(["text", "json"]),
    help="json: one JSON object per line (time, level, logger, message, task_id, kind, "
    "attempt, queue, exception).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics on this port (/metrics); with --processes, the "
    "supervisor serves every worker process's there.",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Address for --metrics-port (0.0.0.0 to let a remote Prometheus scrape it).",
)
@click.option(
    "--processes",
    default="1",
    show_default=True,
    metavar="N|auto",
    help="Worker processes under one supervisor (auto: one per core this process may use).",
)
@click.option(
    "--recycle-stuck",
    metavar="DURATION",
    default=None,
    envvar=RECYCLE_ENV,
    help="Replace a worker process whose sync handler has run this long past its timeout "
    "(or lost lease, or abort), e.g. 60s; implies a supervisor, even of one process.",
)
def worker(
    app: str,
    url: str | None,
    concurrency: int | None,
    lease: str | None,
    embedded: bool,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
    processes: str,
    recycle_stuck: str | None,
) -> None:
    from delayq.processes import child
    from delayq.processes.supervisor import process_count
    from delayq.worker.supervise import WorkerFailed

    if url is not None and embedded:
        raise click.UsageError("pass --url or --embedded, not both")
    lease_s = duration(lease, "--lease")
    recycle_s = duration(recycle_stuck, "--recycle-stuck")
    if recycle_s is not None and recycle_s <= 0:
        raise click.BadParameter(
            f"must be a duration above 0, got {recycle_stuck!r}", param_hint="--recycle-stuck"
        )
    try:
        n = process_count(processes)
    except ConfigurationError as e:
        raise click.BadParameter(str(e), param_hint="--processes") from None
    _logging(log_level, log_format)
    with ExitStack() as stack:
        if embedded:
            url = _embedded(stack)
        obj = _load_worker(app, url, concurrency, lease_s)
        supervised = child.supervised()
        if n > 1 or (recycle_s is not None and not supervised):
            options = [f"--log-level={log_level}", f"--log-format={log_format}"]
            options += [f"--url={url}"] if url is not None else []
            options += [f"--concurrency={concurrency}"] if concurrency is not None else []
            options += [f"--lease={lease}"] if lease is not None else []
            options += [f"--recycle-stuck={recycle_s}"] if recycle_s is not None else []
            code = _supervise(obj, app, n, options, metrics_port, metrics_host, stack)
            if code:
                raise click.ClickException("worker processes keep failing at start")
            return
        recycle = child.prepare(obj, recycle_s) if supervised else None
        if metrics_port is not None:
            stack.callback(_serve_metrics(obj, metrics_port, metrics_host))
        try:
            obj.run()
        except WorkerFailed as e:  # the log above has the tracebacks; exit 1 with the cause
            raise click.ClickException(str(e)) from None
    if recycle is not None and recycle.recycled:
        sys.exit(child.RECYCLE_EXIT)


def _load_worker(app: str, url: str | None, concurrency: int | None, lease_s: Any) -> Any:
    """Import APP's Worker (with --url in the environment first) and apply the options."""
    from delayq.worker import Worker

    if url is not None:
        os.environ[URL_ENV[0]] = url  # before APP is imported: its queues read it
    obj = load_app(app)
    if _is_factory(obj):
        obj = obj()
    if not isinstance(obj, Worker):
        raise click.BadParameter(f"{app!r} is a {type(obj).__name__}, not a delayq Worker")
    for q in obj.queues:
        if url is not None and q.url != url:
            raise click.UsageError(
                f"{app}'s queue {q.name!r} connects to {redact(q.url)}, set "
                f"with url= in its code: --url {redact(url)} applies only to a Queue built "
                f"without url= (drop url=, or drop --url)"
            )
    try:
        obj.configure(concurrency=concurrency, lease=lease_s)
    except ConfigurationError as e:
        raise click.BadParameter(str(e)) from None
    return obj


def _supervise(
    obj: Any,
    app: str,
    n: int,
    options: list[str],
    metrics_port: int | None,
    metrics_host: str,
    stack: ExitStack,
) -> int:
    """Run ``n`` worker processes of APP (imported here first, so a broken app fails once)
    under a supervisor; returns its exit code."""
    from delayq.processes.child import METRICS_ENV
    from delayq.processes.supervisor import ProcessSupervisor

    env: dict[str, str] = {}
    on_exit: Callable[[int], None] = lambda pid: None  # noqa: E731
    if metrics_port is not None:
        from delayq.processes.metrics import SupervisorMetrics

        try:
            metrics = SupervisorMetrics(obj, metrics_port, metrics_host)
        except OSError as e:
            raise click.ClickException(
                f"cannot serve metrics on {metrics_host}:{metrics_port}: {e}"
            ) from None
        stack.callback(metrics.stop)
        log.info("metrics on http://%s:%d/metrics", metrics_host, metrics.port)
        env = {**metrics.env(), METRICS_ENV: "1"}
        on_exit = metrics.process_dead
    command = [sys.executable, "-m", "delayq", "worker", app, "--processes=1", *options]
    supervisor = ProcessSupervisor(command, n, grace_s=obj.grace_s, env=env, on_exit=on_exit)
    return supervisor.run()


def _embedded(stack: ExitStack) -> str:
    from delayq.embedded import EmbeddedServer

    try:
        server = stack.enter_context(EmbeddedServer(data_dir=".delayq/data"))
    except ServerNotFound as e:
        raise click.ClickException(str(e)) from None
    # Logged, not echoed: with --log-format json every line of the stream is one object.
    log.info("embedded server on %s (data in .delayq/data)", server.url)
    return server.url


def _serve_metrics(obj: Any, port: int, host: str) -> Callable[[], None]:
    from delayq.admin.metrics import serve_worker_metrics

    try:
        metrics = serve_worker_metrics(obj, port, host)
    except OSError as e:
        raise click.ClickException(f"cannot serve metrics on {host}:{port}: {e}") from None
    log.info("metrics on http://%s:%d/metrics", host, metrics.port)
    return metrics.stop


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


API_HELP = f"""Serve the HTTP API: schedule, look up, cancel and reschedule tasks, and set
watched keys, from any service (docs/http.md).

Every request under /v1 and /readyz must carry 'Authorization: Bearer TOKEN'; /healthz
and /openapi.json are open. A token is required: --token, $DELAYQ_API_TOKEN or
--token-file (at least 16 characters). With -q, only the queues named are served.
Listens on 127.0.0.1 unless --host says otherwise.
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
def api(
    url: str | None,
    queues: tuple[str, ...],
    host: str,
    port: int,
    token: str | None,
    token_file: str | None,
    log_level: str,
    access_log: bool,
) -> None:
    try:
        from delayq.http import base_url, bind, serve
        from delayq.http.app import MIN_TOKEN
    except MissingExtra as e:
        raise click.ClickException(str(e)) from None

    token = _api_token(token, token_file, MIN_TOKEN)
    try:
        where = redact(resolve_url(url))
    except ConfigurationError as e:
        raise click.BadParameter(str(e), param_hint="--url") from None
    _logging(log_level)
    try:
        sock = bind(host, port)
    except OSError as e:
        raise click.ClickException(f"cannot listen on {host}:{port}: {e}") from None
    click.echo(f"delayq HTTP API on {base_url(sock)} (Redis {where})", err=True)
    try:
        serve(
            url,
            token=token,
            sock=sock,
            queues=[q for item in queues for q in item.replace(",", " ").split()],
            log_level=log_level,
            access_log=access_log,
        )
    except ConfigurationError as e:
        raise click.ClickException(str(e)) from None


def _api_token(token: str | None, token_file: str | None, least: int) -> str:
    if token and token_file:
        raise click.UsageError("pass --token or --token-file, not both")
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.readline().strip()
        except OSError as e:
            raise click.BadParameter(f"cannot read it: {e}", param_hint="--token-file") from None
    if not token:
        raise click.UsageError(
            "a token is required: pass --token-file PATH (or --token, or set "
            "DELAYQ_API_TOKEN); make one with "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    if len(token) < least:
        raise click.BadParameter(f"use at least {least} characters", param_hint="--token")
    return token


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

if __name__ == "__main__":
    main()
