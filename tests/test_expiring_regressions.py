"""Expiring keys, end to end on a real server: regressions of issue 15's findings 2, 3, 4 and
11 and of the two leaks. Each test fails on f090b0c; docs/expiring.md's lifecycle table
(tests/test_expiring_lifecycle.py) states the rule each one checks."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from delayq import Queue, Retry, Worker
from delayq.expiring.facade import Expired
from delayq.expiring.ops import notice_op
from delayq.runner import SyncRunner

from .support.helpers import wait_for


class Calls:
    """Callback runs as (key, value); a value listed in ``retry_once`` asks for one retry."""

    def __init__(self, retry_once: tuple[Any, ...] = (), after: float = 1.0) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[str, Any]] = []
        self.retry_once = list(retry_once)
        self.after = after
        self.failed: list[Any] = []

    def __call__(self, expired: Expired) -> None:
        with self.lock:
            if expired.value in self.retry_once:
                self.retry_once.remove(expired.value)
                self.failed.append(expired.value)
                raise Retry(after=self.after)
            self.items.append((expired.key, expired.value))

    def got(self) -> Counter[tuple[str, Any]]:
        with self.lock:
            return Counter(self.items)


def watcher(queue: Queue, calls: Calls, **kw: Any) -> Worker:
    worker = Worker(queue, **kw)
    worker.on_expire("session:*")(calls)
    return worker


def test_set_after_an_undelivered_expiry_still_delivers_the_first_value(
    queue: Queue, run_worker: Any
) -> None:
    calls = Calls()
    queue.expiring.set("session:1", "first", ttl=0.1)
    time.sleep(0.3)  # it expired, and no worker ran to deliver it
    queue.expiring.set("session:1", "second", ttl=0.2)
    with run_worker(watcher(queue, calls)):
        wait_for(lambda: len(calls.got()) == 2, timeout=5)
        time.sleep(0.3)
    assert calls.got() == Counter({("session:1", "first"): 1, ("session:1", "second"): 1})


def test_set_while_a_callback_waits_to_retry_keeps_the_retry(queue: Queue, run_worker: Any) -> None:
    calls = Calls(retry_once=("first",), after=1.0)
    with run_worker(watcher(queue, calls)):
        queue.expiring.set("session:2", "first", ttl=0.1)
        wait_for(lambda: calls.failed == ["first"], timeout=5)
        queue.expiring.set("session:2", "second", ttl=0.1)
        wait_for(lambda: len(calls.got()) == 2, timeout=5)
        time.sleep(0.3)
    assert calls.got() == Counter({("session:2", "first"): 1, ("session:2", "second"): 1})


def test_delete_while_a_callback_waits_to_retry_keeps_the_retry(
    queue: Queue, run_worker: Any
) -> None:
    calls = Calls(retry_once=("first",), after=1.0)
    with run_worker(watcher(queue, calls)):
        queue.expiring.set("session:3", "first", ttl=0.1)
        wait_for(lambda: calls.failed == ["first"], timeout=5)
        assert queue.expiring.delete("session:3") is False  # it expired: nothing to cancel
        wait_for(lambda: len(calls.got()) == 1, timeout=5)
    assert calls.got() == Counter({("session:3", "first"): 1})


def test_set_just_before_the_deadline_gives_one_callback_with_the_new_value(
    queue: Queue, run_worker: Any
) -> None:
    calls = Calls()
    # A long lookahead holds the key's task on the worker's local timer well before its
    # deadline, as the default 20 ms does just before it.
    with run_worker(watcher(queue, calls, lookahead=2.5)):
        queue.expiring.set("session:4", "old", ttl=2.0)
        time.sleep(0.5)  # claimed ahead by now
        queue.expiring.set("session:4", "new", ttl=0.2)
        wait_for(lambda: len(calls.got()) >= 1, timeout=5)
        time.sleep(2.0)  # past the old deadline
    assert calls.got() == Counter({("session:4", "new"): 1})


def test_delete_just_before_the_deadline_cancels_the_callback(
    queue: Queue, run_worker: Any
) -> None:
    calls = Calls()
    with run_worker(watcher(queue, calls, lookahead=2.5)):
        queue.expiring.set("session:5", "v", ttl=1.0)
        time.sleep(0.5)  # claimed ahead by now
        assert queue.expiring.delete("session:5") is True
        time.sleep(1.5)  # past the old deadline
    assert calls.got() == Counter()


def test_touch_after_expiry_moves_nothing(queue: Queue, run_worker: Any) -> None:
    calls = Calls()
    queue.expiring.set("session:6", "v", ttl=0.1)
    time.sleep(0.3)  # expired, not yet delivered
    assert queue.expiring.touch("session:6", ttl=3600) is False
    with run_worker(watcher(queue, calls)):
        wait_for(lambda: len(calls.got()) == 1, timeout=5)
    assert calls.got() == Counter({("session:6", "v"): 1})


def test_the_bell_does_not_cut_a_retry_backoff_short(queue: Queue, run_worker: Any) -> None:
    calls = Calls(retry_once=("v",), after=30)
    with run_worker(watcher(queue, calls)):
        queue.expiring.set("session:7", "v", ttl=0.1)
        wait_for(lambda: calls.failed == ["v"], timeout=5)
        # A bell about the key, as a worker hears it (another program's key, say, or a late one).
        SyncRunner(queue.client).run(notice_op(queue.core, "session:7", foreign=True))
        time.sleep(1.0)
    assert calls.got() == Counter()  # still waiting out its 30 s backoff


def test_a_bell_handled_after_the_gate_closed_is_no_second_foreign_callback(
    queue: Queue, run_worker: Any
) -> None:
    calls = Calls()
    with run_worker(watcher(queue, calls)):
        queue.expiring.set("session:8", "v", ttl=0.1)
        wait_for(lambda: len(calls.got()) == 1, timeout=5)
        time.sleep(5.5)  # longer than the foreign gate's 5 s
        # The expired event of session:8, handled late (a slow or backed-up worker).
        SyncRunner(queue.client).run(notice_op(queue.core, "session:8", foreign=True))
        time.sleep(1.0)
    assert calls.got() == Counter({("session:8", "v"): 1})
