"""``delayq worker``: run an app's Worker, in this process or under a supervisor of several."""

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

from delayq.cli.common import configure_logging, duration
from delayq.connection import DEFAULT_URL, URL_ENV, redact
from delayq.embedded.server import BINARY_ENV
from delayq.errors import ConfigurationError, ServerNotFound
from delayq.worker.options import MAX_CONCURRENCY

log = logging.getLogger("delayq.cli")


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


WORKER_HELP = f"""Run the Worker found at APP (MODULE:ATTRIBUTE) until SIGINT or SIGTERM.

APP is a Worker, or a function of no arguments that returns one.

--url sets ${URL_ENV[0]} before APP is imported, so it is the URL of every Queue APP
builds without url= (a Queue reads ${URL_ENV[0]}, else ${URL_ENV[1]}, else
{DEFAULT_URL}). If the worker's queue was given another url= in code, --url is
refused rather than ignored. --concurrency, --lease and --unknown-kind-grace replace
the values APP passed to Worker(...).

--processes N runs N worker processes under a supervisor (this process): each is
this command with --processes 1; one that dies is restarted (backoff 1 s to 30 s);
SIGTERM/SIGINT are forwarded to all of them, which finish their running tasks within
the worker's grace; children that keep failing at start make it exit 1. With
--metrics-port the supervisor serves all of their metrics on that one port.

--recycle-stuck SECONDS runs the worker processes under a supervisor (even one) and
recycles a process one of whose sync handlers has run SECONDS past its attempt (its
timeout passed, its lease was lost, or it was aborted: a thread cannot be stopped):
the process stops gracefully and a new one is started at once.

Every option but --url can come from the environment instead (its variable is shown
beside it); an option on the command line wins.

\b
Environment:
  {URL_ENV[0]}, {URL_ENV[1]}  Redis URL of APP's queues
  {BINARY_ENV}  server binary for --embedded
"""

# The environment variables of delayq worker's options (--url has none: the app's queues
# read DELAYQ_REDIS_URL themselves, and --url sets it).
CONCURRENCY_ENV = "DELAYQ_CONCURRENCY"
LEASE_ENV = "DELAYQ_LEASE"
UNKNOWN_KIND_GRACE_ENV = "DELAYQ_UNKNOWN_KIND_GRACE"
EMBEDDED_ENV = "DELAYQ_EMBEDDED"
EMBEDDED_PORT_ENV = "DELAYQ_EMBEDDED_PORT"
LOG_LEVEL_ENV = "DELAYQ_LOG_LEVEL"
LOG_FORMAT_ENV = "DELAYQ_LOG_FORMAT"
METRICS_PORT_ENV = "DELAYQ_METRICS_PORT"
METRICS_HOST_ENV = "DELAYQ_METRICS_HOST"
PROCESSES_ENV = "DELAYQ_PROCESSES"
RECYCLE_ENV = "DELAYQ_RECYCLE_STUCK"


@click.command(help=WORKER_HELP)
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
    envvar=CONCURRENCY_ENV,
    show_envvar=True,
    help="Tasks run at once (handler threads) [default: APP's Worker(concurrency=)].",
)
@click.option(
    "--lease",
    metavar="DURATION",
    default=None,
    envvar=LEASE_ENV,
    show_envvar=True,
    help="How long a claimed task is held, e.g. 30s, 2m [default: APP's Worker(lease=)].",
)
@click.option(
    "--unknown-kind-grace",
    metavar="DURATION",
    default=None,
    envvar=UNKNOWN_KIND_GRACE_ENV,
    show_envvar=True,
    help="How long a task of a kind APP has no handler for is handed back before it is "
    "dead, from when it fell due, e.g. 1h, 0 to bury at once "
    "[default: APP's Worker(unknown_kind_grace=), 1h].",
)
@click.option(
    "--embedded",
    is_flag=True,
    envvar=EMBEDDED_ENV,
    show_envvar=True,
    help="Start a private server (data in .delayq/data) and point the app at it.",
)
@click.option(
    "--embedded-port",
    type=click.IntRange(1, 65535),
    default=None,
    envvar=EMBEDDED_PORT_ENV,
    show_envvar=True,
    help="The --embedded server's port, kept across restarts so that producers can find it "
    "(implies --embedded) [default: a free port].",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    envvar=LOG_LEVEL_ENV,
    show_envvar=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@click.option(
    "--log-format",
    default="text",
    show_default=True,
    envvar=LOG_FORMAT_ENV,
    show_envvar=True,
    type=click.Choice(["text", "json"]),
    help="json: one JSON object per line (time, level, logger, message, task_id, kind, "
    "attempt, queue, exception).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    envvar=METRICS_PORT_ENV,
    show_envvar=True,
    help="Serve Prometheus metrics on this port (/metrics); with --processes, the "
    "supervisor serves every worker process's there.",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    envvar=METRICS_HOST_ENV,
    show_envvar=True,
    help="Address for --metrics-port (0.0.0.0 to let a remote Prometheus scrape it).",
)
@click.option(
    "--processes",
    default="1",
    show_default=True,
    envvar=PROCESSES_ENV,
    show_envvar=True,
    metavar="N|auto",
    help="Worker processes under one supervisor (auto: one per core this process may use).",
)
@click.option(
    "--recycle-stuck",
    metavar="DURATION",
    default=None,
    envvar=RECYCLE_ENV,
    show_envvar=True,
    help="Replace a worker process whose sync handler has run this long past its timeout "
    "(or lost lease, or abort), e.g. 60s; implies a supervisor, even of one process.",
)
@click.pass_context
def worker(
    ctx: click.Context,
    app: str,
    url: str | None,
    concurrency: int | None,
    lease: str | None,
    unknown_kind_grace: str | None,
    embedded: bool,
    embedded_port: int | None,
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

    embedded, metrics_port = _from_the_environment(
        ctx, url, embedded or embedded_port is not None, metrics_port
    )
    if url is not None and embedded:
        raise click.UsageError("pass --url or --embedded, not both")
    lease_s = duration(lease, "--lease")
    unknown_s = duration(unknown_kind_grace, "--unknown-kind-grace")
    recycle_s = duration(recycle_stuck, "--recycle-stuck")
    if recycle_s is not None and recycle_s <= 0:
        raise click.BadParameter(
            f"must be a duration above 0, got {recycle_stuck!r}", param_hint="--recycle-stuck"
        )
    try:
        n = process_count(processes)
    except ConfigurationError as e:
        raise click.BadParameter(str(e), param_hint="--processes") from None
    configure_logging(log_level, log_format)
    with ExitStack() as stack:
        if embedded:
            url = _embedded(stack, embedded_port)
        obj = _load_worker(app, url, concurrency, lease_s, unknown_s)
        supervised = child.supervised()
        if n > 1 or (recycle_s is not None and not supervised):
            options = [f"--log-level={log_level}", f"--log-format={log_format}"]
            options += [f"--url={url}"] if url is not None else []
            options += [f"--concurrency={concurrency}"] if concurrency is not None else []
            options += [f"--lease={lease}"] if lease is not None else []
            if unknown_kind_grace is not None:
                options += [f"--unknown-kind-grace={unknown_kind_grace}"]
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


def _from_the_environment(
    ctx: click.Context, url: str | None, embedded: bool, metrics_port: int | None
) -> tuple[bool, int | None]:
    """--embedded and --metrics-port as this process should take them. The worker processes
    of --processes inherit the supervisor's environment, and run with its --url (that of its
    embedded server) and without --metrics-port (the supervisor serves their metrics): a
    $DELAYQ_EMBEDDED or $DELAYQ_METRICS_PORT the supervisor read is not for them."""
    from delayq.processes import child

    env = click.core.ParameterSource.ENVIRONMENT
    if (
        embedded
        and url is not None
        and env
        in (
            ctx.get_parameter_source("embedded"),
            ctx.get_parameter_source("embedded_port"),
        )
    ):
        embedded = False  # --url on the command line wins over the environment
    if child.supervised() and ctx.get_parameter_source("metrics_port") == env:
        metrics_port = None
    return embedded, metrics_port


def _load_worker(
    app: str, url: str | None, concurrency: int | None, lease_s: Any, unknown_s: Any = None
) -> Any:
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
        obj.configure(concurrency=concurrency, lease=lease_s, unknown_kind_grace=unknown_s)
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
    if metrics_port is not None:
        metrics.health.children = supervisor.children
        metrics.health.stopping = lambda: supervisor.stopping
    return supervisor.run()


def _embedded(stack: ExitStack, port: int | None = None) -> str:
    from delayq.embedded import EmbeddedServer

    if port is not None:
        _port_free(port)
    try:
        server = stack.enter_context(EmbeddedServer(port=port, data_dir=".delayq/data"))
    except ServerNotFound as e:
        raise click.ClickException(str(e)) from None
    # Logged, not echoed: with --log-format json every line of the stream is one object.
    log.info("embedded server on %s (data in .delayq/data)", server.url)
    return server.url


def _port_free(port: int) -> None:
    """Refuse a taken --embedded-port before starting the server: its start waits for an
    answer on the port, which another server there would give."""
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise click.ClickException(
                f"cannot start the embedded server on port {port}: {e.strerror or e} "
                "(another server there? pick another --embedded-port, or leave it out for a "
                "free one)"
            ) from None


def _serve_metrics(obj: Any, port: int, host: str) -> Callable[[], None]:
    from delayq.admin.metrics import serve_worker_metrics

    try:
        metrics = serve_worker_metrics(obj, port, host)
    except OSError as e:
        raise click.ClickException(f"cannot serve metrics on {host}:{port}: {e}") from None
    log.info("metrics on http://%s:%d/metrics", host, metrics.port)
    return metrics.stop
