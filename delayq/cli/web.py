"""What ``delayq api`` and ``delayq dashboard`` share: their token, checked before they
start."""

from __future__ import annotations

import click

from delayq.errors import ConfigurationError
from delayq.web.tokens import clean_token


def checked_token(token: str, *, least: int, what: str, param_hint: str) -> str:
    """``token`` as the server will check it (spaces around it dropped), or a usage error
    naming the option and the fix."""
    try:
        return clean_token(token, least=least, what=what)
    except ConfigurationError as e:
        raise click.BadParameter(str(e), param_hint=param_hint) from None
