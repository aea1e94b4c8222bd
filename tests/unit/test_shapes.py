"""delayq/shapes.py without a server: what each field type is written as, what it reads back,
and what it refuses, with the field named; the types refused when a TaskType is made."""

from __future__ import annotations

import dataclasses
import enum
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any, Literal, NotRequired, Required, TypedDict

import pytest

from delayq import TaskType
from delayq.errors import ConfigurationError, InvalidTaskError
from delayq.shapes import ShapeError


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass
class Item:
    sku: str
    qty: int = 1


@dataclass
class Every:
    s: str
    i: int
    f: float
    b: bool
    n: None
    dt: datetime
    d: date
    u: uuid.UUID
    dec: Decimal
    lvl: Level
    lit: Literal["a", 1]
    items: list[Item]
    m: dict[str, int]
    opt: int | None
    anything: Any
    tags: list[str] = field(default_factory=list)


EVERY = Every(
    "x",
    1,
    2.5,
    True,
    None,
    datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    date(2026, 1, 2),
    uuid.UUID(int=1),
    Decimal("1.10"),
    Level.HIGH,
    1,
    [Item("a"), Item("b", 2)],
    {"k": 3},
    None,
    {"free": [1]},
)
PLAIN = {
    "s": "x",
    "i": 1,
    "f": 2.5,
    "b": True,
    "n": None,
    "dt": "2026-01-02T03:04:05+00:00",
    "d": "2026-01-02",
    "u": "00000000-0000-0000-0000-000000000001",
    "dec": "1.10",
    "lvl": 2,
    "lit": 1,
    "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}],
    "m": {"k": 3},
    "opt": None,
    "anything": {"free": [1]},
    "tags": [],
}
every = TaskType("every", Every)


def test_each_field_type_is_written_as_its_plain_json_and_read_back() -> None:
    assert every.dump(EVERY) == PLAIN
    assert every.load(PLAIN) == EVERY
    assert every.load({**PLAIN, "f": 2, "opt": 7, "unknown": "ignored"}) == Every(
        **{**EVERY.__dict__, "f": 2.0, "opt": 7}
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"s": 1}, "s: expected a string, got int 1"),
        ({"i": True}, "i: expected an integer, got bool True"),
        ({"i": 1.0}, "i: expected an integer, got float 1.0"),
        ({"f": "2.5"}, "f: expected a number, got str '2.5'"),
        ({"b": 1}, "b: expected true or false, got int 1"),
        ({"n": 0}, "n: expected null, got int 0"),
        ({"dt": "yesterday"}, "dt: expected an ISO 8601 date and time, got str 'yesterday'"),
        ({"d": "2026-01-02T00:00:00"}, "d: expected an ISO 8601 date (YYYY-MM-DD)"),
        ({"u": "nope"}, "u: expected a UUID as a string"),
        ({"dec": 1.1}, "dec: expected a decimal number as a string"),
        ({"dec": "NaN"}, "dec: expected a decimal number as a string"),
        ({"lvl": 3}, "lvl: expected one of [1, 2] (Level)"),
        ({"lit": "b"}, "lit: expected one of ['a', 1]"),
        ({"lit": True}, "lit: expected one of ['a', 1]"),
        ({"items": [{"sku": "a"}, {"qty": 2}]}, "items[1].sku: required field missing"),
        ({"items": {"sku": "a"}}, "items: expected a list"),
        ({"m": {"k": "3"}}, "m['k']: expected an integer"),
        ({"opt": "7"}, "opt: expected an integer"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_the_field(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ShapeError) as e:
        every.load({**PLAIN, **change})
    assert str(e.value).startswith(message), str(e.value)


def test_the_producer_refuses_what_the_worker_would() -> None:
    with pytest.raises(InvalidTaskError, match=r"dec: expected a finite decimal"):
        every.dump(Every(**{**EVERY.__dict__, "dec": Decimal("Infinity")}))
    with pytest.raises(InvalidTaskError, match=r"items\[0\]: expected an instance of Item"):
        every.dump(Every(**{**EVERY.__dict__, "items": [{"sku": "a"}]}))
    with pytest.raises(InvalidTaskError, match=r"dt: expected an ISO 8601 date and time"):
        every.dump(Every(**{**EVERY.__dict__, "dt": "2026-01-02"}))


class Base(TypedDict, total=False):
    maybe: int
    must: Required[str]


class Message(Base):
    to: str
    cc: NotRequired[list[str]]


def test_a_typeddicts_required_keys_under_postponed_annotations() -> None:
    # This module has "from __future__ import annotations": Python 3.11's __required_keys__
    # counts NotRequired keys as required then; the annotations are read instead.
    message = TaskType("message", Message)
    assert message.load({"to": "a", "must": "m", "extra": 1}) == {"to": "a", "must": "m"}
    for missing in ("to", "must"):
        with pytest.raises(ShapeError, match=f"{missing}: required field missing"):
            message.load({k: "x" for k in ("to", "must") if k != missing})
    assert message.json_schema()["$defs"]["Message"]["required"] == ["must", "to"]


@dataclass
class Loop:
    next: Loop | None


@dataclass
class HasSet:
    ids: set[int]


@dataclass
class BadEnumHolder:
    kind: BadEnum


class BadEnum(enum.Enum):
    A = 1.5


@pytest.mark.parametrize(
    ("tp", "message"),
    [
        (Loop, "Loop contains itself"),
        (HasSet, r"HasSet.ids: set\[int\] is not a payload type"),
        (BadEnumHolder, "BadEnum.A: an Enum in a payload is written as its value"),
        (int, "must be a dataclass, a TypedDict, a pydantic model or a msgspec Struct"),
    ],
)
def test_a_type_outside_the_set_is_refused_when_the_task_type_is_made(
    tp: Any, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        TaskType("k", tp)


# -- two types of one name (billing.Item, shop.Item) ---------------------------------------


class billing:  # a module's stand-in: its Item is billing.Item
    @dataclass
    class Item:
        amount_cents: int


class shop:
    @dataclass
    class Item:
        sku: str
        charge: billing.Item


@dataclass
class Order:  # not recursive: shop.Item holds a billing.Item, another type of one name
    item: shop.Item
    refund: billing.Item | None = None


def test_two_types_of_one_name_are_two_types_not_a_recursion() -> None:
    order = TaskType("order", Order)  # was refused: "Item contains itself"
    value = Order(shop.Item("a", billing.Item(5)), billing.Item(2))
    plain = {"item": {"sku": "a", "charge": {"amount_cents": 5}}, "refund": {"amount_cents": 2}}
    assert order.dump(value) == plain
    assert order.load(plain) == value
    with pytest.raises(ShapeError, match=r"item\.charge\.amount_cents: required field missing"):
        order.load({"item": {"sku": "a", "charge": {"sku": "b"}}})


def test_two_types_of_one_name_have_a_json_schema_each() -> None:
    schema = TaskType("order", Order).json_schema()
    module = Order.__module__.replace("<", "_").replace(">", "_")
    shop_item, billing_item = f"{module}.shop.Item", f"{module}.billing.Item"
    assert list(schema["$defs"]) == ["Order", shop_item, billing_item]  # in the order met
    assert schema["$defs"]["Order"]["properties"] == {
        "item": {"$ref": f"#/$defs/{shop_item}"},
        "refund": {"anyOf": [{"$ref": f"#/$defs/{billing_item}"}, {"type": "null"}]},
    }
    assert schema["$defs"][shop_item]["properties"] == {
        "sku": {"type": "string"},
        "charge": {"$ref": f"#/$defs/{billing_item}"},
    }
    assert schema["$defs"][billing_item]["properties"] == {"amount_cents": {"type": "integer"}}
    assert schema["$defs"][billing_item]["title"] == "Item"
    assert TaskType("order", Order).json_schema() == schema  # made the same way each time


# make_dataclass gives each the caller's module and the qualified name "Item": numbered.
ItemA = dataclasses.make_dataclass("Item", [("amount_cents", int)])
ItemB = dataclasses.make_dataclass("Item", [("sku", str)])
Pair = dataclasses.make_dataclass("Pair", [("a", ItemA), ("b", ItemB), ("c", ItemA)])


def test_types_of_one_qualified_name_are_numbered_in_the_order_met() -> None:
    pair = TaskType("pair", Pair)
    schema = pair.json_schema()
    first = f"{ItemA.__module__}.Item"
    assert list(schema["$defs"]) == ["Pair", first, f"{first}-2"]
    assert schema["$defs"]["Pair"]["properties"] == {
        "a": {"$ref": f"#/$defs/{first}"},
        "b": {"$ref": f"#/$defs/{first}-2"},
        "c": {"$ref": f"#/$defs/{first}"},
    }
    assert schema["$defs"][f"{first}-2"]["properties"] == {"sku": {"type": "string"}}
    value = Pair(ItemA(1), ItemB("x"), ItemA(2))
    assert pair.load(pair.dump(value)) == value


def test_a_type_named_as_none_other_keeps_its_plain_name() -> None:
    assert list(TaskType("every", Every).json_schema()["$defs"]) == ["Every", "Item"]


# -- values of a subclass mypy accepts for a field's type ----------------------------------


class Channel(enum.StrEnum):
    EMAIL = "email"


class Safe(str):
    """Like Django's SafeString: a str subclass whose str() is itself."""

    __slots__ = ()

    def __str__(self) -> str:
        return self


class Stamp(datetime):
    """Like freezegun's FakeDatetime or pendulum's DateTime."""


class Day(date):
    pass


@dataclass
class Notify:
    channel: str
    body: str
    count: int
    weight: float
    level: int
    at: datetime
    day: date
    by_channel: dict[str, int]
    tags: list[str]


def test_a_str_or_int_subclass_is_written_as_its_plain_value() -> None:
    notify = TaskType("notify", Notify)
    value = Notify(
        Channel.EMAIL,
        Safe("<b>hi</b>"),
        Level.HIGH,
        Level.LOW,
        Level.HIGH,
        Stamp(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        Day(2026, 1, 2),
        {Channel.EMAIL: Level.LOW},
        [Safe("a"), Channel.EMAIL],
    )
    plain = notify.dump(value)
    assert plain == {
        "channel": "email",
        "body": "<b>hi</b>",
        "count": 2,
        "weight": 1,
        "level": 2,
        "at": "2026-01-02T03:04:05+00:00",
        "day": "2026-01-02",
        "by_channel": {"email": 1},
        "tags": ["a", "email"],
    }
    exact = {str, int, float, dict, list}  # plain values: what json.dumps of the dict writes
    assert {type(v) for v in plain.values()} <= exact
    assert {type(v) for v in [*plain["by_channel"], *plain["by_channel"].values()]} == {str, int}
    assert {type(v) for v in plain["tags"]} == {str}
    assert json.dumps(plain) == json.dumps({**vars(value), "at": plain["at"], "day": plain["day"]})


def test_bool_is_still_refused_for_an_int_or_a_float_and_a_datetime_for_a_date() -> None:
    notify = TaskType("notify", Notify)
    good = Notify("e", "b", 1, 1.5, 1, datetime.now(UTC), date.today(), {}, [])
    for change, message in [
        ({"count": True}, "count: expected an integer, got bool True"),
        ({"weight": False}, "weight: expected a number, got bool False"),
        ({"day": datetime(2026, 1, 2)}, "day: expected an ISO 8601 date"),
        ({"by_channel": {1: 1}}, r"by_channel: expected an object with string keys"),
    ]:
        with pytest.raises(InvalidTaskError, match=message):
            notify.dump(Notify(**{**vars(good), **change}))
