"""Admission controls: ``delayq limit``, ``delayq pause``, ``delayq resume``."""

from __future__ import annotations

import click

from delayq.admin.present import controls_text
from delayq.cli.common import connect, echo_json, json_option, need_queue, queue_option, url_option
from delayq.controls import Controls
from delayq.errors import ConfigurationError


def _as_dict(name: str, c: Controls) -> dict[str, object]:
    limit = c.limit
    return {
        "queue": name,
        "paused": c.paused,
        "rate_limit": None
        if limit is None
        else {"rate": limit.rate, "per_second": limit.per_second, "burst": limit.burst},
    }


def _show(name: str, c: Controls, as_json: bool) -> None:
    if as_json:
        echo_json(_as_dict(name, c))
    else:
        click.echo(f"{name}: {controls_text(c.paused, c.limit, None)}")


@click.command()
@click.argument("rate", required=False, metavar="RATE")
@queue_option
@click.option("--burst", type=int, default=None, help="Tasks that may start at once.")
@click.option("--clear", is_flag=True, help="Remove the queue's rate limit.")
@url_option
@json_option
def limit(
    rate: str | None,
    queue: str | None,
    burst: int | None,
    clear: bool,
    url: str | None,
    as_json: bool,
) -> None:
    """Show, set or clear the queue's rate limit, shared by all its workers.

    RATE is N/s, N/m or N/h (tasks a second, minute or hour: 100/s). --burst (tasks that
    may start at once) defaults to one second's worth, at least 1. Tasks over the limit
    wait in the schedule; nothing is retried for it. Without RATE or --clear, shows it.
    """
    if clear and (rate or burst is not None):
        raise click.UsageError("--clear takes no RATE or --burst")
    with connect(url) as admin:
        q = admin.queue(need_queue(admin, queue, new=True))
        if clear:
            q.clear_rate_limit()
        elif rate is not None:
            try:
                q.set_rate_limit(rate, burst)
            except ConfigurationError as e:
                raise click.BadParameter(str(e), param_hint="RATE or --burst") from None
        elif burst is not None:
            raise click.UsageError("--burst needs a RATE")
        _show(q.name, q.controls(), as_json)


@click.command()
@queue_option
@url_option
@json_option
def pause(queue: str | None, url: str | None, as_json: bool) -> None:
    """Stop workers claiming the queue's tasks until `delayq resume`.

    Running tasks finish and their results are written; expired leases are still handed
    back. Periodic tasks that fall due meanwhile follow their catch-up policy at resume.
    """
    with connect(url) as admin:
        q = admin.queue(need_queue(admin, queue, new=True))
        q.pause()
        _show(q.name, q.controls(), as_json)


@click.command()
@queue_option
@url_option
@json_option
def resume(queue: str | None, url: str | None, as_json: bool) -> None:
    """Let workers claim the queue's tasks again (idle workers hear of it at once)."""
    with connect(url) as admin:
        q = admin.queue(need_queue(admin, queue, new=True))
        q.resume()
        _show(q.name, q.controls(), as_json)
