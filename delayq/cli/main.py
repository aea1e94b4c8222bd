"""The ``delayq`` command."""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
from contextlib import ExitStack
from typing import Any

import click

from delayq.cli.admin import info, schedule, task
from delayq.cli.dead import dead
from delayq.cli.ops import check, dashboard, reshard
from delayq.connection import URL_ENV
from delayq.cron.cli import cron


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


def _logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s",
    )


@click.group()
@click.version_option(package_name="delayq")
def main() -> None:
    """delayq: reliable delayed tasks on Redis and Valkey."""


@main.command()
@click.argument("app")
@click.option("--embedded", is_flag=True, help="Start a private server and point the app at it.")
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics on this port (/metrics).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Address for --metrics-port (0.0.0.0 to let a remote Prometheus scrape it).",
)
def worker(
    app: str, embedded: bool, log_level: str, metrics_port: int | None, metrics_host: str
) -> None:
    """Run the Worker found at APP (MODULE:ATTRIBUTE) until SIGINT or SIGTERM."""
    from delayq.worker import Worker
    from delayq.worker.supervise import WorkerFailed

    _logging(log_level)
    with ExitStack() as stack:
        if embedded:
            from delayq.embedded import EmbeddedServer

            server = stack.enter_context(EmbeddedServer(data_dir=".delayq/data"))
            os.environ[URL_ENV[0]] = server.url
            click.echo(f"embedded server on {server.url} (data in .delayq/data)", err=True)
        obj = load_app(app)
        if _is_factory(obj):
            obj = obj()
        if not isinstance(obj, Worker):
            raise click.BadParameter(f"{app!r} is a {type(obj).__name__}, not a delayq Worker")
        if metrics_port is not None:
            from delayq.admin.metrics import serve_worker_metrics

            try:
                metrics = serve_worker_metrics(obj, metrics_port, metrics_host)
            except OSError as e:
                raise click.ClickException(
                    f"cannot serve metrics on {metrics_host}:{metrics_port}: {e}"
                ) from None
            stack.callback(metrics.stop)
            click.echo(f"metrics on http://{metrics_host}:{metrics.port}/metrics", err=True)
        try:
            obj.run()
        except WorkerFailed as e:  # the log above has the tracebacks; exit 1 with the cause
            raise click.ClickException(str(e)) from None


@main.command()
@click.option(
    "--url",
    default=None,
    help=f"Redis URL (default: ${URL_ENV[0]} or ${URL_ENV[1]} if set, else embedded).",
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
    """Close unpaid orders on time, once, with stock restored — while a worker is killed."""
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
    sys.exit(run_demo(cfg))


main.add_command(schedule)
main.add_command(info)
main.add_command(task)
main.add_command(dead)
main.add_command(check)
main.add_command(dashboard)
main.add_command(reshard)
main.add_command(cron)

if __name__ == "__main__":
    main()
