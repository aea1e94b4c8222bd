"""Typed tasks (issue 33, part 1) on real servers: ``TaskType("order.close", CloseOrder)``.

A typed task is written as the plain kind and the JSON a dict of its fields gives; its
handler gets the payload as its type (dataclass, TypedDict, pydantic model, msgspec Struct);
a payload another producer wrote that does not match is dead with the reason and the worker
goes on; unknown fields are ignored; the TaskType's handler options are defaults the
decorator's win over; and ``mypy --strict`` holds producers and handlers to the type.
"""

from __future__ import annotations

import enum
import itertools
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

import click
import httpx
import pytest

from delayq import AsyncQueue, Queue, Task, TaskSpec, TaskType, Worker
from delayq.errors import ConfigurationError, InvalidTaskError
from delayq.http import create_app
from delayq.testing import VirtualClock, drain

from .conftest import ROOT, WorkerThread
from .support.helpers import wait_for

RunWorker = Callable[[Worker], WorkerThread]


@dataclass
class CloseOrder:
    order_id: int
    reason: str = "unpaid"


close_order = TaskType("order.close", CloseOrder)


class Size(enum.Enum):
    SMALL = "s"
    LARGE = "l"


@dataclass
class Line:
    sku: str
    qty: int = 1


@dataclass
class Shipment:
    id: uuid.UUID
    at: datetime
    day: date
    price: Decimal
    size: Size
    lines: list[Line]
    weights: dict[str, float]
    note: str | None = None
    mode: Literal["air", "sea"] = "sea"
    tags: list[str] = field(default_factory=list)


class Reminder(TypedDict):
    user: int
    text: NotRequired[str]


def payload_of(queue: Queue, tid: str) -> bytes:
    """The payload bytes of a task's record: what follows its header line."""
    record = queue.client.hget(queue.core.keys.tasks, tid)
    assert isinstance(record, bytes)
    return record.split(b"\n", 1)[1]


def dead_reason(queue: Queue, tid: str) -> str:
    info = queue.get(tid)
    assert info is not None and info.state == "dead", info
    return info.last_error or ""


# -- the producer side -----------------------------------------------------------------


def test_a_typed_task_is_written_as_the_plain_kind_and_the_json_of_its_fields(
    queue: Queue,
) -> None:
    queue.schedule(close_order, CloseOrder(order_id=42), delay=900, task_id="typed")
    queue.schedule("order.close", {"order_id": 42, "reason": "unpaid"}, delay=900, task_id="p")
    assert (
        payload_of(queue, "typed") == payload_of(queue, "p") == b'{"order_id":42,"reason":"unpaid"}'
    )
    info = queue.get("typed")
    assert info is not None and info.kind == "order.close"
    assert info.payload == {"order_id": 42, "reason": "unpaid"}

    shipment = TaskType("ship", Shipment)
    value = Shipment(
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        datetime(2026, 12, 3, 18, 30, 5, 250000, tzinfo=UTC),
        date(2026, 12, 4),
        Decimal("19.90"),
        Size.LARGE,
        [Line("a-1", 2), Line("b-2")],
        {"a-1": 1.5},
    )
    queue.schedule(shipment, value, task_id="ship")
    plain = {
        "id": "12345678-1234-5678-1234-567812345678",
        "at": "2026-12-03T18:30:05.250000+00:00",
        "day": "2026-12-04",
        "price": "19.90",
        "size": "l",
        "lines": [{"sku": "a-1", "qty": 2}, {"sku": "b-2", "qty": 1}],
        "weights": {"a-1": 1.5},
        "note": None,
        "mode": "sea",
        "tags": [],
    }
    queue.schedule("ship", plain, task_id="ship-plain")
    assert payload_of(queue, "ship") == payload_of(queue, "ship-plain")
    assert json.loads(payload_of(queue, "ship")) == plain


class Channel(enum.StrEnum):
    EMAIL = "email"


class Priority(enum.IntEnum):
    HIGH = 2


@dataclass
class Notify:
    channel: str
    body: str
    rank: int


def test_a_str_subclass_mypy_accepts_is_written_as_its_text(queue: Queue) -> None:
    # A StrEnum member for a str field, Django's SafeString (render_to_string, mark_safe),
    # an IntEnum member for an int: each was refused ("expected a string, got SafeString").
    mark_safe = pytest.importorskip("django.utils.safestring").mark_safe
    notify = TaskType("notify", Notify)
    value = Notify(Channel.EMAIL, mark_safe("<b>hi</b>"), Priority.HIGH)
    queue.schedule(notify, value, task_id="t")
    plain = {"channel": "email", "body": "<b>hi</b>", "rank": 2}
    queue.schedule("notify", plain, task_id="p")
    assert payload_of(queue, "t") == payload_of(queue, "p")
    assert json.loads(payload_of(queue, "t")) == plain


def test_schedule_many_takes_task_specs_of_a_typed_task(queue: Queue) -> None:
    queue.schedule_many(
        [
            TaskSpec(close_order, CloseOrder(1), task_id="a"),
            TaskSpec(close_order, CloseOrder(2, "paid twice"), task_id="b"),
            {"kind": close_order, "payload": CloseOrder(3), "task_id": "c"},
        ]
    )
    assert payload_of(queue, "b") == b'{"order_id":2,"reason":"paid twice"}'
    assert payload_of(queue, "c") == b'{"order_id":3,"reason":"unpaid"}'
    # mypy cannot check the dict form (docs/concepts.md): the run time does, before writing.
    with pytest.raises(InvalidTaskError, match=r"'order.close' \(CloseOrder\).*Line"):
        queue.schedule_many(
            [
                {"kind": close_order, "payload": CloseOrder(4), "task_id": "d"},
                {"kind": close_order, "payload": Line("a"), "task_id": "e"},
            ]
        )
    assert queue.get("d") is None and queue.get("e") is None


async def test_async_queue_schedules_a_typed_task(aqueue: AsyncQueue) -> None:
    await aqueue.schedule(close_order, CloseOrder(order_id=7), task_id="x")
    info = await aqueue.get("x")
    assert info is not None and info.payload == {"order_id": 7, "reason": "unpaid"}


def test_a_payload_not_of_the_type_is_refused_unwritten(queue: Queue) -> None:
    with pytest.raises(InvalidTaskError, match=r"'order.close' \(CloseOrder\).*CloseOrder"):
        queue.schedule(close_order, {"order_id": 1}, task_id="no")  # type: ignore[misc]
    with pytest.raises(InvalidTaskError, match=r"order_id: expected an integer, got str '1'"):
        queue.schedule(close_order, CloseOrder(order_id="1"), task_id="no")  # type: ignore[arg-type]
    reminder = TaskType("remind", Reminder)
    with pytest.raises(InvalidTaskError, match="user: required field missing"):
        queue.schedule(reminder, {"text": "hi"}, task_id="no")  # type: ignore[misc]
    with pytest.raises(InvalidTaskError, match="Reminder has no field 'extra'"):
        queue.schedule(reminder, {"user": 1, "extra": 2}, task_id="no")  # type: ignore[misc]
    assert queue.get("no") is None


def test_a_type_delayq_cannot_check_is_refused_when_the_task_type_is_made() -> None:
    @dataclass
    class WithSet:
        ids: set[int]

    with pytest.raises(ConfigurationError, match=r"^WithSet.ids: set\[int\] is not a payload type"):
        TaskType("k", WithSet)
    with pytest.raises(ConfigurationError, match="must be a dataclass, a TypedDict"):
        TaskType("k", dict)
    with pytest.raises(ConfigurationError, match="max_attempts"):
        TaskType("k", CloseOrder, max_attempts=0)
    with pytest.raises(InvalidTaskError, match="kind must be a non-empty string"):
        TaskType("", CloseOrder)


def test_delayq_never_imports_pydantic_or_msgspec() -> None:
    typed = (
        "from dataclasses import dataclass\n"
        "import delayq, delayq.worker.worker, delayq.http\n"
        "@dataclass\n"
        "class C:\n"
        "    n: int\n"
        "t = delayq.TaskType('k', C)\n"
        "assert t.load(t.dump(C(1))) == C(1)\n"
    )
    loaded = "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'msgspec')))"
    blocked = "sys.modules['pydantic'] = sys.modules['msgspec'] = None  # as if not installed\n"
    for code, out in [(typed + loaded, "[]"), (blocked + typed, "")]:
        proc = subprocess.run(
            [sys.executable, "-c", "import sys\n" + code],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == out


# -- the worker side -------------------------------------------------------------------


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_the_handler_gets_its_dataclass(queue: Queue, run_worker: RunWorker, flavour: str) -> None:
    worker = Worker(queue)
    seen: dict[str, Any] = {}
    shipment = TaskType("ship", Shipment)
    if flavour == "sync":

        @worker.handler(close_order)
        def handle(task: Task[CloseOrder]) -> None:
            seen[task.id] = task.payload
    else:

        @worker.handler(close_order)
        async def handle_async(task: Task[CloseOrder]) -> None:
            seen[task.id] = task.payload

    @worker.handler(shipment)
    def ship(task: Task[Shipment]) -> None:
        seen[task.id] = task.payload

    value = Shipment(
        uuid.uuid4(),
        datetime(2026, 12, 3, 18, 30, tzinfo=UTC),
        date(2026, 12, 4),
        Decimal("0.10"),
        Size.SMALL,
        [Line("x")],
        {"x": 2},
        note="fragile",
        mode="air",
    )
    with run_worker(worker):
        queue.schedule(close_order, CloseOrder(order_id=42), task_id="order-close:42")
        queue.schedule(shipment, value, task_id="ship")
        # A producer in another language writes a plain object: the same handler reads it.
        queue.schedule("order.close", {"order_id": 43, "reason": "fraud"}, task_id="plain")
        wait_for(lambda: len(seen) == 3)
    assert seen["order-close:42"] == CloseOrder(order_id=42)
    assert seen["plain"] == CloseOrder(43, "fraud")
    assert seen["ship"] == value
    assert type(seen["ship"].weights["x"]) is float  # an int written for a float field


def test_a_typeddict_handler_gets_its_dict(queue: Queue, run_worker: RunWorker) -> None:
    reminder = TaskType("remind", Reminder)
    worker = Worker(queue)
    seen: list[Reminder] = []

    @worker.handler(reminder)
    def remind(task: Task[Reminder]) -> None:
        seen.append(task.payload)

    with run_worker(worker):
        queue.schedule(reminder, Reminder(user=1, text="hi"))
        queue.schedule("remind", {"user": 2, "unknown": [1, 2]})
        wait_for(lambda: len(seen) == 2)
    assert sorted(seen, key=lambda r: r["user"]) == [{"user": 1, "text": "hi"}, {"user": 2}]


def test_a_pydantic_model_and_a_msgspec_struct(queue: Queue, run_worker: RunWorker) -> None:
    pydantic = pytest.importorskip("pydantic")
    msgspec = pytest.importorskip("msgspec")

    class Invoice(pydantic.BaseModel):  # type: ignore[misc,name-defined]
        number: int
        total: Decimal
        due: date

    class Ping(msgspec.Struct):  # type: ignore[misc,name-defined]
        host: str
        port: int = 80

    invoice, ping = TaskType("invoice", Invoice), TaskType("ping", Ping)
    queue = Queue(queue.name, url=queue.url, keep_finished="record")  # (payloads read below)
    worker = Worker(queue)
    seen: dict[str, Any] = {}

    @worker.handler(invoice)
    def on_invoice(task: Task[Any]) -> None:
        seen[task.id] = task.payload

    @worker.handler(ping)
    def on_ping(task: Task[Any]) -> None:
        seen[task.id] = task.payload

    with run_worker(worker):
        queue.schedule(
            invoice, Invoice(number=1, total=Decimal("9.50"), due=date(2027, 1, 1)), task_id="i"
        )
        queue.schedule(ping, Ping("db"), task_id="p")
        queue.schedule("ping", {"port": "x"}, task_id="bad-ping")
        queue.schedule("invoice", {"number": "not a number"}, task_id="bad-invoice")
        wait_for(lambda: len(seen) == 2 and queue.stats().dead == 2)
    assert payload_of(queue, "i") == b'{"number":1,"total":"9.50","due":"2027-01-01"}'
    assert payload_of(queue, "p") == b'{"host":"db","port":80}'
    assert seen["i"] == Invoice(number=1, total=Decimal("9.50"), due=date(2027, 1, 1))
    assert seen["p"] == Ping("db")
    assert "payload does not match Ping (the type of 'ping')" in dead_reason(queue, "bad-ping")
    reason = dead_reason(queue, "bad-invoice")
    assert "payload does not match Invoice" in reason and "number:" in reason, reason
    queue.close()


def test_a_bad_payload_is_dead_with_the_reason_and_the_worker_goes_on(
    queue: Queue, run_worker: RunWorker
) -> None:
    worker = Worker(queue, concurrency=1)
    ran: list[CloseOrder] = []

    @worker.handler(close_order)
    def handle(task: Task[CloseOrder]) -> None:
        ran.append(task.payload)

    with run_worker(worker):
        # Written by a producer that knows only the plain kind (another language, say).
        queue.schedule("order.close", {"reason": "x"}, task_id="missing")
        queue.schedule("order.close", {"order_id": "42"}, task_id="wrong-type", delay=0.05)
        queue.schedule("order.close", [42], task_id="not-an-object", delay=0.1)
        queue.schedule(
            "order.close", {"order_id": 7, "new": {"a": 1}}, task_id="unknown", delay=0.15
        )
        queue.schedule(close_order, CloseOrder(8), task_id="next", delay=0.2)
        wait_for(lambda: len(ran) == 2 and queue.stats().dead == 3)
    assert ran == [CloseOrder(7), CloseOrder(8)]  # unknown fields ignored; the next one ran
    assert dead_reason(queue, "missing") == (
        "payload does not match CloseOrder (the type of 'order.close'): "
        "order_id: required field missing"
    )
    assert dead_reason(queue, "wrong-type") == (
        "payload does not match CloseOrder (the type of 'order.close'): "
        "order_id: expected an integer, got str '42'"
    )
    assert "the payload: expected an object, got list [42]" in dead_reason(queue, "not-an-object")
    info = queue.get("missing")
    assert info is not None and info.attempts == 1  # dead at once: no retries


def test_a_refusing_post_init_is_a_dead_reason_not_a_crash(
    queue: Queue, run_worker: RunWorker
) -> None:
    @dataclass
    class Positive:
        n: int

        def __post_init__(self) -> None:
            if self.n <= 0:
                raise ValueError("n must be positive")

    positive = TaskType("positive", Positive)
    worker = Worker(queue, concurrency=1)
    ran: list[int] = []

    @worker.handler(positive)
    async def handle(task: Task[Positive]) -> None:
        ran.append(task.payload.n)

    with run_worker(worker):
        queue.schedule("positive", {"n": -1}, task_id="neg")
        queue.schedule(positive, Positive(3), task_id="pos", delay=0.05)
        wait_for(lambda: ran == [3] and queue.stats().dead == 1)
    assert "n must be positive" in dead_reason(queue, "neg")


# -- handler options on the TaskType, and delayq.testing ---------------------------------


def test_the_task_types_options_are_defaults_the_decorators_win_over(
    server: Any, qname: str
) -> None:
    clock = VirtualClock()
    flaky = TaskType("flaky", CloseOrder, max_attempts=3, backoff=[10], jitter=0)
    other = TaskType("other", CloseOrder, max_attempts=3, backoff=[10], jitter=0)
    with Queue(qname, url=server.url, clock=clock) as queue:
        worker = Worker(queue)
        times: list[datetime] = []

        @worker.handler(flaky)
        def fail(task: Task[CloseOrder]) -> None:
            times.append(clock.now())
            raise RuntimeError(f"no {task.payload.order_id}")

        @worker.handler(other, max_attempts=1)
        def fail_once(task: Task[CloseOrder]) -> None:
            raise RuntimeError("once")

        queue.schedule(flaky, CloseOrder(1), task_id="f")
        queue.schedule(other, CloseOrder(2), task_id="o")
        ran = drain(worker, until=timedelta(minutes=5))
    assert [r.attempt for r in ran.by_kind(flaky)] == [1, 2, 3]  # the TaskType's 3
    assert [r.attempt for r in ran.by_kind(other)] == [1]  # the decorator's 1 wins
    assert {t.id for t in ran.dead} == {"f", "o"}
    # The TaskType's backoff: 10 s between attempts, in virtual time.
    assert [round((b - a).total_seconds()) for a, b in itertools.pairwise(times)] == [10, 10]


def test_drain_runs_typed_tasks_in_virtual_time(server: Any, qname: str) -> None:
    clock = VirtualClock()
    with Queue(qname, url=server.url, clock=clock) as queue:
        worker = Worker(queue)
        closed: list[int] = []

        @worker.handler(close_order)
        def handle(task: Task[CloseOrder]) -> None:
            closed.append(task.payload.order_id)

        queue.schedule(close_order, CloseOrder(order_id=42), delay=900, task_id="order-close:42")
        assert len(drain(worker, until=timedelta(minutes=14))) == 0
        ran = drain(worker, until=timedelta(minutes=2))
        assert closed == [42]
        assert [r.task_id for r in ran.by_kind(close_order)] == ["order-close:42"]


# -- mypy --strict holds producers and handlers to the type ------------------------------

GOOD = """
from dataclasses import dataclass
from typing import TypedDict

from delayq import Queue, Task, TaskSpec, TaskType, Worker


@dataclass
class CloseOrder:
    order_id: int
    reason: str = "unpaid"


class Reminder(TypedDict):
    user: int


close_order = TaskType("order.close", CloseOrder)
reminder = TaskType("remind", Reminder)
queue = Queue("orders")
worker = Worker(queue)

queue.schedule(close_order, CloseOrder(order_id=42), delay=900, task_id="order-close:42")
queue.schedule(reminder, Reminder(user=1))
queue.schedule("order.close", {"order_id": 1})
queue.schedule_many([TaskSpec(close_order, CloseOrder(1)), TaskSpec("plain", {"a": 1})])


@worker.handler(close_order)
def handle(task: Task[CloseOrder]) -> None:
    order_id: int = task.payload.order_id
    print(order_id, task.payload.reason.upper())


@worker.handler(close_order, max_attempts=2)
async def handle_async(task: Task[CloseOrder]) -> None:
    print(task.payload.order_id + 1)


@worker.handler("plain")
def plain(task: Task) -> None:
    print(task.payload["anything"])


closed = TaskType("order.closed", CloseOrder, result=str)


@worker.handler(closed)
def closing(task: Task[CloseOrder]) -> str:
    return f"closed {task.payload.order_id}"


@worker.handler(closed)
async def closing_async(task: Task[CloseOrder]) -> str:
    return "closed"
"""

# What mypy says of a payload not of the type: the payload type is inferred from both
# arguments, and a dict (or another type) given for a CloseOrder leaves none that fits.
NO_PAYLOAD_TYPE = 'Cannot infer value of type parameter "X"'
BAD = {
    'queue.schedule(close_order, {"order_id": 1})': NO_PAYLOAD_TYPE,
    "queue.schedule(close_order, Reminder(user=1))": NO_PAYLOAD_TYPE,
    'TaskSpec(close_order, {"order_id": 1})': NO_PAYLOAD_TYPE,
    "@worker.handler(close_order)\ndef nope(task: Task[CloseOrder]) -> None:\n"
    "    print(task.payload.nope)": '"CloseOrder" has no attribute "nope"  [attr-defined]',
    "@worker.handler(close_order)\ndef other(task: Task[Reminder]) -> None:\n"
    "    print(task.payload)": '"Callable[[Task[Reminder]], None]"; expected "Callable[[Task',
    # The handler's return is checked against the TaskType's result type.
    "@worker.handler(closed)\ndef counts(task: Task[CloseOrder]) -> int:\n"
    "    return 1": '"Callable[[Task[CloseOrder]], int]"; expected "Callable[[Task',
}


def _mypy(tmp_path: Path, source: str) -> list[str]:
    (tmp_path / "snippet.py").write_text(source)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--strict", "--cache-dir", str(ROOT / ".mypy_cache"), "--no-error-summary",
         "--hide-error-context", "--show-error-codes", "snippet.py"],
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    return [line for line in proc.stdout.splitlines() if line.strip()]


@pytest.mark.timeout(600)
def test_mypy_strict_accepts_typed_tasks_used_as_typed(tmp_path: Path) -> None:
    assert _mypy(tmp_path, GOOD) == []


@pytest.mark.timeout(600)
def test_mypy_strict_rejects_a_wrong_payload_and_a_wrong_attribute(tmp_path: Path) -> None:
    body, where = GOOD, {}  # line number -> the BAD snippet on it
    for snippet in BAD:
        body += "\n\n\n"
        first = body.count("\n") + 1
        body += snippet
        where.update(dict.fromkeys(range(first, body.count("\n") + 2), snippet))
    errors = _mypy(tmp_path, body + "\n")
    found: dict[str, list[str]] = {}
    for error in errors:
        m = re.match(r"^snippet\.py:(\d+): error: (?P<text>.*)$", error)
        assert m and int(m[1]) in where, errors  # errors only on BAD's lines
        found.setdefault(where[int(m[1])], []).append(m["text"])
    assert found.keys() == BAD.keys(), errors
    for snippet, texts in found.items():
        assert len(texts) == 1 and BAD[snippet] in texts[0], (snippet, texts)


# -- the HTTP API, given the task types ---------------------------------------------------

TOKEN = "s3cret-token-for-tests"


@pytest.fixture
async def typed_api(server: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(server.url, token=TOKEN, task_types=[close_order, TaskType("ship", Shipment)])
    transport = httpx.ASGITransport(app=app)
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://api", headers=headers) as c:
        yield c
    await app.state.api.aclose()


def _refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        own = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
        return own + [r for v in value.values() for r in _refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in _refs(v)]
    return []


async def test_the_openapi_document_gives_each_typed_kinds_payload_schema(
    typed_api: httpx.AsyncClient,
) -> None:
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    doc = (await typed_api.get("/openapi.json")).json()
    components = doc["components"]["schemas"]
    close = components["Payload.order.close"]
    assert close["$ref"] == "#/components/schemas/Payload.order.close.CloseOrder"
    assert components["Payload.order.close.CloseOrder"]["properties"] == {
        "order_id": {"type": "integer"},
        "reason": {"type": "string"},
    }
    assert components["Payload.order.close.CloseOrder"]["required"] == ["order_id"]
    for ref in _refs(doc):  # every reference resolves, nested types' included
        assert ref.removeprefix("#/components/schemas/") in components, ref
    # A task body is checked by its kind's payload schema (JSON Schema 2020-12's if/then).
    task = jsonschema_rs.validator_for(
        {"$ref": "#/components/schemas/Task", "components": doc["components"]}
    )
    assert task.is_valid({"kind": "order.close", "payload": {"order_id": 1, "new": True}})
    assert not task.is_valid({"kind": "order.close", "payload": {"reason": "x"}})
    assert not task.is_valid({"kind": "order.close", "payload": {"order_id": "1"}})
    assert task.is_valid({"kind": "plain", "payload": {"reason": "x"}})  # an untyped kind
    shipment = TaskType("ship", Shipment).dump(
        Shipment(uuid.uuid4(), datetime.now(UTC), date.today(), Decimal("1.5"), Size.SMALL,
                 [Line("a")], {"a": 1.0})
    )  # fmt: skip
    assert task.is_valid({"kind": "ship", "payload": shipment})
    assert not task.is_valid({"kind": "ship", "payload": {**shipment, "size": "xl"}})
    assert not task.is_valid({"kind": "ship", "payload": {**shipment, "lines": [{"qty": 1}]}})


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
class Basket:
    item: shop.Item
    refund: billing.Item


async def test_two_payload_types_of_one_name_get_a_component_each(server: Any) -> None:
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    basket = TaskType("basket", Basket)  # refused before: "Item contains itself"
    app = create_app(server.url, token=TOKEN, task_types=[basket])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://api"
    ) as client:
        doc = (await client.get("/openapi.json")).json()
    await app.state.api.aclose()
    components = doc["components"]["schemas"]
    for ref in _refs(doc):
        assert ref.removeprefix("#/components/schemas/") in components, ref
    task = jsonschema_rs.validator_for(
        {"$ref": "#/components/schemas/Task", "components": doc["components"]}
    )
    good = basket.dump(Basket(shop.Item("a", billing.Item(5)), billing.Item(2)))
    assert task.is_valid({"kind": "basket", "payload": good})
    assert not task.is_valid({"kind": "basket", "payload": {**good, "refund": {"sku": "a"}}})
    bad_item = {"sku": "a", "charge": {"sku": "b"}}
    assert not task.is_valid({"kind": "basket", "payload": {**good, "item": bad_item}})


async def test_the_api_refuses_a_typed_kinds_bad_payload_unwritten(
    typed_api: httpx.AsyncClient, server: Any, qname: str
) -> None:
    url = f"/v1/queues/{qname}/tasks"
    r = await typed_api.post(url, json={"kind": "order.close", "payload": {"order_id": 4}})
    assert r.status_code == 201, r.text
    r = await typed_api.post(url, json={"kind": "order.close", "payload": {"order_id": "4"}})
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    assert r.json()["errors"] == [
        {
            "pointer": "/payload",
            "detail": "payload does not match CloseOrder (the type of 'order.close'): "
            "order_id: expected an integer, got str '4'",
        }
    ]
    r = await typed_api.post(
        url + "/batch",
        json={
            "tasks": [
                {"kind": "order.close", "payload": {"order_id": 5}, "id": "a"},
                {"kind": "order.close", "payload": {}, "id": "b"},
                {"kind": "anything", "payload": {}, "id": "c"},
            ]
        },
    )
    assert r.status_code == 422, r.text
    assert [(e["index"], e["pointer"]) for e in r.json()["errors"]] == [(1, "/tasks/1/payload")]
    with Queue(qname, url=server.url) as q:
        assert q.stats().scheduled == 1 and q.get("a") is None


def test_delayq_api_task_types_loads_a_modules_task_types() -> None:
    from delayq.cli.main import load_task_types

    assert load_task_types("tests.test_typed") == [close_order]
    assert load_task_types("tests.test_typed:close_order") == [close_order]
    with pytest.raises(click.BadParameter, match="is not a TaskType or a list of them"):
        load_task_types("tests.test_typed:TOKEN")
    with pytest.raises(click.BadParameter, match="defines no TaskType"):
        load_task_types("tests.conftest")
