"""The docs site cannot drift from the code: the configuration reference names every
environment variable delayq reads and every CLI option, the API reference every public name,
the docstrings every argument, and the nav every page (``mkdocs build --strict`` checks the
links; these say what is missing without a build)."""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path
from types import ModuleType

import click
import pytest

import delayq
import delayq.testing
from delayq import Queue, Worker
from delayq.cli.main import main as cli
from delayq.spec import ScheduleOptions

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _hook(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"docs_hook_{name}", DOCS / "hooks" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


configuration = _hook("configuration")
repo_files = _hook("repo_files")
rst_roles = _hook("rst_roles")


def _all_commands(
    group: click.Group, ctx: click.Context
) -> list[tuple[str, click.Command, click.Context]]:
    out = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None
        sub = click.Context(cmd, info_name=name, parent=ctx)
        out.append((sub.command_path, cmd, sub))
        if isinstance(cmd, click.Group):
            out += _all_commands(cmd, sub)
    return out


# -- the configuration reference --------------------------------------------------------


def test_every_environment_variable_is_described() -> None:
    page = (DOCS / "reference" / "configuration.md").read_text()
    names, unresolved = configuration.env_vars_read(ROOT / "delayq")
    assert {"DELAYQ_REDIS_URL", "REDIS_URL", "DELAYQ_QUEUE", "DELAYQ_SERVER_BIN"} <= names
    assert unresolved == [], "read an environment variable through a *_ENV constant"
    missing = sorted(n for n in names if f"`{n}`" not in page)
    assert missing == [], f"docs/reference/configuration.md does not describe {missing}"


def test_env_scan_finds_each_way_of_reading(tmp_path: Path) -> None:
    tree_src = """
import os, click
A_ENV = "ONE"
B_ENV = ("TWO", "THREE")
os.environ.get("FOUR")
os.getenv("FIVE")
os.environ["SIX"]
click.option("--x", envvar="SEVEN")
[os.environ[v] for v in B_ENV]
os.environ.get(name_from_elsewhere)
"""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text(tree_src)
    names, unresolved = configuration.env_vars_read(pkg)
    assert names == {"ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN"}
    assert unresolved == ["pkg/m.py:10"]


def test_the_page_holds_the_generated_cli_reference() -> None:
    page = (DOCS / "reference" / "configuration.md").read_text()
    assert configuration.MARKER in page
    for name in ("Queue", "Queue.schedule", "Worker", "Worker.handler"):
        assert f"::: delayq.{name}\n" in page


def test_cli_reference_has_every_command_and_option() -> None:
    text = configuration.cli_reference(cli)
    ctx = click.Context(cli, info_name="delayq")
    commands = _all_commands(cli, ctx)
    assert {"delayq worker", "delayq schedule", "delayq dead ls"} <= {p for p, _, _ in commands}
    for path, cmd, sub in [("delayq", cli, ctx), *commands]:
        section = text.split(f"### `{path}`\n", 1)[1].split("\n### ", 1)[0]
        for param in cmd.get_params(sub):
            if isinstance(param, click.Option):
                if "--help" in param.opts:
                    continue
                for opt in (*param.opts, *param.secondary_opts):
                    assert f"`{opt}`" in section, f"{path}: {opt} missing"
                envvars = [param.envvar] if isinstance(param.envvar, str) else param.envvar or []
                for var in envvars:
                    assert f"`${var}`" in section, f"{path}: ${var} missing"
            else:
                assert f"`{param.make_metavar(sub)}`" in section, f"{path}: {param.name}"


def test_cli_reference_shows_defaults_and_types() -> None:
    text = configuration.cli_reference(cli)
    worker = text.split("### `delayq worker`\n", 1)[1].split("\n### ", 1)[0]
    assert "delayq worker [OPTIONS] APP" in worker
    row = next(line for line in worker.splitlines() if line.startswith("| `--metrics-host`"))
    assert "`127.0.0.1`" in row
    row = next(line for line in worker.splitlines() if line.startswith("| `--log-level`"))
    assert "one of `debug`" in row and "`info`" in row


# -- docstrings and the API reference -----------------------------------------------------


def _documented_args(obj: object) -> set[str]:
    """The names in the Google-style ``Args:`` section of ``obj``'s docstring."""
    doc = inspect.getdoc(obj) or ""
    if "Args:" not in doc:
        return set()
    names = set()
    for line in doc.split("Args:", 1)[1].splitlines()[1:]:
        if line.strip() and not line.startswith(" "):
            break  # the next section
        if m := re.match(r"^ {4}\*{0,2}(\w+):", line):
            names.add(m[1])
    return names


def test_docstrings_list_every_argument() -> None:
    for obj, params in [
        (Queue, inspect.signature(Queue).parameters),
        (Worker, inspect.signature(Worker).parameters),
        (Worker.handler, inspect.signature(Worker.handler).parameters),
        (Queue.schedule, inspect.signature(Queue.schedule).parameters),
    ]:
        wanted = {p for p in params if p != "self"}
        assert wanted <= _documented_args(obj), f"{obj}: {wanted - _documented_args(obj)}"
    schedule_doc = inspect.getdoc(Queue.schedule) or ""
    for option in ScheduleOptions.__annotations__:
        assert f"``{option}``" in schedule_doc, option


def test_api_reference_has_every_public_name() -> None:
    pages = {p.name: p.read_text() for p in (DOCS / "reference").glob("*.md")}
    everything = "\n".join(pages.values())
    wanted = [f"delayq.{n}" for n in delayq.__all__]
    wanted += [f"delayq.testing.{n}" for n in delayq.testing.__all__]
    wanted += ["delayq.admin.Admin", "delayq.embedded.EmbeddedServer"]
    missing = [w for w in wanted if f"::: {w}\n" not in everything + "\n"]
    assert missing == []


def test_sphinx_roles_render_as_code() -> None:
    text = "A :class:`Scheduled`, :meth:`~delayq.queue.Queue.schedule` and :mod:`delayq.admin`."
    assert rst_roles.plain(text) == "A `Scheduled`, `schedule` and `delayq.admin`."


# -- the site ----------------------------------------------------------------------------


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    listed = set(re.findall(r":\s*(\S+\.md)\s*$", nav, re.M))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    pages = {p for p in pages if not p.startswith("hooks/")}
    assert pages - listed == set(), "add these pages to the nav in mkdocs.yml"
    assert listed - pages == set(), "the nav lists pages that do not exist"


def test_readme_becomes_the_home_page() -> None:
    readme = "See [concepts](docs/concepts.md#leases), [examples](examples/README.md), [x](https://e.org)."
    assert repo_files.readme_as_index(readme) == (
        "See [concepts](concepts.md#leases), [examples](../examples/README.md), [x](https://e.org)."
    )


def test_links_out_of_docs_become_repository_paths(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "a.py").write_text("")
    page = docs / "p.md"
    md = "[a.py](../examples/a.py), [the example](../examples/a.py), [c](concepts.md)\n"
    md += "```\n[a](../x)\n```\n"
    out = repo_files.repo_links(md, page, docs, tmp_path, "")
    assert out.splitlines()[0] == "`examples/a.py`, the example (`examples/a.py`), [c](concepts.md)"
    assert "[a](../x)" in out  # code blocks are left alone
    linked = repo_files.repo_links(md, page, docs, tmp_path, "https://github.com/o/r")
    assert "[a.py](https://github.com/o/r/blob/main/examples/a.py)" in linked


def test_a_link_to_a_missing_repository_file_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    repo_files.repo_links("[gone](../gone.py)", docs / "p.md", docs, tmp_path, "")
    assert "gone.py" in caplog.text


# -- the API reference reads like the user's API ------------------------------------------

api_reference = _hook("api_reference")
PLUMBING = ["execute", "checked", "drive", "runner"]


def _listed(page: str, cls: str) -> list[str]:
    return re.findall(rf"^::: delayq\.{cls}\.(\w+)$", page, re.M)


@pytest.mark.parametrize("cls", [Queue, delayq.AsyncQueue], ids=lambda c: c.__name__)
def test_the_queue_pages_list_every_method_the_users_first_and_the_plumbing_last(
    cls: type,
) -> None:
    page = (DOCS / "reference" / "api.md").read_text()
    listed = _listed(page, cls.__name__)
    public = sorted(n for n in dir(cls) if not n.startswith("_"))
    assert sorted(listed) == public, "list each public member once on docs/reference/api.md"
    assert listed[0] == "schedule"
    assert listed[-len(PLUMBING) :] == PLUMBING


def _griffe_package() -> object:
    import griffe

    return griffe.load(
        "delayq",
        search_paths=[str(ROOT)],
        extensions=griffe.load_extensions(api_reference.ApiReference()),
    )


def test_the_reference_shows_defaults_by_value_and_documents_each_coroutine() -> None:
    import griffe

    pkg: griffe.Module = _griffe_package()  # type: ignore[assignment]
    init = pkg["base.QueueBase.__init__"]
    defaults = {p.name: str(p.default) for p in init.parameters}
    assert defaults["prefix"] == "'dq'"  # not DEFAULT_PREFIX
    # The queue's settings default to None, "not given" (the queue's stored value, else the
    # default), and the reference says what that default is.
    assert defaults["max_payload"] == defaults["dedupe_window"] == defaults["codec"] == "None"
    args = pkg["queue.Queue"].docstring.value
    assert "(default 64 KiB)" in args and "(default 24 h)" in args
    assert '``"json"`` (default)' in args and "None (the default) is" in args
    named = []
    for path in delayq.__all__:
        obj = pkg[path] if path in pkg.members else None
        target = obj.final_target if isinstance(obj, griffe.Alias) else obj
        for member in [target, *getattr(target, "all_members", {}).values()]:
            member = member.final_target if isinstance(member, griffe.Alias) else member
            if isinstance(member, griffe.Function):
                named += [
                    f"{member.path}({p.name})"
                    for p in member.parameters
                    if isinstance(p.default, griffe.ExprName)
                    and p.default.canonical_path.startswith("delayq.")
                ]
    assert named == [], "a default still shows a constant's name"
    coroutines = pkg["queue.AsyncQueue"]
    for name in (n for n in dir(delayq.AsyncQueue) if not n.startswith("_")):
        member = coroutines.all_members[name]
        assert member.docstring is not None and member.docstring.value, name
    assert "[`Queue.schedule`][delayq.Queue.schedule]" in coroutines["schedule"].docstring.value
