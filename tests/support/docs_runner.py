"""Run the docs' Python blocks for tests/test_docs_blocks.py, in a child process of its own
(a block may configure logging, instrument the process or import its page's files).

``python -m tests.support.docs_runner BLOCKS.json RESULTS.json``: BLOCKS is a list of
``{"where", "prelude", "code", "file"}``; each block runs in a fresh namespace, after its
prelude, in the current directory (where its page's ``file:`` blocks are written first),
with the server at ``$DELAYQ_REDIS_URL`` flushed before it. RESULTS has ``failed``, the
traceback of each block that raised, and ``keys``, how many keys each block left on the
server (what it scheduled, set or configured there).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import types
from pathlib import Path

import redis


def main(blocks_path: str, results_path: str) -> None:
    blocks = json.loads(Path(blocks_path).read_text())
    server = redis.Redis.from_url(os.environ["DELAYQ_REDIS_URL"])
    sys.path.insert(0, os.getcwd())
    failed: dict[str, str] = {}
    keys: dict[str, int] = {}
    for block in blocks:
        if block["file"]:
            Path(block["file"]).write_text(block["code"])
    for block in blocks:
        server.flushall()
        # A module of its own, in sys.modules: what reads a class's string annotations (a
        # dataclass, get_type_hints) finds its names there, as in an imported module.
        module = sys.modules["__docs__"] = types.ModuleType("__docs__")
        namespace = module.__dict__
        try:
            exec(compile(block["prelude"], "<prelude>", "exec"), namespace)
            exec(compile(block["code"], block["where"], "exec"), namespace)
        except BaseException:  # a block that raises anything fails, and the rest still run
            failed[block["where"]] = traceback.format_exc()
        keys[block["where"]] = int(server.dbsize())
    server.close()
    Path(results_path).write_text(json.dumps({"failed": failed, "keys": keys}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
