"""A small TCP proxy for fault tests: forwards 127.0.0.1:<port> to a server, and can add
latency, reset every connection, refuse new ones or black-hole traffic on demand (no Docker,
netem or toxiproxy here)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading

from delayq.embedded import free_port


class FaultProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.blackhole = False  # accept and hold, forward nothing
        self.latency = 0.0  # seconds added before each chunk is forwarded, both directions
        self.refuse = False  # close new connections at once, as a server that is down
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        assert self._ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", self.port)
        )
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            for w in list(self._writers):
                w.close()
            self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refuse:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ConnectionError):
            while data := await reader.read(65536):
                if self.blackhole:
                    continue
                if self.latency:
                    await asyncio.sleep(self.latency)
                writer.write(data)
                await writer.drain()
        self._writers.discard(writer)
        writer.close()

    def reset_all(self) -> int:
        """Send a TCP reset on every open connection (both sides), as a dropped link would."""

        def reset() -> int:
            n = 0
            for w in list(self._writers):
                sock = w.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                w.close()
                n += 1
            self._writers.clear()
            return n

        done = threading.Event()
        result: list[int] = []

        def on_loop() -> None:
            result.append(reset())
            done.set()

        self._loop.call_soon_threadsafe(on_loop)
        assert done.wait(5)
        return result[0]
