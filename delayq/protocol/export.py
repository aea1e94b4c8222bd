"""``delayq protocol export DIR``: the producer's scripts, exactly as delayq runs them, and a
manifest of their KEYS, ARGV and replies, for clients in other languages.

Each script is written as the text delayq loads (``scripts.py``: the KEYS/ARGV preamble,
then the file with its includes expanded), so its SHA-1 is the one the server computes on
``SCRIPT LOAD``, and an ``EVALSHA`` from another language shares the server's script cache
with delayq's own processes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from delayq.keys import DEFAULT_PREFIX, MAX_SHARDS, Key, QueueKeys
from delayq.protocol.version import PROTOCOL_VERSION
from delayq.scripts import SCRIPTS, Reply, Script

# What a producer runs (docs/protocol.md): the shard count and protocol check, scheduling
# (one task or many), cancel, reschedule, get, and the expiring keys' record.
PRODUCER_SCRIPTS = (
    "shards",
    "schedule",
    "cancel",
    "reschedule",
    "get",
    "expire_set",
    "expire_touch",
    "expire_delete",
)
MANIFEST = "manifest.json"


def file_name(script: Script) -> str:
    """The exported file of a script: ``<name>.lua`` (``expire_set.lua``), in one folder."""
    return f"{script.name}.lua"


def reply_layout(reply: Reply) -> dict[str, Any]:
    """A ``-- REPLY`` declaration as data: the one-value alternatives (``nil`` among them:
    Redis's nil) and, when one alternative is an array, its head fields, its rows (``per``
    names a row, ``row`` its fields) and its tail fields."""
    layout: dict[str, Any] = {"text": reply.text, "scalars": list(reply.scalars)}
    if reply.array:
        layout["array"] = {
            "head": list(reply.heads),
            "per": reply.per,
            "row": list(reply.row),
            "tail": list(reply.tails),
        }
    else:
        layout["array"] = None
    return layout


def key_suffixes() -> dict[str, str]:
    """Each key attribute a header may name -> the suffix after ``<prefix>:{<tag>}:``
    (the manifest lists those of the exported scripts, and the wake and finished channels)."""
    return {
        name: str(value.suffix) for name, value in vars(QueueKeys).items() if isinstance(value, Key)
    }


def manifest(names: tuple[str, ...] = PRODUCER_SCRIPTS) -> dict[str, Any]:
    """The manifest of the exported scripts: the protocol version, the key layout, and for
    each script its name, file, SHA-1, KEYS, ARGV (and the variadic tail's name) and reply."""
    suffixes = key_suffixes()
    used = {k for n in names for k in SCRIPTS[n].key_names} | {"wake_channel"}
    used |= {"finished_channel"}  # (protocol 1.1: cancel tells whoever waits, on it)
    return {
        "protocol": PROTOCOL_VERSION,
        "key_format": "<prefix>:{<tag>}:<suffix>",
        "default_prefix": DEFAULT_PREFIX,
        "max_shards": MAX_SHARDS,
        "keys": {k: suffixes[k] for k in sorted(used)},
        "scripts": [
            {
                "name": s.name,
                "file": file_name(s),
                "sha1": s.sha,
                "keys": list(s.key_names),
                "argv": list(s.arg_names),
                "variadic": s.variadic,
                "reply": reply_layout(s.reply),
            }
            for s in (SCRIPTS[n] for n in names)
        ],
    }


def export(directory: str | Path, names: tuple[str, ...] = PRODUCER_SCRIPTS) -> list[Path]:
    """Write each script (UTF-8, byte for byte what delayq loads) and ``manifest.json`` into
    ``directory`` (created if missing); files of earlier exports that are no longer
    exported are left alone. Returns the paths written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names:
        script = SCRIPTS[name]
        path = out / file_name(script)
        path.write_bytes(script.source.encode("utf-8"))
        written.append(path)
    path = out / MANIFEST
    path.write_text(json.dumps(manifest(names), indent=2) + "\n", encoding="utf-8")
    written.append(path)
    return written
