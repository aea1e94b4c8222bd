"""Loading the Lua scripts: header parsing, includes, and the KEYS/ARGV preamble.

Each ``lua/<name>.lua`` opens with a header that declares its keys and arguments::

    -- KEYS[1] scheduled          (a QueueKeys attribute)
    -- ARGV[1] now  ms, or "" for the server's TIME
    -- ARGV[5...] tasks  triples: ...   (the variadic tail)
    -- REPLY {now, next_due, next_lease} then per task {id, kind, attempt, ...}

The header is the single source of truth: the loader prepends
``local K = {scheduled = KEYS[1], ...}`` and ``local A = {now = ARGV[1], ...}`` so the
body uses names, and :meth:`Script.keys_and_args` builds the call from the same names,
refusing a missing or unknown argument. ``--@include lib`` pulls in ``lua/lib/lib.lua``, and
its own includes, each lib once (:func:`expand`).

The ``-- REPLY`` line declares the reply's layout, once, on one line (prose about the
values goes in the ``Returns:`` lines)::

    reply  := shape (" | " shape)*      alternatives, by the call's mode; at most one array
    shape  := NAME                      one value: a count, a status, a deadline ...
            | "nil"                     Lua's false (Redis's nil): e.g. an unknown id
            | array
    array  := part (" then " part)*     a flat array, in this order, of at most:
    part   := fields                      a head of fixed fields (first),
            | "per " NAME fields          rows of fixed fields, repeated (once),
                                          a tail of fixed fields (last, after rows)
    fields := "{" NAME (", " NAME)* "}"

    -- REPLY count
    -- REPLY {state, score, record, error, attempt} | nil
    -- REPLY per task {id}
    -- REPLY {now, overdue} then per bucket {count} then {later}

Names are unique within an array. :class:`Reply` gives the decoders the positions by name
(``reply.at("now")`` in the head, negative in the tail; ``reply.field("token")`` within a
row; ``reply.head``, ``reply.stride``, ``reply.tail``), computed here, at load time. A
decoder binds them to module constants once, or unpacks rows by name (``for id, kind, ...
in reply.rows(r)``) after checking its names against the declaration at import
(``reply.require_row(...)``): nothing is paid per row.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from importlib import resources
from itertools import islice
from typing import Any

from delayq.keys import Key, QueueKeys

_KEY_RE = re.compile(r"^-- KEYS\[(\d+)\] (\*?\w+)\b")
_ARG_RE = re.compile(r"^-- ARGV\[(\d+)(\.\.\.)?\] (\w+)\b")
_INCLUDE_RE = re.compile(r"^--@include (\w+)[ \t]*$", re.M)
_REPLY_RE = re.compile(r"^-- REPLY (.*?)\s*$")
_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
_FIELDS_RE = re.compile(r"^(?:per ([a-z_][a-z0-9_]*) )?\{([^{}]*)\}$")

Arg = str | int | float | bytes


@dataclass(frozen=True)
class Reply:
    """A script's reply as its ``-- REPLY`` line declares it (see the grammar above).

    ``scalars`` are the one-value alternatives (``nil`` among them); an array, if any, is
    ``heads`` fields, then rows of ``row`` fields (``per`` names a row), then ``tails``
    fields. Positions come by name, so decoders never spell a number."""

    text: str
    scalars: tuple[str, ...] = ()
    heads: tuple[str, ...] = ()
    per: str | None = None
    row: tuple[str, ...] = ()
    tails: tuple[str, ...] = ()
    array: bool = False

    @property
    def head(self) -> int:
        """Entries before the first row."""
        return len(self.heads)

    @property
    def stride(self) -> int:
        """Entries per row (0: no rows)."""
        return len(self.row)

    @property
    def tail(self) -> int:
        """Entries after the last row."""
        return len(self.tails)

    def at(self, name: str) -> int:
        """Index of a head field, or (negative, from the end) of a tail field."""
        if name in self.heads:
            return self.heads.index(name)
        if name in self.tails:
            return self.tails.index(name) - len(self.tails)
        raise KeyError(f"the reply {{{self.text}}} has no field {name!r} outside its rows")

    def field(self, name: str) -> int:
        """Offset of a field within a row."""
        if name in self.row:
            return self.row.index(name)
        raise KeyError(f"the reply {{{self.text}}} has no row field {name!r}")

    def require_head(self, *names: str) -> None:
        """Refuse (ValueError) a head other than ``names``, in this order: a decoder that
        unpacks the head (``state, score, ... = reply``) checks its names once, at import."""
        if self.heads != names:
            raise ValueError(
                f"the reply {{{self.text}}} has the head {self.heads}, read as {names}"
            )

    def require_row(self, *names: str) -> None:
        """Refuse (ValueError) rows other than ``names``, in this order: a decoder that
        unpacks rows (``for id, kind, ... in reply.rows(r)``) checks its names once, at
        import, and pays nothing per row."""
        if self.row != names:
            raise ValueError(f"the reply {{{self.text}}} has rows {self.row}, read as {names}")

    def rows(self, reply: Sequence[Any]) -> Iterator[tuple[Any, ...]]:
        """The rows of an array reply, each a tuple of ``stride`` entries; ValueError (when
        iterated to the end) if the entries between head and tail are not whole rows."""
        body = islice(reply, self.head, len(reply) - self.tail)
        return zip(*[body] * self.stride, strict=True)

    def fits(self, length: int) -> bool:
        """Whether an array reply of ``length`` entries has the declared layout."""
        if not self.array:
            return False
        body = length - self.head - self.tail
        if self.stride == 0:
            return body == 0
        return body >= 0 and body % self.stride == 0

    def matches(self, reply: Any) -> bool:
        """Whether a reply as redis-py returns it (None, a value or a list) is one of the
        declared alternatives (for tests: decoders trust the declaration)."""
        if reply is None:
            return "nil" in self.scalars
        if isinstance(reply, list):
            return self.fits(len(reply))
        return any(s != "nil" for s in self.scalars)


def parse_reply(name: str, text: str) -> Reply:
    """The ``-- REPLY`` line of a script's header (exactly one). Malformed: ValueError."""
    found = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        if m := _REPLY_RE.match(line):
            found.append(m.group(1))
    if len(found) != 1:
        raise ValueError(f"{name}.lua: its header needs one '-- REPLY' line, has {len(found)}")
    decl = found[0]
    try:
        scalars: list[str] = []
        arrays: list[Reply] = []
        for alt in decl.split(" | "):
            if not _NAME_RE.match(alt):
                arrays.append(_array(decl, alt))
            elif alt in scalars:
                raise ValueError(f"the alternative {alt!r} repeats")
            else:
                scalars.append(alt)
        if len(arrays) > 1:
            raise ValueError("at most one alternative is an array")
    except ValueError as e:
        raise ValueError(f"{name}.lua: REPLY {decl!r}: {e} (see scripts.py's grammar)") from None
    if not arrays:
        return Reply(decl, tuple(scalars))
    return replace(arrays[0], scalars=tuple(scalars))


def _array(decl: str, alt: str) -> Reply:
    """One array alternative: head, rows and tail, each at most once and in that order."""
    heads: tuple[str, ...] | None = None
    per: str | None = None
    row: tuple[str, ...] = ()
    tails: tuple[str, ...] | None = None
    for part in alt.split(" then "):
        m = _FIELDS_RE.match(part)
        if not m:
            raise ValueError(f"{part!r} is neither a NAME, '{{fields}}' nor 'per NAME {{fields}}'")
        fields = tuple(m.group(2).split(", "))
        if not all(_NAME_RE.match(f) for f in fields):
            raise ValueError(f"{part!r}: fields are names separated by ', '")
        if m.group(1):
            if per is not None:
                raise ValueError("an array has one kind of row")
            per, row = m.group(1), fields
        elif per is not None and tails is None:
            tails = fields
        elif per is None and heads is None:
            heads = fields
        else:
            raise ValueError("an array is at most a head, then rows, then a tail")
    names = [*(heads or ()), *row, *(tails or ())]
    if len(set(names)) != len(names):
        raise ValueError("a field name repeats")
    return Reply(decl, (), heads or (), per, row, tails or (), array=True)


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str
    key_names: tuple[str, ...]
    arg_names: tuple[str, ...]
    variadic: str | None
    reply: Reply

    # Worked out once (keys_and_args runs on every call): the ARGV names as a set, and
    # whether every key is a QueueKeys one (none declared ``*name``).
    @cached_property
    def arg_set(self) -> frozenset[str]:
        return frozenset(self.arg_names)

    @cached_property
    def fixed_keys(self) -> bool:
        return not any(k.startswith("*") for k in self.key_names)

    def keys_and_args(
        self,
        keys: QueueKeys,
        args: dict[str, Arg],
        rest: list[Arg] | None = None,
        dynamic: dict[str, str] | None = None,
    ) -> tuple[list[str], list[Arg]]:
        """KEYS and ARGV for a call. A key declared ``*name`` depends on the call (say, the
        gate of one watched key) and comes from ``dynamic``; the others from QueueKeys."""
        if args.keys() != self.arg_set:
            raise TypeError(
                f"{self.name}.lua takes ARGV {self.arg_names}, got {tuple(sorted(args))}"
            )
        if rest and self.variadic is None:
            raise TypeError(f"{self.name}.lua takes no variadic arguments")
        argv: list[Arg] = [args[name] for name in self.arg_names]
        if rest:
            argv += rest
        if self.fixed_keys:
            return keys.names(self.key_names), argv
        dynamic = dynamic or {}
        names = []
        for k in self.key_names:
            if not k.startswith("*"):
                names.append(getattr(keys, k))
            elif k[1:] in dynamic:
                names.append(dynamic[k[1:]])
            else:
                raise TypeError(f"{self.name}.lua needs the key {k[1:]!r} for this call")
        return names, argv


def parse_header(name: str, text: str) -> tuple[tuple[str, ...], tuple[str, ...], str | None]:
    """Read KEYS and ARGV declarations; they must be numbered 1, 2, 3 ... in order."""
    keys: list[str] = []
    args: list[str] = []
    variadic: str | None = None
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        if m := _KEY_RE.match(line):
            if int(m.group(1)) != len(keys) + 1:
                raise ValueError(f"{name}.lua: KEYS[{m.group(1)}] is out of order")
            keys.append(m.group(2))
        elif m := _ARG_RE.match(line):
            if variadic is not None or int(m.group(1)) != len(args) + 1:
                raise ValueError(f"{name}.lua: ARGV[{m.group(1)}] is out of order")
            if m.group(2):
                variadic = m.group(3)
            else:
                args.append(m.group(3))
    return tuple(keys), tuple(args), variadic


def _read(path: str) -> str:
    return resources.files("delayq").joinpath("lua", path).read_text(encoding="utf-8")


def file_of(name: str) -> str:
    """A feature's scripts live in its folder: ``cron_next`` is ``lua/cron/next.lua``."""
    folder, _, rest = name.partition("_")
    return f"{folder}/{rest}.lua" if folder in FOLDERS and rest else f"{name}.lua"


def expand(name: str, text: str, read: Callable[[str], str] | None = None) -> str:
    """A script's text with its ``--@include lib`` lines replaced by ``lua/lib/lib.lua``, whose
    own includes are expanded first, in place: each lib once (a later include of it is an
    empty line), so a function is defined before the code that calls it. An include of a
    lib that is being expanded is a cycle: ValueError naming it (``a -> b -> a``); a
    missing lib: ValueError naming the script and the lib. ``read`` (tests) maps a lib's
    name to its text."""
    read = read or _read_lib
    done: set[str] = set()

    def walk(text: str, chain: tuple[str, ...]) -> str:
        def include(m: re.Match[str]) -> str:
            lib = m.group(1)
            if lib in chain:
                cycle = " -> ".join((*chain[chain.index(lib) :], lib))
                raise ValueError(
                    f"{name}.lua: the includes of lua/lib/ form a cycle: {cycle}; "
                    "a lib may include only libs that do not include it back"
                )
            if lib in done:
                return ""
            done.add(lib)
            return walk(read(lib), (*chain, lib)).rstrip("\n")

        return _INCLUDE_RE.sub(include, text)

    return walk(text, ())


def _read_lib(lib: str) -> str:
    try:
        return _read(f"lib/{lib}.lua")
    except FileNotFoundError:
        raise ValueError(f"--@include {lib}: there is no lua/lib/{lib}.lua") from None


def load(name: str) -> Script:
    text = _read(file_of(name))
    keys, args, variadic = parse_header(name, text)
    reply = parse_reply(name, text)
    for key in keys:
        if key.startswith("*"):
            continue
        if not isinstance(getattr(QueueKeys, key, None), Key):
            raise ValueError(f"{name}.lua: KEYS names {key!r}, which QueueKeys does not define")
    preamble = (
        "local K = {"
        + ", ".join(f"{k.lstrip('*')} = KEYS[{i}]" for i, k in enumerate(keys, 1))
        + "}\n"
    )
    preamble += "local A = {" + ", ".join(f"{a} = ARGV[{i}]" for i, a in enumerate(args, 1)) + "}\n"
    preamble += f"local REST = {len(args) + 1}\n"
    source = preamble + expand(name, text)
    sha = hashlib.sha1(source.encode()).hexdigest()
    return Script(name, source, sha, keys, args, variadic, reply)


FOLDERS = ("cron", "expire", "idem")  # lua/<folder>/<x>.lua is the script <folder>_<x>
NAMES = (
    "schedule",
    "schedule_new",
    "claim",
    "ack",
    "retry",
    "bury",
    "release",
    "handback",
    "extend",
    "reap",
    "cancel",
    "abort",
    "reschedule",
    "replay",
    "purge",
    "get",
    "wait",
    "stats",
    "dead",
    "unregister",
    "workers",
    "page",
    "timeline",
    "finished",
    "expire_set",
    "expire_touch",
    "expire_delete",
    "expire_notice",
    "expire_delivered",
    "expire_confirm",
    "cron_next",
    "cron_outcome",
    "cron_read",
    "shards",
    "settings",
    "cron_sync",
    "seek",
    "reshard_mark",
    "move_tasks",
    "move_fields",
    "control",
    "limit",
    "pause",
    "idem_begin",
    "idem_end",
)


def load_all() -> dict[str, Script]:
    return {name: load(name) for name in NAMES}


SCRIPTS: dict[str, Script] = load_all()
