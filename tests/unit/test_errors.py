"""The table from script status codes to exceptions, and ScriptError naming its script.
Server-free."""

from __future__ import annotations

import pickle

import pytest

from delayq.errors import (
    STATUS_ERRORS,
    ConfigurationError,
    Discard,
    LeaseLost,
    ScriptError,
    error_for,
    raise_for,
)
from delayq.scripts import SCRIPTS
from delayq.settings import ShardCheck
from delayq.shards import Shards


def test_every_status_in_the_table_is_a_scripts_and_declared_as_a_status() -> None:
    for script, _status in STATUS_ERRORS:
        reply = SCRIPTS[script].reply
        assert reply.scalars or reply.heads[:1] == ("status",), script


@pytest.mark.parametrize("n", [1, 4])
def test_the_resharding_refusal_reads_as_the_shard_check_words_it(n: int) -> None:
    shards = Shards("orders", n, prefix="app")
    with pytest.raises(ConfigurationError) as err:
        shards.verify(ShardCheck(-1, ""))
    want = error_for("shards", -1, queue="orders", key=shards.root.keys.shards)
    assert type(want) is ConfigurationError and str(want) == str(err.value)
    assert str(error_for("shards", b"-1", queue="orders", key="k")).startswith("queue 'orders'")


def test_statuses_that_are_no_refusal_raise_nothing() -> None:
    assert error_for("shards", 4, queue="q", key="k") is None
    assert error_for("cron_next", "run", id="x") is None
    raise_for("expire_confirm", b"current", key="k")  # no exception


def test_the_lost_leases_keep_their_exception_and_words() -> None:
    with pytest.raises(LeaseLost) as lost:
        raise_for("cron_next", b"lost", id="cron:s:1")
    assert str(lost.value) == "lease of occurrence cron:s:1 was lost before it started"
    with pytest.raises(Discard) as superseded:
        raise_for("expire_confirm", "lost", key="k")
    assert str(superseded.value) == "the expiry of 'k' was superseded before its deadline"


def test_a_script_error_names_its_script() -> None:
    sha = SCRIPTS["cron_next"].sha
    found = ScriptError(f"Redis refused a delayq script: WRONGTYPE ... script: {sha}, on @x:3.")
    assert found.script == "cron_next" and str(found).endswith("(script cron/next.lua)")
    given = ScriptError("Redis refused a delayq script: ERR boom", script="claim")
    assert given.script == "claim" and "claim.lua" in str(given)
    assert ScriptError("the server forgot script 'claim' twice in a row").script is None
    said = ScriptError("Redis refused a delayq script: move_tasks.lua said so", script="move_tasks")
    assert str(said).count("move_tasks.lua") == 1
    again = pickle.loads(pickle.dumps(found))
    assert (str(again), again.script) == (str(found), found.script)
