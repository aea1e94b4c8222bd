"""The package's shape, checked from its source: docs/architecture.md's layering rules,
no import cycles, no reach-ins, no module over 600 lines.

Imports are read with ``ast`` from every module under ``delayq/``, those under
``TYPE_CHECKING`` and inside functions included: a cycle or a layer crossed that only the
type checker or a late import sees is still one a reader has to untangle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "delayq"


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package (a package is its __init__)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The package's modules ``name`` imports: ``from m import x`` imports the module
    ``m.x`` when there is one, else ``m``. (A package's ``__init__`` that only re-exports
    its own modules is run first by any import of them; that is how packages work, not a
    cycle, so it counts only where a module names the package itself.)"""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        for target in targets:
            if target in known and target != name:
                yield target


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imported(name, path, known)) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


# docs/architecture.md, "Layers": which packages the modules of each may import. "top" is
# delayq's own modules (delayq/*.py: the client and what both sides share); "delayq" the
# package's __init__ (its public names); a package may always import itself.
EVERY = {
    "top", "delayq", "cron", "expiring", "protocol", "web", "embedded", "worker", "admin",
    "testing", "processes", "dashboard", "http", "demo", "contrib", "cli",
}  # fmt: skip
MAY_IMPORT: dict[str, set[str]] = {
    "top": {"top"},  # and TOP_MAY_IMPORT's modules alone of the feature packages
    "delayq": {"top", "expiring", "worker"},
    "cron": {"top"},  # the features' pure parts: no worker, no front end
    "expiring": {"top"},
    "protocol": {"top"},
    "web": {"top"},
    "embedded": {"top"},
    "worker": {"top", "cron", "expiring"},  # (WORKER_FEATURES alone of its modules)
    "admin": {"top", "cron", "expiring", "worker"},
    "testing": {"top", "cron", "expiring", "worker", "embedded"},
    "processes": {"top", "admin", "worker"},
    "dashboard": {"top", "admin", "web", "cron", "expiring"},  # the public API and admin/
    "http": {"top", "admin", "web", "cron", "expiring"},
    "demo": {"top", "admin", "worker", "embedded"},
    "contrib": EVERY - {"cli"},
    "cli": EVERY,  # nothing imports cli/ but cli/ (and python -m delayq)
}
# The top level uses a feature package only through the producer's facades and the
# protocol version check (beside the shard check).
TOP_MAY_IMPORT = {"delayq.cron.facade", "delayq.expiring.facade", "delayq.protocol.version"}
# Within worker/, only the Worker's decorators and the features themselves name a feature:
# the engine plugs them in through their hooks (lane.Extension).
WORKER_FEATURES = ("delayq.worker.worker", "delayq.worker.features")
MAX_LINES = 600


def package_of(module: str) -> str:
    """``delayq.worker.engine`` -> ``worker``; ``delayq.queue`` -> ``top``."""
    parts = module.split(".")
    if module == "delayq.__main__":
        return "cli"  # (python -m delayq: the command)
    if len(parts) == 1:
        return "delayq"
    if (PACKAGE / parts[1]).is_dir():
        return parts[1]
    return "top"


def crossings(edges: dict[str, set[str]]) -> list[str]:
    """Every import that breaks a rule above, as "importer -> imported (why)"."""
    found = []
    for importer, targets in sorted(edges.items()):
        mine = package_of(importer)
        for target in sorted(targets):
            theirs = package_of(target)
            if theirs == mine:
                if (
                    mine == "worker"
                    and target.startswith(WORKER_FEATURES[1])
                    and not importer.startswith(WORKER_FEATURES)
                ):
                    found.append(f"{importer} -> {target} (the engine names no feature)")
                continue
            if mine == "top" and target in TOP_MAY_IMPORT:
                continue
            if theirs not in MAY_IMPORT[mine]:
                found.append(f"{importer} -> {target} ({mine} may not import {theirs})")
            elif (
                mine == "worker"
                and theirs in ("cron", "expiring")
                and not importer.startswith(WORKER_FEATURES)
            ):
                found.append(f"{importer} -> {target} (the engine names no feature)")
    return found


def test_every_package_is_in_the_table() -> None:
    packages = {package_of(m) for m in modules()}
    assert packages == set(MAY_IMPORT) == EVERY


def test_imports_keep_to_the_layers_of_the_architecture() -> None:
    assert crossings(graph()) == []


def test_the_layer_check_finds_an_import_against_the_rules() -> None:
    edges = {
        "delayq.queue": {"delayq.cron.ops", "delayq.cron.facade", "delayq.core"},
        "delayq.cron.ops": {"delayq.worker.context"},
        "delayq.worker.engine": {"delayq.worker.features.cron", "delayq.expiring.ops"},
        "delayq.worker.worker": {"delayq.worker.features.cron", "delayq.expiring.facade"},
        "delayq.dashboard.app": {"delayq.cli.common", "delayq.admin.inspect"},
    }
    assert crossings(edges) == [
        "delayq.cron.ops -> delayq.worker.context (cron may not import worker)",
        "delayq.dashboard.app -> delayq.cli.common (dashboard may not import cli)",
        "delayq.queue -> delayq.cron.ops (top may not import cron)",
        "delayq.worker.engine -> delayq.expiring.ops (the engine names no feature)",
        "delayq.worker.engine -> delayq.worker.features.cron (the engine names no feature)",
    ]


def test_no_module_is_over_600_lines() -> None:
    long = {
        name: n
        for name, path in modules().items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}, f"split these by what changes together: {long}"


def test_the_package_has_no_import_cycle() -> None:
    edges = graph()
    assert "delayq.queue" in edges and "delayq.worker.worker" in edges, "the walk found modules"
    assert cycles(edges) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def private_names(tree: ast.Module) -> set[str]:
    """The ``_names`` a module defines: functions, classes, module globals, attributes it
    assigns on ``self`` or ``cls``, and class-level names."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return {n for n in out if n.startswith("_") and not n.startswith("__")}


def reach_ins() -> list[str]:
    """Every use of a ``_name`` that another module of the package defines and this one
    does not: ``from m import _x``, or ``obj._x`` on anything but ``self``/``cls``."""
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in modules().items()}
    own = {name: private_names(tree) for name, tree in trees.items()}
    anyone: set[str] = set().union(*own.values())
    found = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{name}: from {node.module} import {alias.name}")
            elif (
                isinstance(node, ast.Attribute)
                and node.attr in anyone
                and node.attr not in own[name]
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{name}:{node.lineno}: .{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names() -> None:
    assert reach_ins() == []
