"""The expiry bell on Redis Cluster: one subscription per primary, following the topology.

A cluster node publishes keyspace notifications to its own subscribers only (unlike
``PUBLISH``, which the cluster bus broadcasts), so ``__keyevent@0__:expired`` has to be heard
on every primary. :class:`ClusterBells` keeps one plain pub/sub connection per primary
(built from the cluster client's connection settings: credentials and TLS carry over),
applies ``notify-keyspace-events`` on each node as it subscribes, and re-reads the primaries
every few seconds (one ``CLUSTER SLOTS``; the client's slot map is re-read only when it
differs) and soon after any subscription fails: a failover promotes a replica (new address,
and CONFIG SET is not replicated), resharding can give slots to a new primary, a demoted
node is dropped.

redis-py's ``AsyncClusterKeyspaceNotifications`` subscribes on every primary too, but it
reads the nodes one after another in 0.1 s slices (a timer wake-up ten times a second, and
up to 0.1 s per other primary of extra latency), follows the topology only when a read fails
and then only from the client's cached node table, holds a connection of each node's
command pool, and leaves the server's configuration alone; so it is not used here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.utils import str_if_bytes

from delayq.cancel import cancel_and_wait

log = logging.getLogger("delayq.expiry")

REFRESH_S = 5.0  # look at the primaries this often when all is well
RETRY_MIN_S = 0.2  # after a failure: look again this soon, doubling up to RETRY_MAX_S
RETRY_MAX_S = 2.0
CONFIRM_S = 5.0  # SUBSCRIBE's confirmation
IDLE_PING_S = 15.0  # a silent subscription is PINGed; no reply within as long again: lost

NOTIFICATIONS = "notifications"
TIMER_SCAN = "timer+scan"


class ClusterBells:
    """Subscribes ``channel`` on every primary of ``client`` (a ``redis.asyncio``
    ``RedisCluster``) and hands each message's data to ``on_message``.

    ``configure(node_client)`` checks (and if allowed sets) the node's
    ``notify-keyspace-events`` and returns ``"notifications"`` or ``"timer+scan"``;
    ``on_mode(mode)`` hears the cluster-wide mode whenever it changes: ``"notifications"``
    once every primary is subscribed and configured, else ``"timer+scan"``.
    """

    def __init__(
        self,
        client: Any,
        channel: str,
        on_message: Callable[[Any], None],
        configure: Callable[[Any], Awaitable[str]],
        on_mode: Callable[[str], Awaitable[None]],
        *,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.channel = channel
        self.on_message = on_message
        self.configure = configure
        self.on_mode = on_mode
        self.on_refused = on_refused
        self.listeners: dict[str, asyncio.Task[None]] = {}  # node name -> its reader
        self.modes: dict[str, str] = {}  # node name -> that node's mode
        self.refused: set[str] = set()  # SUBSCRIBE refused (ACL): not retried while primary
        self.primaries: list[str] = []  # as last read
        self.mode: str | None = None
        self._down: set[str] = set()  # nodes whose loss was logged (once per outage)
        self._lost = asyncio.Event()
        self._teller: asyncio.Task[None] | None = None  # tells on_mode, in the background

    async def run(self) -> None:
        delay = RETRY_MIN_S  # grows while failures or lost subscriptions keep coming
        try:
            while True:
                self._lost.clear()
                if await self.reconcile():
                    try:
                        await asyncio.wait_for(self._lost.wait(), REFRESH_S)
                    except TimeoutError:
                        delay = RETRY_MIN_S  # a quiet period: the next failure retries soon
                        continue
                await asyncio.sleep(delay)  # never a tight loop, even on a flapping node
                delay = min(delay * 2, RETRY_MAX_S)
        finally:
            await self.close()

    async def close(self) -> None:
        tasks = list(self.listeners.values())
        self.listeners.clear()
        if self._teller is not None:
            tasks.append(self._teller)
        await cancel_and_wait(tasks)

    # -- the topology ------------------------------------------------------------------------

    async def reconcile(self) -> bool:
        """Re-read the primaries; subscribe the new ones, drop the ones no longer primary.
        True when every primary is subscribed (or refused us for good)."""
        try:
            current = await self._view_is_current()
        except (RedisError, RedisClusterException, OSError):
            current = False  # the node asked is down: re-read the map from any node
        try:
            if not current:
                # Re-reads the slot map; redis-py does the same on a MOVED. Only on a change:
                # it also recycles every connection of the client.
                await self.client.nodes_manager.initialize()
        except (RedisError, RedisClusterException, OSError) as e:
            log.info("could not read the cluster's primaries (%s); retrying", e)
            return False
        primaries = {node.name: node for node in self.client.get_primaries()}
        self.primaries = sorted(primaries)
        for name in list(self.listeners):
            if name not in primaries:  # demoted, or gone: its expiries are not its own now
                log.info("expiry bell: %s is no longer a primary; unsubscribing", name)
                task = self.listeners.pop(name)
                await cancel_and_wait([task])
        self.refused &= primaries.keys()
        for name in list(self.modes):
            if name not in primaries:
                del self.modes[name]
        todo = [
            node
            for name, node in primaries.items()
            if name not in self.listeners and name not in self.refused
        ]
        ok = all(await asyncio.gather(*(self._open(node) for node in todo)))
        self._report()
        return ok

    async def _view_is_current(self) -> bool:
        """Whether the client's primaries are the ones a node names now (one CLUSTER SLOTS
        through the client's own connections)."""
        node = self.client.get_default_node()
        if node is None:
            return False
        slots = await self.client.execute_command("CLUSTER SLOTS", target_nodes=node)
        manager = self.client.nodes_manager
        named = set()
        for info in slots.values():
            host, port = info["primary"][:2]
            host = str_if_bytes(host) or node.host  # a one-node cluster may answer ""
            host, port = manager.remap_host_port(host, int(port))
            named.add(f"{host}:{port}")
        return named == {n.name for n in self.client.get_primaries()}

    def _report(self) -> None:
        names = self.primaries
        ready = bool(names) and all(self.modes.get(n) == NOTIFICATIONS for n in names)
        mode = NOTIFICATIONS if ready else TIMER_SCAN
        if mode != self.mode:
            self.mode = mode
            # Told in the background: recording the mode is a write to the queue's node,
            # which may be the one failing over; the subscriptions must not wait for it.
            if self._teller is None or self._teller.done():
                self._teller = asyncio.get_running_loop().create_task(self._tell())

    async def _tell(self) -> None:
        told = None
        while self.mode != told:  # the latest mode, however many changes came meanwhile
            told = self.mode
            assert told is not None
            try:
                await self.on_mode(told)
            except (RedisError, RedisClusterException, OSError) as e:
                log.debug("could not record the expiry mode %r: %s", told, e)

    # -- one primary ---------------------------------------------------------------------------

    @staticmethod
    def node_client(node: Any) -> aredis.Redis:
        """A plain client to one cluster node, with the cluster client's settings (user,
        password, TLS, timeouts): the node's own ``connection_kwargs``."""
        kwargs = dict(node.connection_kwargs)
        # The cluster client's own hooks (READONLY on connect, its maintenance-notification
        # handler) belong to its pools, not to a connection of ours.
        for own in ("redis_connect_func", "oss_cluster_maint_notifications_handler"):
            kwargs.pop(own, None)
        pool = aredis.ConnectionPool(
            connection_class=node.connection_class, max_connections=4, **kwargs
        )
        return aredis.Redis(connection_pool=pool)

    async def _open(self, node: Any) -> bool:
        name = node.name
        client = self.node_client(node)
        pubsub = client.pubsub()
        try:
            try:
                await self._subscribe(pubsub)
            except ResponseError as e:
                self._refuse(name, e)
                await _close(pubsub, client)
                return True
            self.modes[name] = await self.configure(client)
        except (RedisConnectionError, RedisTimeoutError, OSError) as e:
            if name not in self._down:
                self._down.add(name)
                log.warning("expiry bell: cannot subscribe on %s (%s); retrying", name, e)
            await _close(pubsub, client)
            return False
        except BaseException:
            await _close(pubsub, client)
            raise
        if name in self._down:
            self._down.discard(name)
            log.info("expiry bell: subscribed on %s again", name)
        else:
            log.debug("expiry bell: subscribed on %s", name)
        self.listeners[name] = asyncio.get_running_loop().create_task(
            self._listen(name, client, pubsub), name=f"delayq-bell-{name}"
        )
        return True

    async def _subscribe(self, pubsub: Any) -> None:
        """SUBSCRIBE and wait for the confirmation: a refusal (ACL) is only in the reply."""
        await pubsub.subscribe(self.channel)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONFIRM_S
        while (left := deadline - loop.time()) > 0:
            msg = await pubsub.get_message(timeout=left)
            if msg is not None and msg.get("type") == "subscribe":
                return
            if msg is not None and msg.get("type") == "message":
                self.on_message(msg["data"])
        raise RedisTimeoutError(f"SUBSCRIBE not confirmed within {CONFIRM_S:.0f} s")

    def _refuse(self, name: str, e: Exception) -> None:
        self.refused.add(name)
        self.modes[name] = TIMER_SCAN
        log.warning("expiry bell: %s refused SUBSCRIBE %s (%s)", name, self.channel, e)
        if self.on_refused is not None:
            self.on_refused(f"{name} refused SUBSCRIBE to the expired-event channel")

    async def _listen(self, name: str, client: aredis.Redis, pubsub: Any) -> None:
        pinged = False
        try:
            while True:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=IDLE_PING_S)
                if msg is None:
                    if pinged:  # a link that went silent: replace it
                        raise RedisTimeoutError(f"no reply to PING within {IDLE_PING_S:.0f} s")
                    await pubsub.ping()
                    pinged = True
                    continue
                pinged = False
                if msg.get("type") == "message":
                    self.on_message(msg["data"])
        except (RedisConnectionError, RedisTimeoutError, OSError) as e:
            self._down.add(name)
            log.warning("expiry bell on %s lost (%s); re-reading the primaries", name, e)
        except ResponseError as e:  # refused after all (an ACL changed): not retried
            self._refuse(name, e)
        finally:
            await _close(pubsub, client)
            if self.listeners.get(name) is asyncio.current_task():
                del self.listeners[name]
                self.modes.pop(name, None)
                self._lost.set()


async def _close(pubsub: Any, client: aredis.Redis) -> None:
    with contextlib.suppress(RedisError, OSError):
        await pubsub.aclose()
    with contextlib.suppress(RedisError, OSError):
        await client.aclose(close_connection_pool=True)
