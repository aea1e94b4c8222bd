"""Listening sockets for delayq's own web servers (the dashboard, the HTTP API): bound
before serving, so the URL can be printed first and a port taken is a clear error."""

from __future__ import annotations

import socket


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host`` (port 0: any free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: a response goes out as two writes (its head, then
    # its body), and without it the body waits for the client's delayed ACK (~40 ms).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def base_url(sock: socket.socket) -> str:
    """``http://host:port`` of a bound socket (IPv6 hosts in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
