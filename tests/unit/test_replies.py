"""Script replies as declared (``-- REPLY`` in each script's header) against their decoders.
Server-free: the declarations are read from the Lua files, the decoders from the modules."""

from __future__ import annotations

from importlib import resources

import pytest

from delayq import leasing
from delayq.admin import inspect
from delayq.cron import facade as cron_facade
from delayq.expiring import ops as expiring_ops
from delayq.scripts import NAMES, SCRIPTS, Reply, file_of, parse_reply

# What each decoder reads of a reply, by name: (script, head and tail fields, row fields).
READ: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    (
        "claim",
        ("now", "next_due", "next_lease", "next_token"),
        (
            "id",
            "kind",
            "attempt",
            "max_attempts",
            "token",
            "due",
            "created",
            "format",
            "headers",
            "payload",
        ),
    ),
    *((name, (), ("id",)) for name in ("ack", "retry", "bury", "release")),
    ("extend", (), ("id", "aborted")),
    ("schedule", (), ("status",)),
    ("get", ("state", "score", "record", "error", "attempt"), ()),
    (
        "stats",
        (
            "now",
            "scheduled",
            "due",
            "active",
            "dead",
            "done",
            "head_due",
            "next_lease",
            "expiry_mode",
            "aborted",
        ),
        ("name", "value"),
    ),
    *((name, (), ("id", "score", "record", "error", "attempt")) for name in ("dead", "seek")),
    ("page", (), ("id", "score", "record", "error", "attempt")),
    ("workers", ("now",), ("id", "seen", "info")),
    ("timeline", ("now", "overdue", "later"), ("count",)),
    ("finished", (), ("kind", "due", "finished")),
    ("cron_read", ("now",), ("name", "meta", "state")),
    ("cron_sync", (), ("applied",)),
    ("expire_confirm", ("status", "ms"), ()),
]


def lua_files() -> set[str]:
    root = resources.files("delayq").joinpath("lua")
    found = set()
    for entry in root.iterdir():
        if entry.name.endswith(".lua"):
            found.add(entry.name)
        elif entry.is_dir() and entry.name != "lib":
            found |= {f"{entry.name}/{f.name}" for f in entry.iterdir() if f.name.endswith(".lua")}
    return found


def test_every_script_declares_its_reply() -> None:
    assert lua_files() == {file_of(n) for n in NAMES}, "every script file is a loaded script"
    for name in NAMES:
        text = resources.files("delayq").joinpath("lua", file_of(name)).read_text("utf-8")
        reply = parse_reply(name, text)
        assert reply == SCRIPTS[name].reply
        assert reply.array or reply.scalars, name


@pytest.mark.parametrize("script,outside,row", READ, ids=[r[0] for r in READ])
def test_the_decoders_names_are_in_the_declarations(
    script: str, outside: tuple[str, ...], row: tuple[str, ...]
) -> None:
    reply = SCRIPTS[script].reply
    for name in outside:
        reply.at(name)  # KeyError if undeclared
    for name in row:
        reply.field(name)


def test_the_decoders_read_their_positions_from_the_declaration() -> None:
    claim = SCRIPTS["claim"].reply
    assert (claim.head, claim.stride, claim.tail) == (4, 10, 0)
    assert (claim.at("now"), claim.field("token"), claim.field("payload")) == (0, 4, 9)
    assert (leasing._NOW, leasing._NEXT_DUE, leasing._NEXT_LEASE, leasing._NEXT_TOKEN) == (
        0,
        1,
        2,
        3,
    )
    assert inspect._LATER == -1 and inspect._OVERDUE == 1
    assert cron_facade._READ_NOW == 0
    assert expiring_ops.SCRIPTS["expire_confirm"].reply.heads == ("status", "ms")


def test_a_decoder_that_unpacks_refuses_a_declaration_in_another_order() -> None:
    reply = parse_reply("x", "-- REPLY {now} then per task {id, token}\n")
    reply.require_row("id", "token")
    reply.require_head("now")
    with pytest.raises(ValueError, match="read as"):
        reply.require_row("token", "id")
    with pytest.raises(ValueError, match="read as"):
        reply.require_head("now", "then")


@pytest.mark.parametrize(
    "line,want",
    [
        ("count", Reply("count", ("count",))),
        (
            "{a, b} | nil",
            Reply("{a, b} | nil", ("nil",), heads=("a", "b"), array=True),
        ),
        ("per task {id}", Reply("per task {id}", per="task", row=("id",), array=True)),
        (
            "{now, o} then per b {count} then {later}",
            Reply(
                "{now, o} then per b {count} then {later}",
                heads=("now", "o"),
                per="b",
                row=("count",),
                tails=("later",),
                array=True,
            ),
        ),
    ],
)
def test_the_grammar_reads_scalars_arrays_and_alternatives(line: str, want: Reply) -> None:
    assert parse_reply("x", f"-- x: doc\n-- KEYS[1] tasks\n-- REPLY {line}\nlocal x = 1\n") == want


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("-- KEYS[1] tasks\n", id="none"),
        pytest.param("-- REPLY count\n-- REPLY count\n", id="two"),
        pytest.param("-- REPLY \n", id="empty"),
        pytest.param("-- REPLY Count\n", id="not-a-name"),
        pytest.param("-- REPLY {a,b}\n", id="no-space"),
        pytest.param("-- REPLY {a, a}\n", id="repeated-field"),
        pytest.param("-- REPLY {a} then {b}\n", id="two-heads"),
        pytest.param("-- REPLY per x {a} then per y {b}\n", id="two-rows"),
        pytest.param("-- REPLY per x {a} then {b} then {c}\n", id="two-tails"),
        pytest.param("-- REPLY {a} | {b}\n", id="two-arrays"),
        pytest.param("-- REPLY count | count\n", id="repeated-alternative"),
        pytest.param("-- REPLY {a} and {b}\n", id="unknown-word"),
        pytest.param("-- REPLY {}\n", id="no-fields"),
    ],
)
def test_the_grammar_refuses_a_malformed_declaration(text: str) -> None:
    with pytest.raises(ValueError, match=r"x\.lua"):
        parse_reply("x", text)


def test_a_reply_line_after_the_header_does_not_count() -> None:
    with pytest.raises(ValueError, match="has 0"):
        parse_reply("x", "-- KEYS[1] tasks\nlocal x = 1\n-- REPLY count\n")


def test_rows_and_lengths_follow_the_declaration() -> None:
    reply = parse_reply("x", "-- REPLY {now} then per t {a, b} then {later}\n")
    assert list(reply.rows([0, 1, 2, 3, 4, 9])) == [(1, 2), (3, 4)]
    assert reply.at("later") == -1
    assert [reply.fits(n) for n in (1, 2, 3, 4, 5, 6)] == [False, True, False, True, False, True]
    with pytest.raises(ValueError):
        list(reply.rows([0, 1, 2, 3, 9]))  # half a row
    assert reply.matches([0, 9]) and not reply.matches([0]) and not reply.matches(None)
    get = SCRIPTS["get"].reply
    assert get.matches(None) and get.matches([b"scheduled", 1, b"r", None, None, None])
    assert SCRIPTS["cancel"].reply.matches(1) and not SCRIPTS["cancel"].reply.matches([1])
