"""``delayq settings``: show and set the settings every producer of a queue follows (the
dedupe window, the largest payload, the codec), stored with the queue (delayq/settings.py)."""

from __future__ import annotations

import click

from delayq.cli.common import (
    allow_empty_option,
    connect,
    duration,
    echo_json,
    human_seconds,
    json_option,
    known_queues,
    need_queue,
    queue_option,
    url_option,
)
from delayq.errors import InvalidTaskError
from delayq.settings import CODECS, QueueSettings, parse_size


def size(text: str | None, what: str) -> int | None:
    """A size as the CLI writes them (``1000``, ``16KiB``, ``1MiB``), or a usage error."""
    if text is None:
        return None
    try:
        return parse_size(text)
    except InvalidTaskError as e:
        raise click.BadParameter(str(e), param_hint=what) from None


def human_size(n: int) -> str:
    """16384 -> '16 KiB (16384 bytes)'; 1000 -> '1000 bytes'."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit} ({n} bytes)"
    return f"{n} bytes"


def _show(name: str, s: QueueSettings, as_json: bool) -> None:
    if as_json:
        echo_json({"queue": name, **s.as_dict()})
        return
    rows = (
        ("dedupe_window", human_seconds(s.dedupe_window, exact=True)),
        ("max_payload", human_size(s.max_payload)),
        ("codec", s.codec),
    )
    click.echo(f"queue {name}:")
    for field, value in rows:
        where = "stored with the queue" if field in s.stored else "default"
        click.echo(f"  {field:<14} {value:<24} {where}")


@click.command()
@queue_option
@click.option(
    "--dedupe-window",
    default=None,
    metavar="DURATION",
    help="How long a finished task id is remembered (90s, 15m, 2h, 1d) [default: 24h].",
)
@click.option(
    "--max-payload",
    default=None,
    metavar="SIZE",
    help="Largest encoded payload (1000, 16KiB, 1MiB) [default: 64KiB].",
)
@click.option(
    "--codec",
    type=click.Choice(CODECS),
    default=None,
    help="How payloads are encoded [default: json].",
)
@allow_empty_option
@url_option
@json_option
def settings(
    queue: str | None,
    dedupe_window: str | None,
    max_payload: str | None,
    codec: str | None,
    allow_empty: bool,
    url: str | None,
    as_json: bool,
) -> None:
    """Show or set the settings every producer of the queue follows.

    They are stored with the queue, so every process of it (Python, `delayq api`, the Node
    client) uses the same ones: a process opened with another value is refused. Without an
    option, shows them (a value the queue does not store is the default). A queue no process
    has written is refused as a probable typo, to show or set, unless --allow-empty. A process keeps
    what it read when it first used the queue: restart producers and workers after a change.
    """
    window = duration(dedupe_window, "--dedupe-window")
    most = size(max_payload, "--max-payload")
    setting = window is not None or most is not None or codec is not None
    with connect(url) as admin:
        name = need_queue(admin, queue, new=True)
        known_queues(admin, (name,), allow_empty)  # (a typo is refused, to set as to show)
        q = admin.queue(name)
        if setting:
            try:
                s = q.update_settings(dedupe_window=window, max_payload=most, codec=codec)
            except InvalidTaskError as e:
                what = "--dedupe-window" if "dedupe_window" in str(e) else "--max-payload"
                raise click.BadParameter(str(e), param_hint=what) from None
        else:
            s = q.settings()
        _show(name, s, as_json)
