"""The Lua library as real includes (``scripts.expand``): ``--@include`` is resolved
recursively, each lib once, a cycle is refused by name; and every script includes only what
it uses: each function or constant of ``lua/lib/`` that a script's expansion defines is
reached from the script's own code, and each file's includes are exactly the libs its own
code calls (a lib's needs are real includes, not a comment)."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from delayq.protocol.export import PRODUCER_SCRIPTS
from delayq.scripts import NAMES, SCRIPTS, expand, file_of

# A lib's definitions start in column 0: "local function name(" ... "end", or "local NAME =".
_DEF_RE = re.compile(r"^local (?:function (\w+)\(.*?^end$|(\w+) =)", re.M | re.S)
_INCLUDE_RE = re.compile(r"^--@include (\w+)", re.M)


def code(text: str) -> str:
    """Lua without its comments (no script or lib has '--' inside a string)."""
    return re.sub(r"--[^\n]*", "", text)


def lua(path: str) -> str:
    return resources.files("delayq").joinpath("lua", path).read_text(encoding="utf-8")


def libs() -> dict[str, str]:
    folder = resources.files("delayq").joinpath("lua", "lib")
    return {f.name[:-4]: f.read_text("utf-8") for f in folder.iterdir() if f.name.endswith(".lua")}


def definitions() -> dict[str, tuple[str, str]]:
    """Each name a lib defines -> (its lib, its definition's code)."""
    found: dict[str, tuple[str, str]] = {}
    for lib, text in libs().items():
        for m in _DEF_RE.finditer(text):
            name = m.group(1) or m.group(2)
            assert name not in found, f"{name} is defined in lib/{found[name][0]} and lib/{lib}"
            found[name] = (lib, code(m.group(0)))
    return found


def start(source: str, name: str) -> int:
    """Where a name's definition starts in an expanded script."""
    m = re.search(rf"^local (?:function )?{name}\b", source, re.M)
    assert m, name
    return m.start()


def calls(text: str, defs: dict[str, tuple[str, str]], but: str = "") -> set[str]:
    body = code(text)
    return {n for n in defs if n != but and re.search(rf"\b{n}\b", body)}


def reached(own: str, defs: dict[str, tuple[str, str]]) -> set[str]:
    """The lib names a script's own code uses, and those they use, and so on."""
    seen: set[str] = set()
    todo = list(calls(own, defs))
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += calls(defs[name][1].split("\n", 1)[-1], defs, but=name)
    return seen


# -- the expander, on libs given as text ----------------------------------------------------


def test_includes_are_expanded_recursively_in_place_each_lib_once() -> None:
    fake = {
        "a": "--@include b\n--@include c\nlocal function a() return b() + c() end\n",
        "b": "--@include c\nlocal function b() return c() end\n",
        "c": "local function c() return 1 end\n",
    }
    out = expand("s", "-- KEYS[1] x\n--@include a\n--@include c\nreturn a()\n", fake.__getitem__)
    assert out.count("local function c()") == 1
    assert out.index("function c(") < out.index("function b(") < out.index("function a(")
    assert out.index("function a(") < out.index("return a()")
    assert "--@include" not in out
    assert out.startswith("-- KEYS[1] x\nlocal function c()")  # in place, under the header


def test_a_script_without_includes_is_its_text() -> None:
    text = "-- KEYS[1] x\nreturn 1\n"
    assert expand("s", text, dict[str, str]().__getitem__) == text
    assert SCRIPTS["shards"].source.endswith(lua("shards.lua"))


@pytest.mark.parametrize(
    ("fake", "cycle"),
    [
        ({"a": "--@include a\n"}, "a -> a"),
        ({"a": "--@include b\n", "b": "--@include a\n"}, "a -> b -> a"),
        ({"a": "--@include b\n", "b": "--@include c\n", "c": "--@include b\n"}, "b -> c -> b"),
    ],
    ids=["itself", "two", "below-the-first"],
)
def test_a_cycle_is_refused_naming_it(fake: dict[str, str], cycle: str) -> None:
    with pytest.raises(ValueError) as err:
        expand("s", "--@include a\n", fake.__getitem__)
    assert f"s.lua: the includes of lua/lib/ form a cycle: {cycle};" in str(err.value)


def test_a_missing_lib_is_named() -> None:
    with pytest.raises(ValueError, match=r"--@include nope: there is no lua/lib/nope.lua"):
        expand("s", "--@include nope\n")


# -- the library as it is ------------------------------------------------------------------


def test_each_file_includes_exactly_the_libs_its_own_code_calls() -> None:
    defs = definitions()
    files = {f"lib/{lib}.lua": text for lib, text in libs().items()}
    files |= {file_of(n): lua(file_of(n)) for n in NAMES}
    for path, text in files.items():
        own = path[4:-4] if path.startswith("lib/") else ""
        wanted = {defs[n][0] for n in calls(text, defs)} - {own}
        included = _INCLUDE_RE.findall(text)
        assert len(included) == len(set(included)), path
        assert set(included) == wanted, (path, sorted(included), sorted(wanted))
        assert "Needs:" not in text, path  # a need is an include


def test_every_lib_is_used() -> None:
    used = {lib for n in NAMES for lib in _INCLUDE_RE.findall(lua(file_of(n)))}
    for text in libs().values():
        used |= set(_INCLUDE_RE.findall(text))
    assert used == set(libs())


@pytest.mark.parametrize("name", NAMES)
def test_a_script_expands_to_what_it_uses_once_each_defined_before_use(name: str) -> None:
    defs = definitions()
    source = SCRIPTS[name].source
    found = [m.group(1) or m.group(2) for m in _DEF_RE.finditer(source)]
    found = [n for n in found if n in defs]
    assert len(found) == len(set(found)), f"{name}: a lib is expanded twice"
    assert set(found) == reached(lua(file_of(name)), defs), name  # nothing more, nothing less
    at = {n: start(source, n) for n in found}
    for n in found:
        for callee in calls(defs[n][1].split("\n", 1)[-1], defs, but=n):
            assert at[callee] < at[n], f"{name}: {callee} is defined after {n}, which calls it"


@pytest.mark.parametrize("name", PRODUCER_SCRIPTS)
def test_an_exported_producer_script_is_its_own_code_plus_what_it_uses(name: str) -> None:
    """The bar, in lines: the preamble (3 lines), the script's file, and the libs it uses,
    each once. Each include line is a lib's text the first time, else an empty line."""
    defs = definitions()
    own = lua(file_of(name))
    reach = reached(own, defs)
    used = {defs[n][0] for n in reach}
    assert {n for n, (lib, _) in defs.items() if lib in used} == reach  # all of each lib used
    texts = [own, *(libs()[lib] for lib in used)]
    lines = sum(len(t.splitlines()) for t in texts)
    include_lines = sum(len(_INCLUDE_RE.findall(t)) for t in texts)
    # len(used) include lines become their lib's lines, each other one an empty line
    expected = 3 + (lines - include_lines) + (include_lines - len(used))
    assert SCRIPTS[name].source.count("\n") == expected, name
