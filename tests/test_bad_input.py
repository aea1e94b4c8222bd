"""Bad input gets a clear error naming the problem, and nothing is written."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import pytest

from delayq import ConfigurationError, InvalidTaskError, PayloadTooLarge, Queue, TaskSpec
from delayq.backoff import MAX_BACKOFF_S, delay_for, validate_backoff
from delayq.embedded import EmbeddedServer
from delayq.worker.registry import make_handler


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"payload": {1, 2}}, "not JSON-serialisable"),
        ({"payload": object()}, "not JSON-serialisable"),
        ({"payload": math.nan}, "not JSON-serialisable"),
        ({"payload": "x" * (64 * 1024)}, "over the queue's limit"),
        ({"delay": -1}, "must not be negative"),
        ({"delay": math.nan}, "must be finite"),
        ({"delay": math.inf}, "must be finite"),
        ({"delay": timedelta(seconds=-5)}, "must not be negative"),
        ({"delay": "15m"}, "seconds"),
        ({"delay": 1e12}, "over ten years"),
        ({"at": datetime(2030, 1, 1)}, "naive datetime"),
        ({"at": math.inf}, "finite"),
        ({"at": 1.7e12}, "beyond year 9999"),
        ({"delay": 5, "at": 1.7e9}, "either delay= or at="),
        ({"task_id": ""}, "non-empty"),
        ({"task_id": "x" * 257}, "over the limit"),
        ({"task_id": 42}, "non-empty string"),
        ({"task_id": "a\nb"}, "control characters"),
        ({"kind": ""}, "kind must be"),
        ({"max_attempts": -1}, "max_attempts"),
        # Issue 15, finding 10: accepted, then buried as corrupt (or a raw UnicodeEncodeError).
        ({"max_attempts": 2**70}, "max_attempts must be a whole number from 0"),
        ({"max_attempts": 1_000_001}, "to 1,000,000"),
        ({"kind": "report.\udcff"}, "kind 'report.\\\\udcff' is not valid Unicode text"),
        ({"task_id": "file:\udcff.csv"}, "task_id .* lone surrogate"),
        ({"payload": {"path": "/data/\udcff.csv"}}, "payload is not valid Unicode text"),
        ({"payload": ["\ud800"]}, "lone surrogate"),
    ],
)
def test_bad_task_is_refused_before_anything_is_written(
    queue: Queue, kwargs: dict[str, object], message: str
) -> None:
    kwargs = dict(kwargs)  # the table is shared by every server flavour
    kind = kwargs.pop("kind", "k")
    payload = kwargs.pop("payload", None)
    with pytest.raises(InvalidTaskError, match=message):
        queue.schedule(kind, payload, **kwargs)  # type: ignore[arg-type]
    assert queue.client.exists(queue.core.keys.tasks, queue.core.keys.scheduled) == 0


@pytest.mark.parametrize(
    ("offset", "limit"), [(-1, 10), (0, 0), (0, 10_001), (0, 10**9), (0, 1.5), (True, 5)]
)
def test_a_dead_page_is_bounded(queue: Queue, offset: object, limit: object) -> None:
    """Limits are numbers users give too: a page of a billion tasks would read the whole
    dead set inside one script call."""
    with pytest.raises(InvalidTaskError, match=r"1 <= limit <= 10000, got"):
        queue.dead(offset, limit)  # type: ignore[arg-type]
    assert queue.dead(0, 10_000) == []  # the largest page is still taken


def test_lone_surrogates_are_refused_in_every_schedule_path(queue: Queue) -> None:
    """schedule_many and the msgpack codec check the same way, and nothing is written."""
    with pytest.raises(InvalidTaskError, match="lone surrogate"):
        queue.schedule_many([{"kind": "k", "task_id": "fine"}, {"kind": "k\udcff"}])
    with pytest.raises(InvalidTaskError, match="lone surrogate"):
        queue.schedule_many([TaskSpec("k", {"name": "\udcff"})])
    assert queue.client.exists(queue.core.keys.tasks, queue.core.keys.scheduled) == 0


def test_backoff_is_capped_and_a_broken_backoff_function_is_named() -> None:
    """What a backoff function returns is bounded: 2**n at attempt 40 is not a retry in
    35,000 years but MAX_BACKOFF_S; a function returning a non-number is refused."""
    assert delay_for(40, lambda n: 2**n, 0.0) == MAX_BACKOFF_S
    assert delay_for(5000, lambda n: 2**n, 0.0) == MAX_BACKOFF_S  # beyond a float's range
    assert delay_for(3, lambda n: math.inf, 0.0) == MAX_BACKOFF_S
    assert delay_for(1, [10.0], 1.0, rand=lambda: 0.999) < 20.0
    for bad in (math.nan, -1, "10", None):
        with pytest.raises(InvalidTaskError, match="backoff function returned"):
            delay_for(1, lambda n, bad=bad: bad, 0.0)  # type: ignore[misc]
    with pytest.raises(ConfigurationError, match="backoff must be"):
        validate_backoff([1.0, math.inf])
    with pytest.raises(ConfigurationError, match=r"from 1 to 1,000,000"):
        make_handler("k", lambda task: None, max_attempts=2**70)


def test_a_bad_worker_duration_is_a_configuration_error(queue: Queue) -> None:
    """Found by review: a negative lease (or grace, lookahead, max_wait, handler timeout)
    raised a task's InvalidTaskError, unlike every other bad worker option."""
    from delayq import Worker

    for option in ("lease", "grace", "lookahead", "max_wait"):
        with pytest.raises(ConfigurationError, match=f"{option} must not be negative"):
            Worker(queue, **{option: -1})
    worker = Worker(queue)
    with pytest.raises(ConfigurationError, match="lease must be seconds"):
        worker.configure(lease="30")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="timeout must be finite"):
        worker.handler("k", timeout=math.inf)(lambda task: None)


def test_payload_limit_is_configurable(server: EmbeddedServer, qname: str) -> None:
    with Queue(qname, url=server.url, max_payload=100) as q:
        with pytest.raises(PayloadTooLarge, match="100"):
            q.schedule("k", "y" * 200)
        q.schedule("k", "y" * 50)


def test_unknown_schedule_option_is_refused(queue: Queue) -> None:
    with pytest.raises(InvalidTaskError, match="unknown schedule option"):
        queue.schedule("k", None, dealy=5)  # type: ignore[call-arg]


@pytest.mark.parametrize("name", ["", "a{b}", "has space", "x#1", "a" * 101])
def test_bad_queue_name(name: str) -> None:
    with pytest.raises(ValueError, match="invalid queue name"):
        Queue(name, url="redis://127.0.0.1:1/0")


def test_bad_url_scheme_names_the_fix() -> None:
    with pytest.raises(ConfigurationError, match="unsupported Redis URL scheme 'http'"):
        Queue("q", url="http://127.0.0.1:1")


def test_unreachable_server_says_where_it_tried() -> None:
    from delayq import ConnectionFailed
    from delayq.embedded import free_port

    port = free_port()
    with (
        Queue("q", url=f"redis://127.0.0.1:{port}/0") as q,
        pytest.raises(ConnectionFailed, match=f"127.0.0.1:{port}.*DELAYQ_REDIS_URL"),
    ):
        q.schedule("k", None)


def test_client_that_decodes_responses_is_refused(server: EmbeddedServer) -> None:
    import redis

    with pytest.raises(ConfigurationError, match="decode_responses"):
        Queue("q", client=redis.Redis.from_url(server.url, decode_responses=True))


def test_url_from_environment(monkeypatch: pytest.MonkeyPatch, server: EmbeddedServer) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("DELAYQ_REDIS_URL", server.url)
    with Queue("envq") as q:
        assert q.url == server.url
    monkeypatch.delenv("DELAYQ_REDIS_URL")
    with Queue("envq") as q:
        assert q.url == "redis://127.0.0.1:1/0"
    monkeypatch.delenv("REDIS_URL")
    with Queue("envq") as q:
        assert q.url == "redis://127.0.0.1:6379/0"


def test_password_is_never_shown() -> None:
    from delayq.connection import redact

    assert redact("redis://user:s3cret@127.0.0.1:6379/0") == "redis://user:***@127.0.0.1:6379/0"


def test_nothing_read_from_redis_is_executed() -> None:
    """No pickle, eval, exec or import-by-name anywhere in the package: a record selects a
    registered handler by its kind string and carries JSON or msgpack data, nothing more."""
    import ast
    from pathlib import Path

    import delayq

    banned_modules = {"pickle", "cPickle", "dill", "marshal", "shelve", "cloudpickle"}
    banned_calls = {"eval", "exec", "__import__", "import_module"}
    found = []
    for path in Path(delayq.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        # The CLI imports the worker app the operator names on the command line (as uvicorn
        # does) and its own modules by constant names; the Django integration imports each
        # installed app's tasks module, named by the project's settings (as Django's own
        # autodiscover does). None of them comes from Redis.
        importers = {"load_app"} | ({"discover"} if path.name == "declare.py" else set())
        allowed = {
            id(n)
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef) and f.name in importers
            for n in ast.walk(f)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n.split(".")[0] in banned_modules for n in names):
                    found.append(f"{path.name}:{node.lineno} imports {names}")
            if isinstance(node, ast.Call) and id(node) not in allowed:
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", "")
                arg = node.args[0] if node.args else None
                own = isinstance(arg, ast.Constant) and str(arg.value).startswith("delayq.")
                if name in banned_calls and not own:
                    found.append(f"{path.name}:{node.lineno} calls {name}")
    assert not found, found


def test_generated_ids_never_start_with_a_dash() -> None:
    """``delayq task show ID`` must not read a generated id as an option (one in 64 would)."""
    from delayq.spec import new_task_ids

    ids = new_task_ids(20_000)
    assert not [i for i in ids if i.startswith("-")]
    assert len(set(ids)) == 20_000 and {len(i) for i in ids} == {16}
    assert sum(i.startswith("_") for i in ids) > 100  # the dash became an underscore


async def test_async_clients_pack_commands_with_hiredis_and_keep_redis_py_errors(
    server: EmbeddedServer, qname: str
) -> None:
    """delayq's own asyncio clients pack with hiredis (connection.hiredis_packing): the same
    bytes, the same replies, and bad arguments still raise redis-py's DataError."""
    from redis.asyncio.connection import Connection
    from redis.exceptions import DataError

    from delayq.connection import async_client

    client = async_client(server.url)
    try:
        cls = client.connection_pool.connection_class
        assert issubclass(cls, Connection) and cls is not Connection
        args = ("EVALSHA", "a" * 40, 1, "k", "", 3600000, 1.5, "é", b"\x00\xff", 2**70)
        packed = b"".join(cls().pack_command(*args))
        assert packed == b"".join(Connection().pack_command(*args))
        assert await client.execute_command("CONFIG GET", "maxmemory-policy")
        await client.set(qname, b"\x00\xff")
        assert await client.get(qname) == b"\x00\xff"
        with pytest.raises(DataError):
            await client.set(qname, None)  # type: ignore[arg-type]
    finally:
        await client.delete(qname)
        await client.aclose()


@pytest.mark.parametrize("bad", [True, False, 1.0, 0.0])
def test_a_bad_max_attempts_is_refused_after_a_good_one_of_the_same_kind(
    queue: Queue, bad: object
) -> None:
    """The record prefix cache is keyed by (kind, max_attempts): True == 1 and 1.0 == 1 (and
    False == 0) hash alike, so once a good count of that kind was scheduled, the bad one
    used to hit the cache and be written unchecked, while a fresh queue refuses it."""
    queue.schedule("k", None, max_attempts=0, delay=60)
    queue.schedule("k", None, max_attempts=1, delay=60)
    with pytest.raises(InvalidTaskError, match="max_attempts"):
        queue.schedule("k", None, max_attempts=bad, delay=60)  # type: ignore[arg-type]
    with pytest.raises(InvalidTaskError, match="max_attempts"):
        queue.schedule_many([TaskSpec("k", None, delay=60, max_attempts=bad)])  # type: ignore[arg-type]
