"""Checking and encoding tasks without a server: CheckedSpec (checked once, as it is made),
the JSON encoder made once (codec.compact_json) and the per-queue constants of a schedule
call, each against what it replaces."""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import UTC, datetime
from typing import Any

import pytest

from delayq import InvalidTaskError, Queue, TaskSpec
from delayq.codec import compact_json, encode_record, split_record
from delayq.core import QueueCore
from delayq.expiring import ops as expiring
from delayq.info import as_bytes
from delayq.keys import QueueKeys
from delayq.spec import CheckedSpec, task_ids
from delayq.testing import VirtualClock

VALUES: list[Any] = [
    None,
    True,
    0,
    -(2**70),
    1.5,
    1e300,
    "",
    'é\u2028"\\/\x00\x1f',
    [1, [2, [3, {}]]],
    {"a": {"b": [None, False]}, "é": "ü", "": 1.0},
    {1: "int key", 2.5: "float key", None: "null key", False: "bool key"},
]


@pytest.mark.parametrize("ensure_ascii", [False, True])
@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_compact_json_writes_what_the_standard_encoder_writes(
    value: Any, ensure_ascii: bool
) -> None:
    standard = json.JSONEncoder(separators=(",", ":"), ensure_ascii=ensure_ascii, allow_nan=False)
    assert compact_json(ensure_ascii)(value) == standard.encode(value)


def test_compact_json_refuses_what_the_standard_encoder_refuses() -> None:
    encode = compact_json()
    circular: list[Any] = []
    circular.append(circular)
    with pytest.raises(ValueError, match="Circular reference"):
        encode(circular)
    nested: dict[str, Any] = {}
    nested["self"] = {"again": nested}
    with pytest.raises(ValueError, match="Circular reference"):
        encode(nested)
    for bad in (math.nan, [math.inf]):
        with pytest.raises(ValueError, match="not JSON compliant"):
            encode(bad)
    with pytest.raises(TypeError, match="not JSON serializable"):
        encode({"when": datetime.now(UTC)})
    assert encode([1, 2]) == "[1,2]"  # nothing left behind by the errors


def test_a_checked_spec_refuses_what_schedule_many_refuses() -> None:
    core = QueueCore("q")
    bad: list[dict[str, Any]] = [
        {"kind": ""},
        {"kind": "a\nb"},
        {"kind": "k", "task_id": "x" * 257},
        {"kind": "k", "task_id": "bad\x00id"},
        {"kind": "k", "task_id": "\udcff"},
        {"kind": "k", "delay": -1},
        {"kind": "k", "delay": math.nan},
        {"kind": "k", "delay": True},
        {"kind": "k", "delay": 1, "at": 2},
        {"kind": "k", "at": datetime(2030, 1, 1)},  # naive
        {"kind": "k", "max_attempts": -1},
        {"kind": "k", "max_attempts": 1.0},
        {"kind": "k", "headers": {"a": 1}},
        {"kind": "k", "headers": {"a": "x" * 5000}},
    ]
    for fields in bad:
        with pytest.raises(InvalidTaskError) as plain:
            core.encode_tasks([TaskSpec(**fields)])
        with pytest.raises(InvalidTaskError) as checked:
            CheckedSpec(**fields)
        assert str(checked.value) == str(plain.value), fields


def test_a_checked_spec_encodes_as_the_same_task_spec() -> None:
    core = QueueCore("q", clock=VirtualClock(datetime(2027, 1, 1, tzinfo=UTC)))
    fields: list[dict[str, Any]] = [
        {"kind": "k", "payload": {"n": 1}, "delay": 1.5, "task_id": "a"},
        {"kind": "k", "payload": [1], "at": datetime(2030, 1, 2, tzinfo=UTC), "task_id": "b"},
        {"kind": "k", "max_attempts": 3, "headers": {"t": "1"}, "task_id": "c"},
        {"kind": "k", "headers": {}, "task_id": "d"},
    ]
    plain = core.encode_tasks([TaskSpec(**f) for f in fields])
    assert core.encode_tasks([CheckedSpec(**f) for f in fields]) == plain


def test_only_a_checked_spec_itself_is_trusted() -> None:
    """A subclass may make its instances without the checks: its ids are checked again,
    and dataclasses.replace of a CheckedSpec checks the new one."""

    class Unchecked(CheckedSpec):
        def __init__(self, kind: str, task_id: str) -> None:
            TaskSpec.__init__(self, kind, task_id=task_id)
            self.__dict__.update(due="+0", header_field=b"")

    with pytest.raises(InvalidTaskError, match="control characters"):
        task_ids([Unchecked("k", "bad\nid"), CheckedSpec("k", task_id="fine")])
    with pytest.raises(InvalidTaskError, match="control characters"):
        dataclasses.replace(CheckedSpec("k", task_id="fine"), task_id="bad\nid")
    spec = CheckedSpec("k", {"p": 1}, delay=2)
    assert spec == CheckedSpec("k", {"p": 1}, delay=2) and spec.due == "+2000"
    assert spec != TaskSpec("k", {"p": 1}, delay=2)  # (dataclass equality: the same class)


def test_a_schedule_call_reuses_its_constants_only_on_the_servers_clock() -> None:
    core = QueueCore("q")
    one, two = core.schedule([TaskSpec("k")]), core.schedule([TaskSpec("k")], replace=True)
    assert one.keys == two.keys and one.keys is not two.keys
    assert one.args[:5] == ["", core.dedupe_ms, "0", core.keys.wake_channel, "0"]
    assert two.args[:5] == ["", core.dedupe_ms, "1", core.keys.wake_channel, "0"]
    assert one.args[5] == one.parse(None)[0] and len(one.args) == len(two.args) == 8
    clock = VirtualClock(datetime(2027, 1, 1, tzinfo=UTC))
    virtual, start = QueueCore("q", clock=clock), clock.now_ms()
    assert virtual.schedule([TaskSpec("k")]).args[0] == start
    clock.advance(5)
    assert virtual.schedule([TaskSpec("k")]).args[0] == start + 5000


def test_key_names_are_made_once_and_stay_right() -> None:
    keys = QueueKeys("orders#3", "pre")
    assert (
        keys.wake_channel == "pre:{orders#3}:wake" and keys.scheduled == "pre:{orders#3}:scheduled"
    )
    assert keys.wake_channel is keys.wake_channel  # (kept after the first read)
    assert keys == QueueKeys("orders#3", "pre") and hash(keys) == hash(QueueKeys("orders#3", "pre"))
    assert QueueKeys("other").scheduled == "dq:{other}:scheduled"


def test_checked_spec_many_checks_each_task_as_one_checked_spec() -> None:
    at = datetime(2030, 1, 2, tzinfo=UTC)
    rows: list[tuple[Any, ...]] = [
        ("k", {"n": 1}, 60, None, "a", 0, None),
        ("k", {"n": 2}, 60, None, None, 0, {"t": "1"}),
        ("k2", None, None, at, "c", 3, None),
        ("k", [1], 60, None, None, 0, None),
    ]
    many = CheckedSpec.many(rows)
    assert [s.task_id for s in many][::2] == ["a", "c"] and all(s.task_id for s in many)
    for spec, (kind, payload, delay, at_, _, attempts, headers) in zip(many, rows, strict=True):
        one = CheckedSpec(kind, payload, delay, at_, spec.task_id, attempts, headers)
        assert type(spec) is CheckedSpec and spec == one
        assert (spec.due, spec.header_field) == (one.due, one.header_field)
    # Checked once per value *and type*: True is not 1, and a repeated bad value still fails.
    for bad in [
        [("k", None, None, None, None, 1, None), ("k", None, None, None, None, True, None)],
        [("k", None, 1, None, None, 0, None), ("k", None, True, None, None, 0, None)],
        [("k", None, 1, None, None, 0, None), ("k", None, 1, None, "x\ny", 0, None)],
        [("k", None, 1, None, None, 0, None), ("k", None, 1, None, None, 0, {"a": 1})],
        [("k", None, [1], None, None, 0, None)],
        [("k", None, math.nan, None, None, 0, None)] * 2,
    ]:
        with pytest.raises(InvalidTaskError):
            CheckedSpec.many(bad)


def test_every_record_is_written_by_the_codec_alike() -> None:
    """The producer's records (a batch with and without headers, a single schedule's) and
    an expiring key's are codec.py's format: each is what encode_record writes, and
    split_record reads it back."""
    clock = VirtualClock()
    core = Queue("rec", url="redis://127.0.0.1:1/0", clock=clock).core  # never connects
    created = clock.now_ms()
    specs = [
        TaskSpec("k", {"n": 1}, task_id="a"),
        TaskSpec("k", {"n": 2}, task_id="b", headers={"t": "x"}),
        TaskSpec("j", [3], task_id="c", max_attempts=4),
    ]
    _, rest = core.encode_tasks(specs)
    assert rest[2::3] == [
        encode_record("k", b'{"n":1}', max_attempts=0, created_ms=created, fmt="json"),
        encode_record(
            "k", b'{"n":2}', max_attempts=0, created_ms=created, fmt="json", headers={"t": "x"}
        ),
        encode_record("j", b"[3]", max_attempts=4, created_ms=created, fmt="json"),
    ]
    single = core.schedule_new(TaskSpec("k", None, headers={"t": "y"}), "d").args[-1]
    assert single == encode_record(
        "k", b"null", max_attempts=0, created_ms=created, fmt="json", headers={"t": "y"}
    )
    notice = expiring.notice_op(core, "key", foreign=True)
    record = notice.args[notice.script.arg_names.index("record")]
    header, payload = split_record(as_bytes(record))
    assert (header.kind, header.created_ms, json.loads(payload)["k"]) == (
        expiring.EXPIRE_KIND,
        created,
        "key",
    )
    assert as_bytes(record) == encode_record(
        expiring.EXPIRE_KIND, payload, max_attempts=0, created_ms=created, fmt="json"
    )
