"""``delayq dead ls|replay|purge``: the dead-letter set, with a progress bar on bulk work."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from delayq.admin import operate
from delayq.admin.present import first_line
from delayq.cli.common import (
    IDS_MAY_START_WITH_DASH,
    connect,
    console,
    duration,
    echo_json,
    json_option,
    need_queue,
    queue_option,
    relative,
    safe,
    task_dict,
    url_option,
)
from delayq.errors import InvalidTaskError
from delayq.queue import Queue


@click.group()
def dead() -> None:
    """List, replay or purge dead tasks."""


@dead.command("ls")
@queue_option
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
@click.option(
    "--after",
    metavar="CURSOR",
    help="Start after this cursor (printed under each page): as quick however deep.",
)
@click.option(
    "--offset",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Skip this many (on a split queue each shard reads them all: prefer --after).",
)
@url_option
@json_option
def dead_ls(
    queue: str | None, limit: int, after: str | None, offset: int, url: str | None, as_json: bool
) -> None:
    """Dead tasks, most recent first, with the reason each died."""
    following: str | None = None
    with connect(url) as admin:
        name = need_queue(admin, queue)
        if offset and after is None:
            tasks = admin.dead(name, offset, limit)
        else:
            try:
                page = admin.page(name, "dead", limit, after)
            except InvalidTaskError as e:
                raise click.BadParameter(str(e), param_hint="--after") from None
            tasks, following = page.tasks, page.next
        total, now = (s := admin.queue(name).stats()).dead, s.now
    if as_json:
        echo_json(
            {
                "queue": name,
                "total": total,
                "offset": offset,
                "next": following,
                "tasks": [task_dict(t) for t in tasks],
            }
        )
        return
    table = Table(header_style="bold", title=f"{total} dead in {name}", title_justify="left")
    for col in ("id", "kind", "died", "attempts", "reason"):
        table.add_column(col, overflow="fold")
    for t in tasks:
        table.add_row(
            Text(safe(t.id)),
            Text(safe(t.kind)),
            relative(t.finished_at, now),
            str(t.attempts),
            Text(first_line(t.last_error) or "-"),
        )
    console().print(table)
    if following is not None:
        click.echo(f"more with --after {shlex.quote(following)}")
    elif offset and offset + len(tasks) < total:
        click.echo(
            f"showing {offset + 1}-{offset + len(tasks)}; more with --offset {offset + len(tasks)}"
        )


def _bulk(
    verb: str,
    queue: Queue,
    count: int | None,
    quiet: bool,
    work: Callable[[Callable[[int], None]], int],
) -> int:
    """Run ``work`` with a progress bar on stderr (none in --json mode)."""
    if quiet:
        return work(lambda _n: None)
    columns = [
        TextColumn(f"{verb} {queue.name}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=console(stderr=True), transient=False) as bar:
        job = bar.add_task(verb, total=count)
        return work(lambda n: bar.advance(job, n))


def _confirm(yes: bool, what: str) -> None:
    if not yes and not click.confirm(f"{what}?", default=False, err=True):
        raise click.ClickException("nothing changed (pass --yes to skip this question)")


def _target(ids: tuple[str, ...], everything: bool, older: float | None = None) -> list[str] | None:
    if ids and (everything or older is not None):
        raise click.UsageError("give task ids, or --all, not both")
    if not ids and not everything and older is None:
        raise click.UsageError("give the ids of dead tasks, or --all")
    return list(ids) if ids else None


@dead.command("replay", context_settings=IDS_MAY_START_WITH_DASH)
@click.argument("ids", nargs=-1, metavar="[ID]...")
@click.option("--all", "everything", is_flag=True, help="Replay every dead task, oldest first.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@queue_option
@url_option
@json_option
def dead_replay(
    ids: tuple[str, ...],
    everything: bool,
    yes: bool,
    queue: str | None,
    url: str | None,
    as_json: bool,
) -> None:
    """Run dead tasks again: due now, with a fresh attempt budget (asks first with --all)."""
    target = _target(ids, everything)
    with connect(url) as admin:
        q = admin.queue(need_queue(admin, queue))
        count = len(target) if target is not None else q.stats().dead
        if target is None:
            _confirm(yes, f"replay all {count} dead task(s) of queue {q.name!r}")
        try:
            n = _bulk("replaying", q, count, as_json, lambda p: operate.replay_dead(q, target, p))
        except InvalidTaskError as e:
            raise click.BadParameter(str(e), param_hint="ID") from None
    _done("replayed", q.name, n, target, as_json)


@dead.command("purge", context_settings=IDS_MAY_START_WITH_DASH)
@click.argument("ids", nargs=-1, metavar="[ID]...")
@click.option("--all", "everything", is_flag=True, help="Delete every dead task.")
@click.option(
    "--older-than", metavar="DURATION", help="Only tasks that died this long ago (7d, 12h)."
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@queue_option
@url_option
@json_option
def dead_purge(
    ids: tuple[str, ...],
    everything: bool,
    older_than: str | None,
    yes: bool,
    queue: str | None,
    url: str | None,
    as_json: bool,
) -> None:
    """Delete dead tasks for good (asks first unless --yes)."""
    older = duration(older_than, "--older-than")
    target = _target(ids, everything, older)
    with connect(url) as admin:
        q = admin.queue(need_queue(admin, queue))
        if target is not None:
            count: int | None = len(target)
            what = f"delete {count} dead task(s) of queue {q.name!r} for good"
        elif older is None:
            count = q.stats().dead
            what = f"delete all {count} dead task(s) of queue {q.name!r} for good"
        else:
            count = None  # unknown until done
            what = f"delete the dead tasks of queue {q.name!r} that died over {older_than} ago"
        _confirm(yes, what)
        try:
            n = _bulk(
                "purging",
                q,
                count,
                as_json,
                lambda p: operate.purge_dead(q, target, older_than=older, progress=p),
            )
        except InvalidTaskError as e:
            raise click.BadParameter(str(e), param_hint="ID") from None
    _done("purged", q.name, n, target, as_json)


def _done(verb: str, name: str, n: int, target: list[str] | None, as_json: bool) -> None:
    """Report a replay or purge; exit 1 when ids were given and some were not dead, as
    ``task cancel`` does for an id that is not waiting (docs/operations-cli.md, exit codes)."""
    asked = len(set(target)) if target is not None else None
    ok = asked is None or n == asked
    if as_json:
        out: dict[str, object] = {"queue": name, verb: n}
        if asked is not None:
            out |= {"asked": asked, "ok": ok}
        echo_json(out)
    elif ok:
        click.echo(f"{verb} {n} task(s) of {name}")
    else:
        click.echo(
            f"{verb} {n} of the {asked} task(s) given: the others are not dead tasks of "
            f"{name} (delayq task show ID says where they are)",
            err=True,
        )
    if not ok:
        sys.exit(1)
