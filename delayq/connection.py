"""Where Redis is, and clients for it: the one place that reads the URL environment."""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio as aredis
import redis.asyncio.retry as aretry
from redis.asyncio.connection import SSLConnection as AsyncSSLConnection
from redis.backoff import ExponentialWithJitterBackoff
from redis.connection import SSLConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from delayq import topology
from delayq.errors import ConfigurationError

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    import hiredis

    _hiredis_pack = hiredis.pack_command
except ImportError:  # hiredis is a dependency, but a client without it still works
    _hiredis_pack = None

DEFAULT_URL = "redis://127.0.0.1:6379/0"
URL_ENV = ("DELAYQ_REDIS_URL", "REDIS_URL")
_SCHEMES = ("redis", "rediss", "unix", *topology.SCHEMES)

# Sockets never wait forever: a dead server surfaces as an error, never as a wedged worker.
CLIENT_DEFAULTS: dict[str, Any] = {
    "socket_connect_timeout": 5.0,
    "socket_timeout": 30.0,
    "socket_keepalive": True,
    "decode_responses": False,
}

# The rediss:// query parameters that name files (redis-py passes them to the ssl module).
TLS_FILE_PARAMS = ("ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile")
# How every TLS advice in a ConnectionFailed message begins (the CLI looks for it).
TLS_FIX = "check the TLS settings in the URL"


def resolve_url(url: str | None) -> str:
    """The argument, else ``DELAYQ_REDIS_URL``, else ``REDIS_URL``, else the default."""
    if url is None:
        url = next((os.environ[v] for v in URL_ENV if os.environ.get(v)), DEFAULT_URL)
    elif not isinstance(url, str):
        raise ConfigurationError(
            f"url must be a Redis URL such as 'redis://127.0.0.1:6379/0', got {url!r:.200}"
        )
    scheme = urlsplit(url).scheme
    if scheme not in _SCHEMES:
        raise ConfigurationError(
            f"unsupported Redis URL scheme {scheme!r} in {redact(url)}: "
            f"use one of {', '.join(s + '://' for s in _SCHEMES)}"
        )
    if topology.is_topology_url(url):
        topology.parse(url)  # refuse a malformed cluster or sentinel URL now, not later
    return url


def redact(url: str) -> str:
    """The URL with its password hidden, for messages and logs (a password holding ``#`` or
    ``?`` unencoded included, which URL parsing would not see as one)."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, hosts = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{hosts}"


# A queue's own calls (schedule, cancel, get ...) are idempotent (ids are made client-side),
# so a dropped connection is retried a bounded number of times (about 0.1 + 0.2 + 0.4 s of
# backoff) before ConnectionFailed. Workers keep their own loop and do not use this.
RETRIES = 3


def _backoff() -> ExponentialWithJitterBackoff:
    return ExponentialWithJitterBackoff(base=0.1, cap=1.0)


def sync_client(url: str, *, retries: int = 0, **overrides: Any) -> redis.Redis:
    """A client for ``url``: a plain one, or a cluster or sentinel-managed one (topology.py)."""
    retry = {"retry": Retry(_backoff(), retries)} if retries else {}
    if topology.is_topology_url(url):
        client: redis.Redis = topology.sync_client(
            topology.parse(url), {**CLIENT_DEFAULTS, **retry}, **overrides
        )
        return client
    return redis.Redis.from_url(url, **{**CLIENT_DEFAULTS, **retry, **overrides})


def async_client(url: str, *, retries: int = 0, **overrides: Any) -> aredis.Redis:
    retry = {"retry": aretry.Retry(_backoff(), retries)} if retries else {}
    if topology.is_topology_url(url):
        client: aredis.Redis = topology.async_client(
            topology.parse(url), {**CLIENT_DEFAULTS, **retry}, **overrides
        )
        return client
    client = aredis.Redis.from_url(url, **{**CLIENT_DEFAULTS, **retry, **overrides})
    pool = client.connection_pool
    pool.connection_class = hiredis_packing(pool.connection_class)
    return client


def hiredis_packing(cls: type[Any]) -> type[Any]:
    """The connection class, packing commands with hiredis (C) when it can. redis-py's
    asyncio connections pack in Python (its sync ones use hiredis already), at about three
    times the cost per task of an ack, for the same bytes (docs/benchmarks.md, "Figures behind
    the worker's constants")."""
    if _hiredis_pack is None or getattr(cls, "_delayq_hiredis", False):
        return cls
    return type(cls.__name__, (cls,), {"pack_command": _pack_command, "_delayq_hiredis": True})


def pack_command(args: tuple[Any, ...]) -> list[bytes] | None:
    """A command packed by hiredis, as ``send_packed_command`` takes it; None without
    hiredis, or for an argument hiredis does not take (then the connection's own packer)."""
    if _hiredis_pack is None:
        return None
    try:
        return [_hiredis_pack(args)]
    except TypeError:
        return None


def _pack_command(self: Any, *args: Any) -> list[bytes]:
    # As redis-py's own HiredisRespSerializer: a command name may carry words ("SCRIPT LOAD").
    assert _hiredis_pack is not None
    if isinstance(args[0], str):
        args = (*args[0].encode().split(), *args[1:])
    elif b" " in args[0]:
        args = (*args[0].split(), *args[1:])
    try:
        return [_hiredis_pack(args)]
    except TypeError:
        pass
    # hiredis takes bytes, str, int and float: a bytearray (or memoryview) is copied, only
    # when one is there (looking at every argument first was a third of packing a batch).
    args = tuple(bytes(a) if isinstance(a, bytearray | memoryview) else a for a in args)
    try:
        return [_hiredis_pack(args)]
    except TypeError as e:
        raise DataError(str(e)) from None


def check_client(client: Any, kinds: tuple[type[Any], ...] = ()) -> None:
    """A client of one of ``kinds`` (when given), that does not decode replies: delayq reads
    bytes (payloads may be binary)."""
    if kinds and not isinstance(client, kinds):
        # (redis.client.Redis is redis.Redis, redis.asyncio.cluster.RedisCluster ...)
        names = " or ".join(f"{k.__module__.rpartition('.')[0]}.{k.__name__}" for k in kinds)
        raise ConfigurationError(
            f"client must be a {names} (made with decode_responses=False), got "
            f"{client!r:.200}; or pass url= instead"
        )
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", {}) if pool is not None else {}
    if kwargs.get("decode_responses"):
        raise ConfigurationError(
            "the Redis client has decode_responses=True; delayq needs raw bytes. "
            "Pass a client made with decode_responses=False, or pass url= instead"
        )


def _connection_kwargs(client: Any) -> dict[str, Any]:
    pool = getattr(client, "connection_pool", None)
    kw = getattr(pool, "connection_kwargs", {}) if pool is not None else {}
    return kw if isinstance(kw, dict) else {}


def is_tls(client: Any) -> bool:
    """Whether the client connects with TLS (a ``rediss://`` URL or ``ssl=True``)."""
    cls = getattr(getattr(client, "connection_pool", None), "connection_class", None)
    return isinstance(cls, type) and issubclass(cls, SSLConnection | AsyncSSLConnection)


def describe(client: Any) -> str:
    """Where a client points, for error messages (never the password)."""
    manager = getattr(client, "nodes_manager", None)
    if manager is not None:  # a RedisCluster
        nodes = ",".join(sorted(manager.startup_nodes)) or "?"
        return f"cluster {nodes}"
    service = getattr(getattr(client, "connection_pool", None), "service_name", None)
    if service is not None:  # a Sentinel-managed primary
        return f"sentinel service {service}"
    kw = _connection_kwargs(client)
    if "path" in kw:
        return f"unix://{kw['path']}"
    where = f"{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"
    return f"rediss://{where}" if is_tls(client) else where


def pool_exhausted(exc: BaseException) -> bool:
    """Whether ``exc`` is a connection pool that has lent every connection it may make
    (``max_connections``): redis-py's MaxConnectionsError, a plain ConnectionError of the same
    words before redis-py 6. Nothing was sent, and the server has nothing to do with it."""
    return isinstance(exc, RedisConnectionError) and str(exc) == "Too many connections"


def pool_fix(client: Any) -> str:
    """What to do when the client's pool ran out: the caller's own calls at one moment
    (threads, tasks) outnumber ``max_connections``."""
    limit = getattr(getattr(client, "connection_pool", None), "max_connections", None)
    return (
        f"every one of the {limit} connections the client may open to Redis at "
        f"{describe(client)} (max_connections={limit}) is in use by this process's other "
        "calls at this moment (threads or tasks sharing the queue, or the client's own "
        "users): allow more with ?max_connections=N in the URL, or make fewer calls at once"
    )


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and the ones it was raised from or while handling."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _readable(path: str, *, directory: bool) -> bool:
    return os.access(path, os.R_OK) and os.path.isdir(path) == directory


def tls_fix(exc: BaseException, client: Any) -> str | None:
    """What to change when a TLS connection failed, or None if TLS is not the likely cause.

    redis-py reports a missing CA file as a bare "No such file or directory" and a
    missing client certificate as an EOF or an alert: say which URL parameter to fix.
    """
    if not is_tls(client):
        return None
    kw = _connection_kwargs(client)
    chain = list(_chain(exc))
    if any(isinstance(e, FileNotFoundError | PermissionError | IsADirectoryError) for e in chain):
        bad = [
            f"{p}={kw[p]}"
            for p in TLS_FILE_PARAMS
            if kw.get(p) and not _readable(kw[p], directory=p == "ssl_ca_path")
        ]
        if bad:
            return f"{TLS_FIX}: cannot read {', '.join(bad)}"
    if any(isinstance(e, ssl.SSLCertVerificationError) for e in chain):
        return (
            f"{TLS_FIX}: the server's certificate was not accepted; pass the CA that signed it "
            "as ssl_ca_certs=/path/to/ca.pem, and connect by a host name or address the "
            "certificate lists"
        )
    if any(isinstance(e, ssl.SSLError) for e in chain):
        if kw.get("ssl_certfile"):
            return (
                f"{TLS_FIX}: the server ended the TLS session; it may refuse the client "
                f"certificate ssl_certfile={kw['ssl_certfile']}, which must be signed by a CA "
                "the server trusts (its tls-ca-cert-file)"
            )
        return (
            f"{TLS_FIX}: the server ended the TLS session; if it requires client certificates "
            "(tls-auth-clients yes, the server default), add "
            "ssl_certfile=/path/to/client.crt&ssl_keyfile=/path/to/client.key"
        )
    if isinstance(exc, RedisTimeoutError) and "connecting" in str(exc):
        return (
            f"{TLS_FIX}: no TLS handshake in time; check the server is running and that the "
            "port is its TLS port (tls-port): a plain port never answers a TLS client"
        )
    return None
