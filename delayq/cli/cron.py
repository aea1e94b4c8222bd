"""``delayq cron``: the periodic schedules stored on a queue."""

from __future__ import annotations

import json
from datetime import datetime
from zoneinfo import ZoneInfo

import click

from delayq.admin.present import relative
from delayq.cli.common import QUEUE_ENV, json_option, queue_option, url_option
from delayq.cron import facade as cron_facade
from delayq.cron import ops as cron_ops
from delayq.errors import DelayqError
from delayq.queue import Queue


def _open(queue: str | None, url: str | None) -> Queue:
    if not queue:
        raise click.UsageError(f"which queue? pass --queue NAME or set ${QUEUE_ENV}")
    try:
        # A split queue's schedules live on its shard 0: open it with its stored count.
        return Queue(queue, url=url, shards="stored")
    except (DelayqError, ValueError) as e:
        raise click.ClickException(str(e)) from None


def _read(q: Queue) -> cron_facade.CronState:
    try:
        return q.runner.run(cron_facade.read(q.core))
    except DelayqError as e:
        raise click.ClickException(str(e)) from None


def _when(when: datetime | None, tz: str | None, now: datetime) -> str:
    if when is None:
        return "-"
    local = when.astimezone(ZoneInfo(tz)) if tz else when
    return f"{local.strftime('%Y-%m-%d %H:%M:%S%z')} ({relative(when, now)})"


def _note(info: cron_facade.ScheduleInfo) -> str:
    notes = []
    if info.parked_since is not None:
        notes.append("parked: no live worker declares it")
    elif info.next_state == "aborted":
        notes.append("next occurrence aborted: the next worker check schedules the one after")
    elif info.next_state not in ("scheduled", "active"):
        notes.append("next occurrence missing: the next worker check recreates it")
    if info.running:
        notes.append(f"{info.running} running")
    if info.skipped:
        notes.append(f"{info.skipped} skipped")
    return "; ".join(notes)


def _outcome(info: cron_facade.ScheduleInfo) -> str:
    if info.last_status is None:
        return "-"
    if info.last_error:
        return f"{info.last_status}: {info.last_error.splitlines()[0][:60]}"
    return info.last_status


@click.group()
def cron() -> None:
    """Periodic schedules (declared with @worker.cron / @worker.every)."""


@cron.command("list")
@queue_option
@url_option
@json_option
def list_(queue: str | None, url: str | None, as_json: bool) -> None:
    """Each schedule: its expression, next run, last run and how it ended."""
    q = _open(queue, url)
    try:
        infos = q.schedules()
        now = q.stats().now if infos and not as_json else None
    except DelayqError as e:
        raise click.ClickException(str(e)) from None
    finally:
        q.close()
    if as_json:
        click.echo(json.dumps([i.as_dict() for i in infos], indent=2))
        return
    if now is None:
        click.echo(f"no schedules on queue {q.name!r}")
        return
    rows = [("NAME", "SCHEDULE", "NEXT RUN", "LAST RUN", "OUTCOME", "NOTE")]
    for i in infos:
        spec = f"{i.spec} ({i.tz})" if i.tz else i.spec
        rows.append(
            (
                i.name,
                spec,
                _when(i.next_at, i.tz, now),
                _when(i.last_at, i.tz, now),
                _outcome(i),
                _note(i),
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


@cron.command("remove")
@click.argument("name")
@queue_option
@url_option
@click.option("--force", is_flag=True, help="Remove it even if a live worker declares it.")
def remove(name: str, queue: str | None, url: str | None, force: bool) -> None:
    """Forget schedule NAME and remove its pending occurrence.

    Workers forget schedules no live worker declares by themselves (they park them); this is
    for a schedule whose last declaring worker is gone for good. A worker that still declares
    it recreates it at its next check, so that is refused without --force.
    """
    q = _open(queue, url)
    try:
        runner = q.runner
        state = _read(q)
        st = state.schedules.get(name)
        if st is None:
            raise click.ClickException(f"no schedule {name!r} on queue {q.name!r}")
        kind = st.data.get("kind", f"cron:{name}")
        live = [w.id for w in runner.run(q.core.workers(limit=1000)) if w.alive and kind in w.kinds]
        if live and not force:
            raise click.ClickException(
                f"schedule {name!r} is declared by {len(live)} live worker(s) ({live[0]} ...); "
                "remove it from their code first, or pass --force"
            )
        next_id = st.data.get("next_id")
        cancel = next_id if isinstance(next_id, str) and st.next_state == "scheduled" else ""
        change = cron_ops.Change(name, st.raw, None, cancel=cancel)
        if not runner.run(cron_ops.sync(q.core, [change]))[0]:
            raise click.ClickException(f"schedule {name!r} changed meanwhile; try again")
    except DelayqError as e:
        raise click.ClickException(str(e)) from None
    finally:
        q.close()
    click.echo(
        f"removed schedule {name!r}" + (f" and its pending occurrence {cancel}" if cancel else "")
    )
