"""Raw HTTP/1.1 over a socket, for what http.client cannot do: chunked bodies that stop, stall or never end."""

from __future__ import annotations

import http.client
import select
import socket


def chunk(data: bytes) -> bytes:
    """One chunk of a ``Transfer-Encoding: chunked`` body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def send_chunked(
    port: int, path: str, headers: dict[str, str], chunks: list[bytes], *, end: bool, method: str = "POST"
) -> socket.socket:
    """Send a chunked body one chunk at a time, stopping early once the server has answered.

    With ``end=False`` the closing empty chunk is never sent, so a server that waits for the whole
    body never answers.
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    sock.sendall(head.encode() + b"\r\n")
    for data in chunks:
        readable, _, _ = select.select([sock], [], [], 0.01)
        if readable:
            break  # the server answered before the body ended
        try:
            sock.sendall(chunk(data))
        except (BrokenPipeError, ConnectionResetError):
            break
    else:
        if end:
            sock.sendall(b"0\r\n\r\n")
    return sock


def send_head(port: int, path: str, headers: dict[str, str], body: bytes, *, method: str = "POST") -> socket.socket:
    """Send the request head and ``body``, which may be only the start of what Content-Length announces."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    sock.sendall(head.encode() + b"\r\n" + body)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, lower-cased headers and body of the answer; closes the socket."""
    try:
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        sock.close()
