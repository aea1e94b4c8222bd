"""The ``delayq`` command as a user runs it."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from delayq.cli.main import load_app, main


def test_load_app_explains_bad_specs() -> None:
    import click

    with pytest.raises(click.BadParameter, match="MODULE:ATTRIBUTE"):
        load_app("no_colon")
    with pytest.raises(click.BadParameter, match="cannot import"):
        load_app("no_such_module_xyz:worker")
    with pytest.raises(click.BadParameter, match="has no attribute"):
        load_app("tests.support.helpers:nope")


def test_worker_command_refuses_what_is_not_a_worker() -> None:
    result = CliRunner().invoke(main, ["worker", "tests.support.helpers:wait_for"])
    assert result.exit_code != 0
    assert "not a delayq Worker" in result.output


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and "0.1.0" in result.output
