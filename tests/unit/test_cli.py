"""The ``delayq`` command as a user runs it."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from delayq.cli.main import main
from delayq.cli.worker import load_app


def test_load_app_explains_bad_specs() -> None:
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


def _leaves(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            out += _leaves(cmd, (*path, name))
        else:
            out.append((*path, name))
    return out


# The queue of these is their app's (worker) or their own (demo): no -q to give.
OWN_QUEUE = {("worker",), ("demo",)}
# These never connect: they write files (the protocol's scripts).
OFFLINE = {("protocol", "export")}


@pytest.mark.parametrize("path", [p for p in _leaves(main) if p not in OFFLINE], ids=" ".join)
def test_every_command_takes_url_and_queue_and_its_help_names_their_environment(
    path: tuple[str, ...],
) -> None:
    cmd: click.Command = main
    for name in path:
        assert isinstance(cmd, click.Group)
        cmd = cmd.commands[name]
    opts = {o for p in cmd.params if isinstance(p, click.Option) for o in p.opts}
    result = CliRunner().invoke(main, [*path, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    help_text = " ".join(result.output.split())
    assert "--url" in opts
    assert "$DELAYQ_REDIS_URL" in help_text and "$REDIS_URL" in help_text
    if path not in OWN_QUEUE:
        assert {"-q", "--queue"} <= opts
        assert "$DELAYQ_QUEUE" in help_text
    for p in cmd.params:  # an option read from the environment says which variable
        envvar = getattr(p, "envvar", None)
        if isinstance(envvar, str):  # in its words, or click's (show_envvar)
            said = f"${envvar}" in help_text or f"env var: {envvar}" in help_text
            assert said, (path, p.name)


def test_main_help_lists_the_environment() -> None:
    result = CliRunner().invoke(main, ["--help"])
    for var in ("DELAYQ_REDIS_URL", "REDIS_URL", "DELAYQ_QUEUE", "DELAYQ_SERVER_BIN"):
        assert var in result.output
