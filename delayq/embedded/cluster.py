"""A real Redis Cluster on loopback: primaries and replicas of embedded servers.

Every node is an :class:`~delayq.embedded.EmbeddedServer` (own port, own temporary data
directory, stopped by PID). The cluster is joined with plain commands (CLUSTER MEET,
ADDSLOTSRANGE, REPLICATE) rather than ``redis-cli --cluster create``, so a machine without
redis-cli can run it. delayq's tests and benchmarks use it for cluster work, failovers
included (``kill_primary``, ``wait_failover``, ``restart``, ``migrate_slot``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from delayq.embedded.server import EmbeddedServer, find_binary, free_port

HOST = "127.0.0.1"
SLOTS = 16384


# --- small helpers ---------------------------------------------------------------------------


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports."""
    ports: list[int] = []
    while len(ports) < n:
        p = free_port(HOST)
        if p not in ports:
            ports.append(p)
    return ports


def poll(check: Callable[[], str | None], timeout: float, what: str) -> None:
    """Call ``check`` until it returns None (ready); otherwise it returns why not.

    Connection errors count as "not yet". On timeout, raise TimeoutError with the last reason.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            reason = check()
        except (redis.RedisError, OSError) as e:
            reason = f"{type(e).__name__}: {e}"
        if reason is None:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s: {reason}")
        time.sleep(0.05)


def parse_info(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and not key.startswith("#"):
            out[key.strip()] = value.strip()
    return out


# A replica's full sync otherwise waits repl-diskless-sync-delay (5 s) for other replicas.
FAST_SYNC = ["--repl-diskless-sync-delay", "0"]

_SLOT_TAGS: dict[int, str] = {}


def key_for_slot(slot: int, prefix: str = "k") -> str:
    """A key that hashes to ``slot``: ``prefix:{tag}`` with a hash tag found once per slot.

    Further keys in the same slot: ``f"{key_for_slot(s)}:{i}"`` (the hash tag decides).
    """
    if not _SLOT_TAGS:
        i = 0
        while len(_SLOT_TAGS) < SLOTS:
            _SLOT_TAGS.setdefault(key_slot(str(i).encode()), str(i))
            i += 1
    return f"{prefix}:{{{_SLOT_TAGS[slot]}}}"


# --- cluster ---------------------------------------------------------------------------------


class Node(EmbeddedServer):
    """One cluster-enabled server. ``node_id`` is read after it first starts; it persists in
    ``nodes-<port>.conf``, so a restarted node rejoins as itself."""

    def __init__(
        self,
        binary: str,
        *,
        port: int,
        bus_port: int,
        node_timeout_ms: int,
        extra: list[str] | None = None,
    ) -> None:
        super().__init__(binary, port=port, appendonly=True)
        self.bus_port = bus_port
        self.node_id = ""
        self.config_file = self.data_dir / f"nodes-{port}.conf"
        self.extra = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            str(self.config_file),
            # An explicit bus port: the default port+10000 is past 65535 for half of Linux's
            # ephemeral range, and may be taken.
            "--cluster-port",
            str(bus_port),
            "--cluster-node-timeout",
            str(node_timeout_ms),
            # A replica may fail over however long it was disconnected (tests kill things).
            "--cluster-replica-validity-factor",
            "0",
            *FAST_SYNC,
            *(extra or []),
        ]

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def client(self, **kwargs: Any) -> redis.Redis:
        """A plain (non-cluster) client to this node; close it (``with node.client() as r``)."""
        kwargs.setdefault("socket_timeout", 5)
        return redis.Redis(self.host, self.port, decode_responses=True, **kwargs)

    def __repr__(self) -> str:
        state = "up" if self.alive else "down"
        return f"<Node {self.addr} {self.node_id[:8]} {state}>"


@dataclass
class NodeEntry:
    """One line of CLUSTER NODES."""

    node_id: str
    addr: str
    flags: set[str]
    master_id: str  # "-" for a primary
    link: str
    slots: list[tuple[int, int]] = field(default_factory=list)

    @property
    def is_primary(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "handshake", "noaddr"})


def cluster_nodes(node: Node) -> dict[str, NodeEntry]:
    """``node``'s view of the cluster, by node id."""
    with node.client() as r:
        text = r.execute_command("CLUSTER", "NODES")  # two words: no redis-py parsing
    view = {}
    for line in str(text).splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        slots = []
        for tok in parts[8:]:
            if tok.startswith("["):  # [slot->-id] / [slot-<-id]: migration in progress
                continue
            lo, _, hi = tok.partition("-")
            slots.append((int(lo), int(hi or lo)))
        view[parts[0]] = NodeEntry(
            node_id=parts[0],
            addr=parts[1].split("@")[0],
            flags=set(parts[2].split(",")),
            master_id=parts[3],
            link=parts[7],
            slots=slots,
        )
    return view


def cluster_info(node: Node) -> dict[str, str]:
    with node.client() as r:
        return parse_info(str(r.execute_command("CLUSTER", "INFO")))


class Cluster:
    """``primaries`` primaries and ``replicas`` replicas (spread round-robin over the
    primaries) on free loopback ports, slots split evenly, AOF on.

    Use as a context manager, or ``start()`` / ``stop()``. ``primaries=1, replicas=0`` gives
    a one-node cluster (for comparing against a plain server).
    """

    def __init__(
        self,
        binary: str | None = None,
        *,
        primaries: int = 3,
        replicas: int = 3,
        node_timeout_ms: int = 1500,
        extra: list[str] | None = None,
    ) -> None:
        if primaries < 1 or replicas < 0:
            raise ValueError("need at least one primary")
        self.binary = binary or find_binary()
        self.n_primaries = primaries
        self.n_replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.extra = list(extra or [])
        self.nodes: list[Node] = []
        self._killed: Node | None = None  # the primary kill_primary() took down
        self._killed_slot: int | None = None

    # -- lifecycle --

    def start(self, timeout: float = 30.0) -> Cluster:
        total = self.n_primaries + self.n_replicas
        ports = free_ports(2 * total)
        self.nodes = [
            Node(
                self.binary,
                port=ports[2 * i],
                bus_port=ports[2 * i + 1],
                node_timeout_ms=self.node_timeout_ms,
                extra=self.extra,
            )
            for i in range(total)
        ]
        try:
            self._create(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self, timeout: float) -> None:
        for n in self.nodes:
            n.start()
            with n.client() as r:
                n.node_id = str(r.execute_command("CLUSTER", "MYID"))
        prims = self.nodes[: self.n_primaries]
        for i, n in enumerate(prims):
            lo, hi = i * SLOTS // len(prims), (i + 1) * SLOTS // len(prims) - 1
            with n.client() as r:
                r.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
                # Distinct epochs up front (as redis-cli does), not via collision resolution.
                r.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        # Every node meets every other: quicker than waiting for gossip to spread one MEET.
        for i, a in enumerate(self.nodes):
            with a.client() as r:
                for b in self.nodes[i + 1 :]:
                    r.execute_command("CLUSTER", "MEET", b.host, b.port, b.bus_port)
        ids = {n.node_id for n in self.nodes}

        def everyone_known() -> str | None:
            for n in self.nodes:
                view = cluster_nodes(n)
                if missing := ids - {e.node_id for e in view.values() if not e.failed}:
                    return f"{n} does not know {len(missing)} node(s) yet"
            return None

        poll(everyone_known, timeout, "cluster handshake")
        for i, n in enumerate(self.nodes[self.n_primaries :]):
            primary = prims[i % len(prims)]
            with n.client() as r:
                r.execute_command("CLUSTER", "REPLICATE", primary.node_id)
        self.wait_ready(timeout)

    def stop(self) -> None:
        """Stop every node by PID and remove their directories."""
        for n in self.nodes:
            if n.alive and n.process:
                n.process.terminate()  # all at once; stop() below waits for each
        for n in self.nodes:
            n.stop()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses and clients --

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(n.host, n.port) for n in self.nodes]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:p1,127.0.0.1:p2,...`` over every node."""
        return "redis+cluster://" + ",".join(f"{h}:{p}" for h, p in self.startup_nodes)

    def client(self, **kwargs: Any) -> RedisCluster:
        """A redis-py cluster client over every node (decoded); close it after use."""
        kwargs.setdefault("socket_timeout", 5)
        return RedisCluster(
            startup_nodes=[
                ClusterNode(h, p)  # type: ignore[no-untyped-call]
                for h, p in self.startup_nodes
            ],
            decode_responses=True,
            **kwargs,
        )

    # -- topology --

    def _node(self, node_id: str) -> Node:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(node_id)

    def _view(self) -> dict[str, NodeEntry]:
        for n in self.nodes:
            if n.alive:
                with contextlib.suppress(redis.RedisError):
                    return cluster_nodes(n)
        raise RuntimeError("no cluster node answers")

    def primaries(self) -> list[Node]:
        """Live primaries that own slots, ordered by their first slot (so index 0 owns slot 0
        until it fails over). The view is one live node's."""
        entries = [
            e for e in self._view().values() if e.is_primary and e.slots and "fail" not in e.flags
        ]
        entries.sort(key=lambda e: min(e.slots))
        return [self._node(e.node_id) for e in entries]

    def replicas(self) -> list[Node]:
        """Live replicas, in node order."""
        view = self._view()
        return [
            n
            for n in self.nodes
            if n.alive and n.node_id in view and not view[n.node_id].is_primary
        ]

    def owner(self, slot: int) -> Node:
        """The primary serving ``slot`` (in one live node's view)."""
        for e in self._view().values():
            if e.is_primary and any(lo <= slot <= hi for lo, hi in e.slots):
                return self._node(e.node_id)
        raise LookupError(f"no node owns slot {slot}")

    def _check_ready(self) -> str | None:
        alive = [n for n in self.nodes if n.alive]
        alive_ids = {n.node_id for n in alive}
        reference: list[tuple[int, int, str]] | None = None
        for n in alive:
            info = cluster_info(n)
            if info.get("cluster_state") != "ok":
                return f"{n}: cluster_state {info.get('cluster_state')}"
            view = cluster_nodes(n)
            for nid in alive_ids:
                e = view.get(nid)
                if e is None or e.failed:
                    return f"{n} sees {nid[:8]} as {e.flags if e else 'unknown'}"
            owners = sorted((lo, hi, e.node_id) for e in view.values() for lo, hi in e.slots)
            if reference is None:
                reference = owners
            elif owners != reference:
                return f"{n} disagrees about slot owners"
            me = next(e for e in view.values() if "myself" in e.flags)
            if me.is_primary:
                if not me.slots and len(alive) > 1:
                    return f"{n} is a primary without slots (replica not attached yet)"
            else:
                with n.client() as r:
                    repl = r.info("replication")
                if repl.get("master_link_status") != "up":
                    return f"{n}: replica link {repl.get('master_link_status')}"
        for _, _, owner in reference or []:
            if owner not in alive_ids:
                return f"slots still owned by dead node {owner[:8]}"
        return None

    def _round_trip(self) -> str | None:
        with self.client() as rc:
            for p in self.primaries():
                e = cluster_nodes(p)[p.node_id]
                key = key_for_slot(e.slots[0][0], "delayq-topology-ready")
                rc.set(key, "1", ex=60)
                if rc.get(key) != "1":
                    return f"round trip through {p} failed"
        return None

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every live node says cluster_state:ok, all agree on who owns which slots,
        every live replica's link is up, and a RedisCluster client can set and get a key in
        each primary's slots."""
        poll(self._check_ready, timeout, "cluster ready")
        poll(self._round_trip, timeout, "cluster round trip")

    # -- faults --

    def kill_primary(self, i: int = 0) -> Node:
        """SIGKILL ``primaries()[i]``; :meth:`wait_failover` then waits for its replica."""
        node = self.primaries()[i]
        self._killed_slot = cluster_nodes(node)[node.node_id].slots[0][0]
        self._killed = node
        node.kill()
        return node

    def wait_failover(self, timeout: float = 30.0) -> Node:
        """Until a replica of the killed primary has taken its slots (in every live node's
        view) and the cluster is ready again; returns the new primary."""
        if self._killed is None or self._killed_slot is None:
            raise RuntimeError("kill_primary() first")
        dead, slot = self._killed, self._killed_slot

        def promoted() -> str | None:
            for n in self.nodes:
                if not n.alive:
                    continue
                owners = [
                    e
                    for e in cluster_nodes(n).values()
                    if e.is_primary and any(lo <= slot <= hi for lo, hi in e.slots)
                ]
                if not owners or owners[0].node_id == dead.node_id:
                    return f"{n} still routes slot {slot} to the dead primary"
            return None

        poll(promoted, timeout, "failover")
        self.wait_ready(timeout)
        self._killed = None
        return self.owner(slot)

    def restart(self, node: Node, timeout: float = 30.0) -> Node:
        """Start a killed node again (same port, data and nodes.conf) and wait until it has
        rejoined: a failed-over primary comes back as a replica of its successor."""
        node.restart()
        self.wait_ready(timeout)
        return node

    # -- resharding --

    def migrate_slot(
        self,
        slot: int,
        to_primary: int | Node,
        *,
        batch: int = 100,
        pause: float = 0.0,
        timeout: float = 30.0,
    ) -> int:
        """Move ``slot`` and its keys to another primary, as redis-cli's reshard does:
        SETSLOT IMPORTING on the target, MIGRATING on the source, MIGRATE the keys ``batch``
        at a time (sleeping ``pause`` between batches, so clients meet ASK redirects), then
        SETSLOT NODE on target, source and every other primary. Returns the keys moved."""
        dst = self.primaries()[to_primary] if isinstance(to_primary, int) else to_primary
        src = self.owner(slot)
        if src is dst:
            return 0
        moved = 0
        with src.client() as s, dst.client() as d:
            d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src.node_id)
            s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst.node_id)
            while keys := s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
                s.execute_command("MIGRATE", dst.host, dst.port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
                if pause:
                    time.sleep(pause)
            # Target first: once the source lets go, the target must already own the slot.
            d.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst.node_id)
            s.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst.node_id)
        for p in self.primaries():
            if p not in (src, dst):
                with p.client() as r:
                    r.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst.node_id)

        def settled() -> str | None:
            for n in self.nodes:
                if n.alive:
                    view = cluster_nodes(n)
                    if not any(lo <= slot <= hi for lo, hi in view[dst.node_id].slots):
                        return f"{n} does not yet route slot {slot} to {dst}"
            return None

        poll(settled, timeout, f"slot {slot} migration")
        return moved
