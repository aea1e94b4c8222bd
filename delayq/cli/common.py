"""What every operator command shares: --url/--queue/--json, connecting with a message that
says where it tried, and terminal-safe formatting."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from delayq.admin.inspect import Admin
from delayq.admin.present import (
    console,
    human_seconds,
    one_line,
    payload_text,
    relative,
    safe,
    task_dict,
)
from delayq.connection import DEFAULT_URL, TLS_FIX, URL_ENV, redact
from delayq.errors import ConfigurationError, ConnectionFailed, DelayqError, InvalidTaskError
from delayq.timing import parse_duration

__all__ = [
    "console",
    "human_seconds",
    "one_line",
    "payload_text",
    "relative",
    "safe",
    "task_dict",
]

F = TypeVar("F", bound=Callable[..., Any])

QUEUE_ENV = "DELAYQ_QUEUE"

# Generated ids are URL-safe base64 and one in 64 starts with "-": read an unknown
# option-like word as an id rather than refusing it.
IDS_MAY_START_WITH_DASH = {"ignore_unknown_options": True}


def url_option(f: F) -> F:
    return click.option(
        "--url",
        default=None,
        metavar="URL",
        help=f"Redis URL [default: ${URL_ENV[0]}, else ${URL_ENV[1]}, else {DEFAULT_URL}].",
    )(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(f)


def _split_queues(
    _ctx: click.Context, _param: click.Parameter, value: tuple[str, ...] | str | None
) -> tuple[str, ...]:
    if value is None:
        return ()
    items = (value,) if isinstance(value, str) else value
    return tuple(q for item in items for q in re.split(r"[,\s]+", item) if q)


def queues_option(f: F) -> F:
    """--queue, repeatable; $DELAYQ_QUEUE may list several, comma-separated."""
    return click.option(
        "--queue",
        "-q",
        "queues",
        multiple=True,
        envvar=QUEUE_ENV,
        callback=_split_queues,
        metavar="NAME",
        help=f"Queue to show (repeatable) [default: ${QUEUE_ENV}, else every queue found].",
    )(f)


def queue_option(f: F) -> F:
    return click.option(
        "--queue",
        "-q",
        "queue",
        envvar=QUEUE_ENV,
        metavar="NAME",
        help=f"The queue [default: ${QUEUE_ENV}].",
    )(f)


def url_source(url: str | None) -> str:
    """Where the URL came from, for error messages."""
    if url is not None:
        return "from --url"
    for var in URL_ENV:
        if os.environ.get(var):
            return f"from ${var}"
    return f"the default; ${URL_ENV[0]} and ${URL_ENV[1]} are not set"


def _reason(e: ConnectionFailed) -> str:
    m = re.search(r"\((.*)\); check", str(e), re.S)
    return m.group(1) if m else str(e)


def _fix(e: ConnectionFailed) -> str:
    """The TLS advice in the message if there is one, else how to start or find a server."""
    text = str(e)
    if TLS_FIX in text:
        fix = text[text.index(TLS_FIX) :]
        return f"{fix[0].upper()}{fix[1:]}."
    return (
        f"Start the server, or point delayq at yours with --url redis://HOST:PORT/DB "
        f"or by setting {URL_ENV[0]} (or {URL_ENV[1]})."
    )


@contextmanager
def connect(url: str | None, queues: tuple[str, ...] = ()) -> Iterator[Admin]:
    """An inspector; a connection failure becomes a message naming the URL and the fix."""
    try:
        admin = Admin(url, queues=queues)
    except (ConfigurationError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    try:
        yield admin
    except ConnectionFailed as e:
        raise click.ClickException(
            f"cannot reach Redis at {redact(admin.url)} ({url_source(url)}): {_reason(e)}\n"
            f"{_fix(e)}"
        ) from None
    except DelayqError as e:
        raise click.ClickException(str(e)) from None
    finally:
        admin.close()


def allow_empty_option(f: F) -> F:
    return click.option(
        "--allow-empty",
        is_flag=True,
        help="Take a --queue no process has written yet as an empty queue (a new deploy) "
        "instead of refusing it as a probable typo.",
    )(f)


def _found(admin: Admin) -> str:
    found = admin.discover()
    return (
        f"queues on {admin.where}: {', '.join(found)}" if found else f"no queues on {admin.where}"
    )


def need_queue(admin: Admin, queue: str | None, *, new: bool = False) -> str:
    """The --queue a command acts on; without one, say which queues exist. A queue no
    process has written is refused the same way, unless the command may begin it (``new``:
    it writes, as schedule and reshard do, or sets controls, which may precede any task)."""
    if queue:
        try:
            name = admin.queue(queue).name
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--queue") from None
        if not new:
            known_queues(admin, (name,), flag=False)
        return name
    raise click.UsageError(
        f"no queue given: pass --queue NAME or set ${QUEUE_ENV} ({_found(admin)})"
    )


def known_queues(
    admin: Admin, queues: tuple[str, ...], allow_empty: bool = False, *, flag: bool = True
) -> None:
    """Refuse the --queue names that no process has written (no producer has scheduled on
    them and no worker has started on them): a typo in a probe would otherwise check an
    empty queue and pass. ``allow_empty`` (``--allow-empty``) takes them as empty; ``flag``:
    the command has that option, and the message offers it."""
    if allow_empty:
        return
    missing = [q for q in queues if not admin.exists(q)]
    if missing:
        names = ", ".join(repr(q) for q in missing)
        fix = "Check the name" + (
            ", or pass --allow-empty for a queue a new deploy has not used yet" if flag else ""
        )
        raise click.BadParameter(
            f"no queue {names} on {admin.where}: nothing has been scheduled on it and no "
            f"worker has started on it ({_found(admin)}). {fix}",
            param_hint="--queue",
        )


def duration(text: str | None, what: str) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except InvalidTaskError as e:
        raise click.BadParameter(str(e), param_hint=what) from None


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def browsable(base: str) -> list[str]:
    """URLs a browser can open for a server at ``base`` (``http://host:port``): itself, but
    for a wildcard address (``--host 0.0.0.0`` or ``::``), which no browser can open, this
    machine's loopback address and then its host name, for other machines."""
    head, _, port = base.rpartition(":")
    host = head.removeprefix("http://")
    if host not in ("0.0.0.0", "[::]"):
        return [base]
    loopback = "127.0.0.1" if host == "0.0.0.0" else "[::1]"
    return [f"http://{loopback}:{port}", f"http://{socket.gethostname()}:{port}"]


def configure_logging(level: str, fmt: str = "text") -> None:
    """Log to stderr at ``level``, as text or JSON lines (``--log-format``)."""
    from delayq.logs import JsonFormatter, TaskFilter

    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())  # it reads the running task itself
    else:
        # A line logged while a handler runs, by any logger, names its task:
        # "... [12] [order.close 8f2c #1] message".
        handler.addFilter(TaskFilter())
        handler.setFormatter(
            logging.Formatter(
                "%(asctime)s %(levelname)s %(name)s [%(process)d]%(delayq_task)s %(message)s"
            )
        )
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])
