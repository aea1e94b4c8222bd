"""MkDocs hook: the generated parts of the configuration reference.

- ``<!-- delayq:cli -->`` in a page becomes the reference of every ``delayq`` command, its
  arguments and options with their defaults and environment variables, read from the click
  group ``delayq.cli.main.main`` (:func:`cli_reference`).
- A page holding that marker must name every environment variable that delayq's code reads
  (:func:`env_vars_read`); one it misses is a warning, so ``mkdocs build --strict`` fails.

``tests/unit/test_docs.py`` calls both functions directly.
"""

from __future__ import annotations

import ast
import inspect
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

log = logging.getLogger("mkdocs.hooks.configuration")

MARKER = "<!-- delayq:cli -->"
ROOT = Path(__file__).resolve().parents[2]


# -- the CLI ------------------------------------------------------------------------------


def _commands(
    group: click.Group, ctx: click.Context
) -> Iterator[tuple[click.Command, click.Context]]:
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        sub = click.Context(cmd, info_name=name, parent=ctx)
        yield cmd, sub
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, sub)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(param: click.Parameter, ctx: click.Context) -> str:
    default = param.get_default(ctx, call=False)
    # Click 8.2+ marks "no default" with a sentinel rather than None.
    unset = default is None or type(default).__name__ == "Sentinel"
    if unset or callable(default) or default is False or default in ((), []):
        return ""
    if isinstance(default, list | tuple):
        return ", ".join(f"`{d}`" for d in default)
    return f"`{default}`"


def _type(param: click.Parameter) -> str:
    if isinstance(param, click.Option) and param.is_flag:
        return "flag"
    if isinstance(param.type, click.Choice):
        return "one of " + ", ".join(f"`{c}`" for c in param.type.choices)
    if isinstance(param.type, click.IntRange | click.FloatRange):
        kind = "integer" if isinstance(param.type, click.IntRange) else "number"
        low, high = param.type.min, param.type.max
        if low is not None and high is not None:
            return f"{kind} {low} to {high}"
        return f"{kind} ≥ {low}" if low is not None else f"{kind} ≤ {high}"
    return param.type.name.lower().replace(" ", "\u00a0")


def _envvars(param: click.Parameter) -> str:
    envvar = param.envvar
    if not envvar:
        return ""
    names = [envvar] if isinstance(envvar, str) else list(envvar)
    return ", ".join(f"`${name}`" for name in names)


def _param_row(param: click.Parameter, ctx: click.Context) -> str:
    if isinstance(param, click.Argument):
        name = f"`{param.make_metavar(ctx)}`"
        help_text = "argument" + ("" if param.required else " (optional)")
        if param.nargs == -1:
            help_text += ", any number"
    else:
        assert isinstance(param, click.Option)
        name = ", ".join(f"`{o}`" for o in (*param.opts, *param.secondary_opts))
        help_text = param.help or ""
        if param.required:
            help_text = f"**Required.** {help_text}"
        if param.multiple and "repeatable" not in help_text:
            help_text += " (repeatable)"
    cells = [name, _type(param), _default(param, ctx), _envvars(param), help_text]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def cli_reference(group: click.Group | None = None, heading: str = "###") -> str:
    """Markdown for every command of ``group`` (default: the ``delayq`` command)."""
    if group is None:
        from delayq.cli.main import main as group
    root = click.Context(group, info_name="delayq")
    lines: list[str] = []
    for cmd, ctx in [(group, root), *_commands(group, root)]:
        path = ctx.command_path
        lines += [f"{heading} `{path}`", ""]
        usage = " ".join([path, *cmd.collect_usage_pieces(ctx)])
        lines += ["```text", usage, "```", ""]
        if cmd.help:
            text = inspect.cleandoc(cmd.help.split("\f")[0])
            lines += [line for line in text.splitlines() if line.strip() != "\b"] + [""]
        params = [
            p
            for p in cmd.get_params(ctx)
            if not getattr(p, "hidden", False) and "--help" not in getattr(p, "opts", ())
        ]
        if params:
            lines += [
                "| Argument or option | Type | Default | Environment | Description |",
                "| --- | --- | --- | --- | --- |",
                *(_param_row(p, ctx) for p in params),
                "",
            ]
        if isinstance(cmd, click.Group):
            subs = [f"`{path} {name}`" for name in cmd.list_commands(ctx)]
            lines += ["Commands: " + ", ".join(subs) + ".", ""]
    return "\n".join(lines)


# -- environment variables ----------------------------------------------------------------


def _strings(node: ast.AST) -> list[str] | None:
    """The string(s) a constant expression holds, or None if it is not one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List):
        items = [_strings(e) for e in node.elts]
        if all(i is not None for i in items):
            return [s for i in items if i is not None for s in i]
    return None


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _names_env(node: ast.AST) -> bool:
    """``URL_ENV``, ``URL_ENV[0]``, ``app.QUEUE_ENV``: a ``*_ENV`` constant, or part of one."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return (isinstance(node, ast.Name) and node.id.endswith("_ENV")) or (
        isinstance(node, ast.Attribute) and node.attr.endswith("_ENV")
    )


def _env_constants(tree: ast.AST) -> Iterator[str]:
    """The names held by constants ``*_ENV = "NAME"`` (or a tuple of names)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id.endswith("_ENV") for t in targets):
                yield from _strings(node.value) or []


def _keys_read(tree: ast.AST) -> Iterator[ast.expr]:
    """The key of every ``os.environ[...]``, ``os.environ.get(...)``, ``os.getenv(...)``
    and click ``envvar=...``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            yield node.slice
        elif isinstance(node, ast.Call):
            f = node.func
            reads = isinstance(f, ast.Attribute) and (
                f.attr == "getenv"
                or (f.attr in ("get", "pop", "setdefault") and _is_environ(f.value))
            )
            if reads and node.args:
                yield node.args[0]
            yield from (kw.value for kw in node.keywords if kw.arg == "envvar")


def env_vars_read(package: Path | None = None) -> tuple[set[str], list[str]]:
    """Every environment variable delayq's code names, and the reads it cannot resolve.

    Names come from constants ``*_ENV = "NAME"`` (or a tuple of names), ``envvar=`` of a
    click option, and literal keys of ``os.environ``/``os.getenv``. A read keyed by anything
    else (``os.environ[v] for v in URL_ENV`` is fine: ``v`` runs over a ``*_ENV`` constant)
    is returned as ``file:line``, so that a test can insist on a constant.
    """
    package = package or ROOT / "delayq"
    found: set[str] = set()
    unresolved: list[str] = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found.update(_env_constants(tree))
        over_env = {  # loop variables over a *_ENV constant
            n.target.id
            for n in ast.walk(tree)
            if isinstance(n, ast.For | ast.comprehension)
            and isinstance(n.target, ast.Name)
            and _names_env(n.iter)
        }
        for key in _keys_read(tree):
            names = _strings(key)
            if names is not None:
                found.update(names)
            elif not (_names_env(key) or (isinstance(key, ast.Name) and key.id in over_env)):
                where = path.relative_to(package.parent).as_posix()
                unresolved.append(f"{where}:{key.lineno}")
    return found, unresolved


# -- the hook -----------------------------------------------------------------------------


def on_config(config: Any) -> Any:
    # Document this checkout's delayq, whichever one the environment has installed.
    root = str(Path(config["config_file_path"]).resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    names, unresolved = env_vars_read()
    for name in sorted(names):
        if f"`{name}`" not in markdown:
            log.warning(
                "Doc file '%s' does not describe the environment variable %s, which delayq reads",
                page.file.src_uri,
                name,
            )
    for where in unresolved:
        log.warning("%s reads an environment variable that is not a *_ENV constant", where)
    return markdown.replace(MARKER, cli_reference())
