"""Property tests (hypothesis) of the codec and of records read back from Redis: whatever
bytes sit in a task's record (corrupt, truncated, a wrong format version, an unknown kind),
the task ends in the dead set with its reason and the worker carries on."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from delayq import Queue, Worker
from delayq.codec import RecordError, decode_payload, encode_record, get_codec, split_record
from delayq.embedded import EmbeddedServer

from .support.helpers import wait_for

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
kinds = st.text(st.characters(codec="ascii", exclude_categories=["Cc"]), min_size=1, max_size=20)


@given(kind=kinds, value=json_values, attempts=st.integers(0, 100), created=st.integers(0, 2**41))
def test_a_record_round_trips(kind: str, value: Any, attempts: int, created: int) -> None:
    codec = get_codec("json")
    record = encode_record(
        kind, codec.encode(value), max_attempts=attempts, created_ms=created, fmt="json"
    )
    header, payload = split_record(record)
    assert (header.kind, header.max_attempts, header.created_ms) == (kind, attempts, created)
    assert decode_payload(header, payload, {}) == value


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_record_error(data: bytes) -> None:
    try:
        header, payload = split_record(data)
        decode_payload(header, payload, {})
    except RecordError:
        pass  # the one error a bad record may raise: the worker buries the task with it


def _valid(kind: str = "k") -> bytes:
    return encode_record(kind, b'{"n": 1}', max_attempts=0, created_ms=1, fmt="json")


header_fields = st.dictionaries(
    st.sampled_from(["k", "a", "m", "t", "c", "d", "f", "x"]),
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats()
    | st.text(max_size=5)
    | st.lists(st.integers(), max_size=2),
    max_size=7,
)

bad_records = st.one_of(
    st.binary(max_size=60),  # noise
    st.integers(1, len(_valid()) - 1).map(lambda n: _valid()[:n]),  # truncated
    header_fields.map(lambda h: json.dumps(h).encode() + b"\n{}"),  # odd header fields
    st.sampled_from([b"v9", b"msgpack", b"", b"pickle"]).map(  # unknown format version
        lambda f: b'{"k":"k","f":"' + f + b'"}\n{}'
    ),
    kinds.map(lambda k: _valid("unknown." + k)),  # a kind nobody handles
    st.binary(min_size=1, max_size=30).map(lambda b: _valid()[:-2] + b),  # corrupt payload
)


@pytest.fixture(scope="module")
def valkey() -> Any:
    srv = EmbeddedServer(appendonly=False).start()
    yield srv
    srv.stop()


@settings(
    max_examples=6,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # a failure prints its 20 records
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(records=st.lists(bad_records, min_size=20, max_size=20))
def test_bad_records_end_dead_with_a_reason_and_the_worker_carries_on(
    valkey: EmbeddedServer, run_worker: Any, records: list[bytes]
) -> None:
    queue = Queue("props", url=valkey.url)
    queue.client.flushdb()
    keys = queue.core.keys
    for i, record in enumerate(records):
        queue.client.hset(keys.tasks, f"bad:{i}", record)
        queue.client.zadd(keys.scheduled, {f"bad:{i}": 0})
    worker = Worker(queue, concurrency=4)
    ran: list[str] = []
    worker.handler("k")(lambda task: ran.append(task.id))
    with run_worker(worker):
        # A good task scheduled after the bad ones still runs: nothing wedged the worker.
        queue.schedule("k", {"ok": True}, task_id="good", delay=0.05)
        wait_for(lambda: "good" in ran, timeout=20)
        wait_for(lambda: queue.stats().scheduled == 0 and queue.stats().active == 0, timeout=20)
    done = queue.stats().done
    dead = {t.id: t.last_error or "" for t in queue.dead(0, 100)}
    # Every bad record either ran (it was a valid record after all) or is dead with a reason.
    for i in range(len(records)):
        tid = f"bad:{i}"
        assert tid in ran or tid in dead, (tid, records[i])
        if tid in dead:
            assert dead[tid].strip(), (tid, records[i])
    assert done == len(ran)
    queue.close()
