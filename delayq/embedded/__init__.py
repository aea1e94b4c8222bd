"""Private Redis-compatible servers: one process (``server.py``) or a local cluster
(``cluster.py``), for the demo, ``--embedded``, the tests and the benchmarks."""

from delayq.embedded.server import (
    BINARY_ENV,
    EmbeddedServer,
    bundled_binary,
    find_binary,
    free_port,
    server_version,
)

__all__ = [
    "BINARY_ENV",
    "EmbeddedServer",
    "bundled_binary",
    "find_binary",
    "free_port",
    "server_version",
]
