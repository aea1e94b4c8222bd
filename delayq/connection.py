"""Where Redis is, and clients for it: the one place that reads the URL environment."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio as aredis

from .errors import ConfigurationError

DEFAULT_URL = "redis://127.0.0.1:6379/0"
URL_ENV = ("DELAYQ_REDIS_URL", "REDIS_URL")
_SCHEMES = ("redis", "rediss", "unix")

# Sockets never wait forever: a dead server surfaces as an error, never as a wedged worker.
CLIENT_DEFAULTS: dict[str, Any] = {
    "socket_connect_timeout": 5.0,
    "socket_timeout": 30.0,
    "socket_keepalive": True,
    "decode_responses": False,
}


def resolve_url(url: str | None) -> str:
    """The argument, else ``DELAYQ_REDIS_URL``, else ``REDIS_URL``, else the default."""
    if url is None:
        url = next((os.environ[v] for v in URL_ENV if os.environ.get(v)), DEFAULT_URL)
    scheme = urlsplit(url).scheme
    if scheme not in _SCHEMES:
        raise ConfigurationError(
            f"unsupported Redis URL scheme {scheme!r} in {redact(url)}: "
            f"use one of {', '.join(s + '://' for s in _SCHEMES)}"
        )
    return url


def redact(url: str) -> str:
    """The URL with its password hidden, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def sync_client(url: str, **overrides: Any) -> redis.Redis:
    return redis.Redis.from_url(url, **{**CLIENT_DEFAULTS, **overrides})


def async_client(url: str, **overrides: Any) -> aredis.Redis:
    return aredis.Redis.from_url(url, **{**CLIENT_DEFAULTS, **overrides})


def check_client(client: Any) -> None:
    """delayq reads bytes (payloads may be binary): refuse clients that decode replies."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", {}) if pool is not None else {}
    if kwargs.get("decode_responses"):
        raise ConfigurationError(
            "the Redis client has decode_responses=True; delayq needs raw bytes. "
            "Pass a client made with decode_responses=False, or pass url= instead"
        )


def describe(client: Any) -> str:
    """Where a client points, for error messages (never the password)."""
    pool = getattr(client, "connection_pool", None)
    kw = getattr(pool, "connection_kwargs", {}) if pool is not None else {}
    if "path" in kw:
        return f"unix://{kw['path']}"
    return f"{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"
