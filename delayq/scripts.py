"""Loading the Lua scripts: header parsing, includes, and the KEYS/ARGV preamble.

Each ``lua/<name>.lua`` opens with a header that declares its keys and arguments::

    -- KEYS[1] scheduled          (a QueueKeys attribute)
    -- ARGV[1] now  ms, or "" for the server's TIME
    -- ARGV[5...] tasks  triples: ...   (the variadic tail)

The header is the single source of truth: the loader prepends
``local K = {scheduled = KEYS[1], ...}`` and ``local A = {now = ARGV[1], ...}`` so the
body uses names, and :meth:`Script.keys_and_args` builds the call from the same names,
refusing a missing or unknown argument. ``--@include lib`` pulls in ``lua/lib/lib.lua``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from delayq.keys import Key, QueueKeys

_KEY_RE = re.compile(r"^-- KEYS\[(\d+)\] (\*?\w+)\b")
_ARG_RE = re.compile(r"^-- ARGV\[(\d+)(\.\.\.)?\] (\w+)\b")
_INCLUDE_RE = re.compile(r"^--@include (\w+)\s*$", re.M)

Arg = str | int | float | bytes


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str
    key_names: tuple[str, ...]
    arg_names: tuple[str, ...]
    variadic: str | None

    def keys_and_args(
        self,
        keys: QueueKeys,
        args: dict[str, Arg],
        rest: list[Arg] | None = None,
        dynamic: dict[str, str] | None = None,
    ) -> tuple[list[str], list[Arg]]:
        """KEYS and ARGV for a call. A key declared ``*name`` depends on the call (say, the
        gate of one watched key) and comes from ``dynamic``; the others from QueueKeys."""
        if set(args) != set(self.arg_names):
            raise TypeError(
                f"{self.name}.lua takes ARGV {self.arg_names}, got {tuple(sorted(args))}"
            )
        if rest and self.variadic is None:
            raise TypeError(f"{self.name}.lua takes no variadic arguments")
        argv: list[Arg] = [args[name] for name in self.arg_names]
        if rest:
            argv += rest
        if not any(k.startswith("*") for k in self.key_names):
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


def _expand(text: str) -> str:
    return _INCLUDE_RE.sub(lambda m: _read(f"lib/{m.group(1)}.lua"), text)


def load(name: str) -> Script:
    text = _read(file_of(name))
    keys, args, variadic = parse_header(name, text)
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
    source = preamble + _expand(text)
    sha = hashlib.sha1(source.encode()).hexdigest()
    return Script(name, source, sha, keys, args, variadic)


FOLDERS = ("cron", "expire")  # lua/<folder>/<x>.lua is the script <folder>_<x>
NAMES = (
    "schedule",
    "claim",
    "ack",
    "retry",
    "bury",
    "release",
    "extend",
    "reap",
    "cancel",
    "reschedule",
    "replay",
    "purge",
    "get",
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
    "cron_sync",
    "seek",
    "reshard_mark",
    "move_tasks",
    "move_fields",
)


def load_all() -> dict[str, Script]:
    return {name: load(name) for name in NAMES}


SCRIPTS: dict[str, Script] = load_all()
