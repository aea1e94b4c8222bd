"""What delayq's HTTP protocol (delayq/web/protocol.py) costs a request beside uvicorn's own
httptools protocol: the same keep-alive POST fed to each through a fake transport, answered
by a trivial ASGI app, so the difference is the protocol's alone.

Counted in instructions (the machine's load does not change them), as two runs of different
lengths whose difference is N requests' worth:

    for w in uvicorn delayq; do for n in 500 2500; do
      valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python bench/http_protocol_cost.py $w $n 2>&1 | grep Collected
    done; done

(instructions a request = (Collected at 2500 - Collected at 500) / 2000). Timed instead:
``python bench/http_protocol_cost.py`` (9 interleaved rounds of 20,000 each).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from delayq.web.serve import Limits, protocol_class

BODY = b'{"kind":"order.close","payload":{"order":123456,"user":42},"delay":3600}'
REQUEST = (
    b"POST /v1/queues/q/tasks HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAuthorization: Bearer x\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY)
) + BODY


async def app(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    headers = [(b"content-length", b"2"), (b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": b"{}"})


class Transport:
    """Enough of an asyncio transport for a protocol; ``answered`` is set by each body."""

    def __init__(self) -> None:
        self.answered = asyncio.Event()
        self.closing = False

    def write(self, data: bytes) -> None:
        if data == b"{}":
            self.answered.set()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 5555)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def run(cls: type[Any], n: int) -> float:
    """Microseconds a request over ``n`` requests on one connection."""
    config = Config(app, http=cls, lifespan="off", limit_concurrency=1000, timeout_keep_alive=5)
    config.load()
    protocol = cls(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    protocol.connection_made(transport)
    start = time.perf_counter()
    for _ in range(n):
        transport.answered.clear()
        protocol.data_received(REQUEST)
        await transport.answered.wait()
        await asyncio.sleep(0)
    took = (time.perf_counter() - start) / n * 1e6
    protocol.connection_lost(None)
    return took


def classes() -> dict[str, type[Any]]:
    return {"uvicorn": HttpToolsProtocol, "delayq": protocol_class(Limits())}


async def timed() -> None:
    runs: dict[str, list[float]] = {name: [] for name in classes()}
    for cls in classes().values():
        await run(cls, 2000)  # warm up
    for _ in range(9):
        for name, cls in classes().items():
            runs[name].append(await run(cls, 20_000))
    for name, took in runs.items():
        print(
            f"{name}: median {statistics.median(took):.2f} us a request "
            f"(min {min(took):.2f}, max {max(took):.2f})"
        )


if __name__ == "__main__":
    if len(sys.argv) == 3:
        asyncio.run(run(classes()[sys.argv[1]], int(sys.argv[2])))
    else:
        asyncio.run(timed())
