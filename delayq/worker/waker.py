"""Wake-ups without polling: a pub/sub subscription to the queue's wake channel.

Producers publish a due time whenever they add a task earlier than the head of the
schedule. An idle worker sleeps until the head it knows of falls due, a message brings an
earlier one, or the worker's ``max_wait`` (15 s) passes — listening costs Redis no
commands. A subscription that drops is noticed: the worker looks at the queue as soon as it
is back, so nothing published meanwhile waits; only a message lost while the link stays up
waits for the next look, at most ``max_wait``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger("delayq.worker")

# abort.lua's message on the wake channel: "abort <token> <id>". It starts with a word, so a
# worker that does not know it reads no due time in it and ignores it.
ABORT_PREFIX = b"abort "


class Waker:
    def __init__(self, client: Any, channel: str, shard_channels: tuple[str, ...] = ()) -> None:
        self.client = client
        self.channel = channel
        # Several sources (the shards of a sharded queue, the queues of a worker of several,
        # each of their shards): one wake channel each, in the claim loop's order; the claim
        # loop visits the sources announced since its last claim (``woken``).
        self.wake_channels = {c.encode(): i for i, c in enumerate(shard_channels or (channel,))}
        self.woken: set[int] = set()
        # Other channels heard on the same connection (the expiry bell), and what to run
        # after every (re)subscription.
        self.extra: dict[str, Callable[[Any], None]] = {}
        self.on_subscribed: list[Callable[[], None]] = []
        self.subscribed = asyncio.Event()  # set once the first subscription is live
        self.event = asyncio.Event()
        self.poked = False  # look at the queue now: capacity freed, shutdown, reconnect
        self.hint_ms: int | None = None  # earliest due time announced since the last claim
        # Told (task id, lease token) of each running task aborted (queue.abort).
        self.on_abort: Callable[[str, int], object] | None = None
        self.heard_from = 0  # the source (index in the wake channels) of the last message
        self._renew = False  # subscribe again on a new connection (see renew)

    def poke(self) -> None:
        self.poked = True
        self.event.set()

    def renew(self) -> None:
        """A look found a due task that no message announced: the subscription may be dead
        without its connection knowing (say, a NAT or firewall that forgot the idle link), and
        every later wake-up lost with it. Subscribe again on a new connection (within the 5 s
        of the current wait for a message), and look at the queue once subscribed, so a dead
        subscription costs one task's delay (at most max_wait), not every task's."""
        self._renew = True

    def reset(self) -> tuple[bool, set[int]]:
        """Called just before a claim: what was announced so far, the claim will see.
        Returns whether it was poked and which shards were announced."""
        poked, woken = self.poked, self.woken
        self.poked = False
        self.hint_ms = None
        self.woken = set()
        return poked, woken

    async def run(self) -> None:
        delay = 0.1
        while True:
            pubsub = self.client.pubsub()
            try:
                await pubsub.subscribe(*(c.decode() for c in self.wake_channels), *self.extra)
                self._renew = False  # a fresh subscription: nothing to renew
                self.poke()  # anything published while we were away: look now
                self.subscribed.set()
                for hook in self.on_subscribed:
                    hook()
                delay = 0.1
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
                    if msg is not None and msg.get("type") == "message":
                        self._heard(msg)  # (received: acted on even if renewing below)
                    if self._renew:
                        self._renew = False
                        break  # the finally below closes this connection; the loop subscribes
            except (RedisConnectionError, RedisTimeoutError, OSError) as e:
                log.warning("wake-up subscription lost (%s); reconnecting in %.1f s", e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            except ResponseError as e:
                # Refused (an ACL without the channel). Never die silently: drop the extra
                # channels if it is theirs, else keep trying while the capped sleeps cover.
                if self.extra:
                    log.warning(
                        "cannot subscribe to %s (%s): going on without it", ", ".join(self.extra), e
                    )
                    self.extra.clear()
                else:
                    log.error(
                        "cannot subscribe to the wake-up channel %s (%s): idle workers notice "
                        "new tasks only at their periodic check; grant the channel (&%s)",
                        self.channel,
                        e,
                        self.channel,
                    )
                    await asyncio.sleep(5.0)
            finally:
                await pubsub.aclose()

    def _heard(self, msg: dict[str, Any]) -> None:
        channel = msg["channel"]
        shard = self.wake_channels.get(channel)
        if shard is not None:
            self.woken.add(shard)
            self.heard_from = shard  # whose abort message, if it is one
            self._note(msg["data"])
        else:
            name = channel.decode() if isinstance(channel, bytes) else channel
            self.extra[name](msg["data"])

    def _note(self, data: Any) -> None:
        try:
            due = int(float(data))
        except (TypeError, ValueError, OverflowError):  # (another program's "inf", say)
            self._heard_abort(data)
            return
        if self.hint_ms is None or due < self.hint_ms:
            self.hint_ms = due
        self.event.set()

    def _heard_abort(self, data: Any) -> None:
        """An abort message (``abort <token> <id>``): the running attempt stops. Anything
        else that is not a due time is ignored."""
        if self.on_abort is None or not isinstance(data, bytes):
            return
        if not data.startswith(ABORT_PREFIX):
            return
        token, _, tid = data[len(ABORT_PREFIX) :].partition(b" ")
        try:
            task_id, lease = tid.decode(), int(token)
        except (UnicodeDecodeError, ValueError):
            log.warning("ignoring a malformed abort message %r", data[:300])
            return
        self.on_abort(task_id, lease)

    async def sleep_until(
        self,
        deadline: float,
        due_to_loop: Callable[[float], float] | None = None,
        lookahead: float = 0.0,
    ) -> None:
        """Sleep until ``deadline`` (loop time), a poke, or — when ``due_to_loop`` is given —
        the time (minus ``lookahead``) of a task announced as due earlier. A message about a
        later task only shortens the sleep; it costs no command.

        Flags are checked before the event is cleared, with no await in between, so a poke
        that arrived while the caller was busy (say, claiming) is never lost.
        """
        loop = asyncio.get_running_loop()
        while not self.poked:
            if self.hint_ms is not None and due_to_loop is not None:
                deadline = min(deadline, due_to_loop(self.hint_ms) - lookahead)
            timeout = deadline - loop.time()
            if timeout <= 0:
                return
            self.event.clear()
            try:
                await asyncio.wait_for(self.event.wait(), timeout)
            except TimeoutError:
                return
