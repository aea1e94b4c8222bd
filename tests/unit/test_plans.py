"""The plans of runner.py, queue.py and the cluster round trip, driven without a server: a
runner whose steps are answered from a script (what each step must be, what it replies or
raises), so every step a plan takes and what it makes of each reply is checked exactly."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MovedError, NoScriptError, ResponseError

import delayq.base
from delayq import Queue
from delayq.core import Op, QueueCore
from delayq.errors import ConnectionFailed, DurabilityError, ScriptError
from delayq.runner import (
    Call,
    Command,
    Durable,
    Load,
    Nodes,
    Refresh,
    Step,
    SyncRunner,
    Trip,
    after_plan,
    batch_plan,
    cluster_trip_plan,
)
from delayq.settings import ShardCheck
from delayq.timing import ms_to_datetime

# (what the step must equal, or a check of it; what it replies: a value, or an exception
# it raises as the Redis client would)
Expect = tuple[Step | Callable[[Step], bool], Any]

NOW = 1_764_000_000_000  # the now a schedule script replies (ms)


class ScriptedRunner(SyncRunner):
    """SyncRunner's own drive loop (and its Trip on a cluster: the cluster plan, driven by
    the same loop); every step it would send to Redis is answered from ``script``."""

    def __init__(self, client: Any, script: list[Expect]) -> None:
        super().__init__(client)
        self.script: Iterator[Expect] = iter(script)
        self.steps: list[Step] = []

    def execute(self, step: Step) -> Any:
        if isinstance(step, Trip) and hasattr(self.client, "nodes_manager"):
            return super().execute(step)  # cluster_trip_plan: its Nodes and Refresh come here
        self.steps.append(step)
        want, reply = next(self.script, (None, None))
        assert want is not None, f"unexpected step {step!r}"
        assert want(step) if callable(want) else step == want, f"{step!r} is not {want!r}"
        if isinstance(reply, Exception):
            raise reply
        return reply

    def done(self) -> None:
        assert next(self.script, None) is None, "steps the plan did not take"


def _client() -> redis.Redis:
    return redis.Redis(host="redis.invalid", port=6390)  # never connected


def _queue(monkeypatch: pytest.MonkeyPatch, script: list[Expect]) -> tuple[Queue, ScriptedRunner]:
    """A Queue whose plans run on a ScriptedRunner (its ``runner`` seam)."""
    queue = Queue("orders", client=_client())
    runner = ScriptedRunner(queue.client, script)
    monkeypatch.setattr(Queue, "runner", property(lambda self: runner))
    return queue, runner


def _count_check(store: bool = True) -> Expect:
    """The first call of a queue object: the shard count check (1 shard stored)."""
    return (Call(QueueCore("orders").shard_count(1, store=store)), ShardCheck(1, "1.0"))


def _same_call(op: Op[Any]) -> Callable[[Step], bool]:
    return lambda step: isinstance(step, Call) and step.op.args == op.args


def _trip_of(n: int, durable: Durable | None = None) -> Callable[[Step], bool]:
    def check(step: Step) -> bool:
        return isinstance(step, Trip) and len(step.ops) == n and step.durable == durable

    return check


# -- NOSCRIPT: load the scripts, redo only the calls that did not run --------------------------


def test_noscript_reloads_then_redoes_only_the_missed_calls() -> None:
    core = QueueCore("orders")
    a, b = core.shard_count(2, store=False), core.shard_count(3, store=False)
    runner = ScriptedRunner(
        _client(),
        [
            (Trip((a, b)), [NoScriptError("NOSCRIPT No matching script."), b"3"]),
            (Load((a, b)), None),
            (lambda s: isinstance(s, Trip) and list(s.ops) == [a] and s.durable is None, [b"2"]),
        ],
    )
    assert runner.drive(batch_plan((a, b))) == [ShardCheck(2, ""), ShardCheck(3, "")]
    runner.done()


def test_noscript_redo_keeps_each_connections_waits() -> None:
    core = QueueCore("orders")
    a = core.shard_count(2, store=False)
    durable = Durable(1000)
    runner = ScriptedRunner(
        _client(),
        [
            (Trip((a,), durable), [NoScriptError("NOSCRIPT"), [[[1, 0]]]]),
            (Load((a,)), None),
            (Trip([a], durable), [b"2", [[[0, 0]]]]),  # the redo's fsync is not confirmed
        ],
    )
    with pytest.raises(DurabilityError) as err:
        runner.drive(batch_plan((a,), durable))
    assert "the AOF fsync was not confirmed within 1000 ms" in str(err.value)
    runner.done()


# -- a plain command, then a call (run_after): one round trip, the command first ------------


def test_a_command_then_a_call_go_in_one_trip_and_a_noscript_sends_both_again() -> None:
    """The expiring keys' check reads the key, then asks the server: the read must come
    first, so a call that met NOSCRIPT is sent again after the command, not alone."""
    a = QueueCore("orders").shard_count(2, store=False)
    pttl = ("PTTL", "session:1")
    runner = ScriptedRunner(
        _client(),
        [
            (Trip([a], first=pttl), [-2, NoScriptError("NOSCRIPT No matching script.")]),
            (Load([a]), None),
            (Trip([a], first=pttl), [-2, b"2"]),
        ],
    )
    assert runner.drive(after_plan(pttl, a)) == (-2, ShardCheck(2, ""))
    runner.done()


def test_an_error_reply_of_the_command_or_the_call_is_a_delayq_error() -> None:
    a = QueueCore("orders").shard_count(2, store=False)
    for replies in ([ResponseError("WRONGTYPE"), b"2"], [-2, ResponseError("BUSY script")]):
        runner = ScriptedRunner(_client(), [(Trip([a], first=("PTTL", "k")), replies)])
        with pytest.raises(ScriptError):
            runner.drive(after_plan(("PTTL", "k"), a))
        runner.done()
    noscript = [-2, NoScriptError("NOSCRIPT")]
    runner = ScriptedRunner(
        _client(),
        [
            (Trip([a], first=("PTTL", "k")), noscript),
            (Load([a]), None),
            (Trip([a], first=("PTTL", "k")), noscript),
            (Load([a]), None),
        ],
    )
    with pytest.raises(ScriptError, match="forgot script 'shards' twice"):
        runner.drive(after_plan(("PTTL", "k"), a))
    runner.done()


# -- durable=True: WAITAOF says 0 fsyncs -----------------------------------------------------


def test_schedule_durable_with_no_fsync_is_a_durability_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue, runner = _queue(
        monkeypatch,
        [
            _count_check(),
            # the schedule call's reply ("created"), then one connection's waits: WAITAOF
            # 1 0 1000 replied [0 local fsyncs, 0 replicas]
            (_trip_of(1, Durable(1000)), [[1, NOW], [[[0, 0]]]]),
        ],
    )
    with pytest.raises(DurabilityError) as err:
        queue.schedule("email", {"to": "a@example.com"}, task_id="t-1", durable=True)
    assert str(err.value) == (
        "durable=True: the AOF fsync was not confirmed within 1000 ms; the task was written "
        "and is likely, but not certainly, to survive a crash"
    )
    runner.done()


def test_schedule_durable_with_the_fsync_confirmed(monkeypatch: pytest.MonkeyPatch) -> None:
    queue, runner = _queue(
        monkeypatch, [_count_check(), (_trip_of(1, Durable(1000)), [[1, NOW], [[[1, 0]]]])]
    )
    got = queue.schedule("email", None, task_id="t-1", durable=True)
    assert (str(got), got.status) == ("t-1", "created")
    assert got.due_at == ms_to_datetime(NOW)  # (due at once: the now the script replied)
    runner.done()


# -- schedule_many: one group's round trip fails ---------------------------------------------


def test_schedule_many_partly_refused_says_what_was_and_may_be_scheduled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(delayq.base, "SCHEDULE_BATCH", 2)  # 2 tasks per script call
    ids = [f"t-{i}" for i in range(20)]  # 10 calls: a round trip of 8, then one of 2
    queue, runner = _queue(
        monkeypatch,
        [
            _count_check(),
            (_trip_of(8), [[1, 1, NOW]] * 8),
            (_trip_of(2), RedisConnectionError("Connection reset by peer")),
        ],
    )
    with pytest.raises(ConnectionFailed) as err:
        queue.schedule_many([{"kind": "email", "task_id": i} for i in ids])
    assert err.value.scheduled == ids[:16]
    assert err.value.unconfirmed == ids[16:]
    assert [s.status for s in err.value.scheduled] == ["created"] * 16  # type: ignore[attr-defined]
    text = str(err.value)
    assert text.startswith("cannot reach Redis at redis.invalid:6390/0 (Connection reset by peer)")
    assert "16 task(s) were scheduled before it (.scheduled), 4 may or may not be" in text
    assert err.value.__suppress_context__
    runner.done()


def test_schedule_many_all_confirmed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delayq.base, "SCHEDULE_BATCH", 2)
    queue, runner = _queue(monkeypatch, [_count_check(), (_trip_of(2), [[1, 0, NOW], [3, NOW]])])
    got = queue.schedule_many([{"kind": "k", "task_id": f"t-{i}"} for i in range(3)])
    assert [(str(s), s.status) for s in got] == [
        ("t-0", "created"),
        ("t-1", "unchanged"),
        ("t-2", "running"),
    ]
    runner.done()


# -- a Redis Cluster: MOVED on a node, then the fresh slot map ---------------------------------


class FakeCluster:
    """What cluster_trip_plan and the runner ask of a RedisCluster: a node per key, and a
    slot map the Refresh step renews (here: the slot has moved from node A to node B)."""

    def __init__(self) -> None:
        self.nodes_manager = self  # is_cluster()
        self.owner = "node-a"

    def get_node_from_key(self, key: str) -> str:
        return self.owner


def test_cluster_moved_refreshes_the_map_then_resends_to_the_new_node() -> None:
    cluster = FakeCluster()
    core = QueueCore("orders")
    op = core.shard_count(2, store=False)
    evalsha = ("EVALSHA", op.script.sha, len(op.keys), *op.keys, *op.args)

    def moved(step: Step) -> Any:
        cluster.owner = "node-b"  # what the refresh will find
        return True

    runner = ScriptedRunner(
        cluster,
        [
            (Nodes([("node-a", [evalsha])]), [[MovedError("1234 10.0.0.2:6379")]]),
            (lambda s: s == Refresh(0.1) and moved(s), None),
            (Nodes([("node-b", [evalsha])]), [[b"2"]]),
        ],
    )
    assert runner.drive(batch_plan([op])) == [ShardCheck(2, "")]
    runner.done()
    assert [type(s).__name__ for s in runner.steps] == ["Nodes", "Refresh", "Nodes"]


def test_on_a_cluster_the_command_goes_first_on_its_own_then_the_call_to_its_node() -> None:
    """The key and the queue may live on different nodes: the command is sent before the
    call's round trip, on the client's routing."""
    cluster = FakeCluster()
    op = QueueCore("orders").shard_count(2, store=False)
    evalsha = ("EVALSHA", op.script.sha, len(op.keys), *op.keys, *op.args)
    runner = ScriptedRunner(
        cluster,
        [(Command(("PTTL", "k")), 1500), (Nodes([("node-a", [evalsha])]), [[b"2"]])],
    )
    assert runner.drive(after_plan(("PTTL", "k"), op)) == (1500, ShardCheck(2, ""))
    runner.done()


def test_cluster_node_unreachable_throughout_is_a_connection_error_per_call() -> None:
    cluster = FakeCluster()
    op = QueueCore("orders").shard_count(2, store=False)
    down = RedisConnectionError("node-a is down")
    script: list[Expect] = [(lambda s: isinstance(s, Nodes), [down])]
    for attempt in range(1, 8):
        script += [(Refresh(min(0.05 * 2**attempt, 1.0)), None)]
        script += [(lambda s: isinstance(s, Nodes), [down])]
    runner = ScriptedRunner(cluster, script)
    replies = runner.drive(cluster_trip_plan(cluster, [op], None))
    runner.done()
    assert len(replies) == 1 and isinstance(replies[0], RedisConnectionError)
    assert str(replies[0]) == "the cluster node for this call stayed unreachable"


# -- plain commands (the expiring keys' plans) ------------------------------------------------


def test_expiring_set_writes_the_record_then_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    deadline = 1_700_000_060_000
    queue, runner = _queue(
        monkeypatch,
        [
            _count_check(),
            (lambda s: isinstance(s, Call) and s.op.script.name == "expire_set", deadline),
            (Command(("SET", "session:1", b'{"u":1}', "PXAT", deadline)), True),
        ],
    )
    assert queue.expiring.set("session:1", {"u": 1}, ttl=60).timestamp() * 1000 == deadline
    runner.done()


def test_expiring_touch_of_an_unwatched_key_sends_no_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue, runner = _queue(
        monkeypatch,
        [_count_check(store=False), (lambda s: isinstance(s, Call), -1)],
    )
    assert queue.expiring.touch("session:1", ttl=60) is False
    runner.done()


def test_a_plain_commands_redis_error_reaches_the_plan_as_a_delayq_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue, runner = _queue(
        monkeypatch,
        [
            _count_check(store=False),
            (lambda s: isinstance(s, Call) and s.op.script.name == "expire_delete", True),
            (Command(("DEL", "session:1")), RedisConnectionError("Connection refused")),
        ],
    )
    with pytest.raises(ConnectionFailed) as err:
        queue.expiring.delete("session:1")
    assert str(err.value).startswith("cannot reach Redis at redis.invalid:6390/0 (Connection")
    runner.done()
