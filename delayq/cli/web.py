"""What ``delayq api`` and ``delayq dashboard`` share: their token, checked before they
start, and the bounds on what clients can hold (``delayq.web.serve.Limits``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import click

from delayq.errors import ConfigurationError
from delayq.web.serve import Limits
from delayq.web.tokens import clean_token

F = TypeVar("F", bound=Callable[..., Any])

_DEFAULT = Limits()
_SECONDS = click.FloatRange(0, 3600, min_open=True)


def limits_options(f: F) -> F:
    """--max-connections, --keep-alive, --header-timeout, --body-timeout, handed to the
    command as one ``limits`` (a Limits)."""

    @functools.wraps(f)
    def command(
        *args: Any,
        max_connections: int,
        keep_alive: int,
        header_timeout: float,
        body_timeout: float,
        **kwargs: Any,
    ) -> Any:
        limits = Limits(max_connections, keep_alive, header_timeout, body_timeout)
        return f(*args, limits=limits, **kwargs)

    options = [
        click.option(
            "--max-connections",
            type=click.IntRange(1),
            default=_DEFAULT.max_connections,
            show_default=True,
            help="Connections and requests in progress at once; a request past them is "
            "answered 503.",
        ),
        click.option(
            "--keep-alive",
            type=click.IntRange(1),
            default=_DEFAULT.keep_alive,
            show_default=True,
            metavar="SECONDS",
            help="Close a kept-alive connection idle this long (behind a load balancer, set "
            "it above the balancer's idle timeout).",
        ),
        click.option(
            "--header-timeout",
            type=_SECONDS,
            default=_DEFAULT.header_timeout,
            show_default=True,
            metavar="SECONDS",
            help="A request's line and headers must arrive within this (408 and closed "
            "otherwise), however slowly they trickle in.",
        ),
        click.option(
            "--body-timeout",
            type=_SECONDS,
            default=_DEFAULT.body_timeout,
            show_default=True,
            metavar="SECONDS",
            help="A request's body must arrive within this of its headers (408 and closed "
            "otherwise).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return cast(F, command)


def checked_token(token: str, *, least: int, what: str, param_hint: str) -> str:
    """``token`` as the server will check it (spaces around it dropped), or a usage error
    naming the option and the fix."""
    try:
        return clean_token(token, least=least, what=what)
    except ConfigurationError as e:
        raise click.BadParameter(str(e), param_hint=param_hint) from None
