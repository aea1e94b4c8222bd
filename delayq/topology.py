"""Cluster and Sentinel URLs, and the redis-py clients they stand for.

    redis+cluster://[user:password@]host:port[,host:port...][/0][?option=value...]
    redis+sentinel://[user:password@]host:port[,host:port...]/<service>[/<db>][?...]

``rediss+cluster://`` and ``rediss+sentinel://`` connect with TLS; the query takes
``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs`` and
``ssl_check_hostname``. A cluster has only database 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

import redis.asyncio.cluster as acluster
import redis.asyncio.retry as aretry
import redis.asyncio.sentinel as asentinel
import redis.cluster as cluster
import redis.sentinel as sentinel
from redis.backoff import NoBackoff

from delayq.errors import ConfigurationError

SCHEMES = ("redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel")
_TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")
_BOOL_OPTIONS = ("ssl_check_hostname",)


@dataclass(frozen=True)
class Topology:
    kind: str  # "cluster" or "sentinel"
    nodes: list[tuple[str, int]]
    tls: bool
    username: str | None = None
    password: str | None = None
    service: str | None = None  # sentinel: the monitored primary's name
    db: int = 0
    options: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        nodes = ",".join(f"{h}:{p}" for h, p in self.nodes)
        scheme = ("rediss+" if self.tls else "redis+") + self.kind
        tail = f"/{self.service}/{self.db}" if self.kind == "sentinel" else ""
        return f"{scheme}://{nodes}{tail}"


def is_topology_url(url: str) -> bool:
    return url.split("://", 1)[0] in SCHEMES


def parse(url: str) -> Topology:
    """Parse a cluster or sentinel URL; errors name the part that is wrong and the form."""
    scheme, _, rest = url.partition("://")
    kind = scheme.split("+", 1)[1]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username, password = (unquote(user) or None), (unquote(pw) if colon else None)
    service, db = _path(kind, path)
    tls = scheme.startswith("rediss")
    return Topology(
        kind, _nodes(kind, hosts), tls, username, password, service, db, _options(kind, query)
    )


def _nodes(kind: str, hosts: str) -> list[tuple[str, int]]:
    nodes = []
    for item in filter(None, hosts.split(",")):
        host, colon, port = item.rpartition(":")
        if not colon or not port.isdigit() or not host:
            raise ConfigurationError(f"{kind} node {item!r} is not host:port; use {_FORMS[kind]}")
        nodes.append((host.strip("[]"), int(port)))
    if not nodes:
        raise ConfigurationError(f"no {kind} nodes in the URL; use {_FORMS[kind]}")
    return nodes


def _path(kind: str, path: str) -> tuple[str | None, int]:
    parts = [p for p in path.split("/") if p]
    service, db = None, 0
    if kind == "sentinel":
        if not parts:
            raise ConfigurationError(f"the sentinel URL names no service; use {_FORMS[kind]}")
        service, parts = parts[0], parts[1:]
    if parts:
        if len(parts) > 1 or not parts[0].isdigit():
            raise ConfigurationError(
                f"{'/'.join(parts)!r} is not a database number; use {_FORMS[kind]}"
            )
        db = int(parts[0])
    if kind == "cluster" and db != 0:
        raise ConfigurationError("a Redis Cluster has only database 0; drop the /db part")
    return service, db


def _options(kind: str, query: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for key, value in parse_qsl(query):
        if key in _TLS_OPTIONS:
            options[key] = value
        elif key in _BOOL_OPTIONS:
            options[key] = value.lower() in ("1", "true", "yes")
        else:
            known = ", ".join(_TLS_OPTIONS + _BOOL_OPTIONS)
            raise ConfigurationError(f"unknown option {key!r} in the {kind} URL; known: {known}")
    return options


_FORMS = {
    "cluster": "redis+cluster://host:port[,host:port...]",
    "sentinel": "redis+sentinel://host:port[,host:port...]/<service>[/<db>]",
}


def _common(t: Topology, defaults: dict[str, Any]) -> dict[str, Any]:
    kw = {**defaults, "username": t.username, "password": t.password}
    if t.tls:
        kw.update(ssl=True, **t.options)
    return kw


def sync_client(t: Topology, defaults: dict[str, Any], **overrides: Any) -> Any:
    kw = {**_common(t, defaults), **overrides}
    if t.kind == "cluster":
        nodes = [cluster.ClusterNode(h, p) for h, p in t.nodes]  # type: ignore[no-untyped-call]
        return cluster.RedisCluster(startup_nodes=nodes, **kw)
    sentinels = sentinel.Sentinel(  # type: ignore[no-untyped-call]
        t.nodes, sentinel_kwargs=_sentinel_kwargs(t, defaults)
    )
    assert t.service is not None
    return sentinels.master_for(t.service, db=t.db, **kw)  # type: ignore[no-untyped-call]


def async_client(t: Topology, defaults: dict[str, Any], **overrides: Any) -> Any:
    kw = {**_common(t, defaults), **overrides}
    if t.kind == "cluster":
        nodes = [acluster.ClusterNode(h, p) for h, p in t.nodes]
        # Without a retry policy of our own (a worker's client), no call is resent by the
        # cluster client: a claim that ran but timed out would lease tasks to nobody. The
        # worker's loops retry themselves, and the client refreshes its slot map after an
        # error on the next call.
        kw.setdefault("retry", aretry.Retry(NoBackoff(), 0))
        return acluster.RedisCluster(startup_nodes=nodes, **kw)
    sentinels = asentinel.Sentinel(  # type: ignore[no-untyped-call]
        t.nodes, sentinel_kwargs=_sentinel_kwargs(t, defaults)
    )
    assert t.service is not None
    return sentinels.master_for(t.service, db=t.db, **kw)


def _sentinel_kwargs(t: Topology, defaults: dict[str, Any]) -> dict[str, Any]:
    # Sentinels themselves: same TLS as the data nodes; their own password is not in the URL.
    kw: dict[str, Any] = {
        k: defaults[k] for k in ("socket_connect_timeout", "socket_timeout") if k in defaults
    }
    if t.tls:
        kw.update(ssl=True, **t.options)
    return kw
