"""``bench/serve.py``'s single client (``KeepAliveClient``) against a real HTTP/1.1 server on loopback.

The single-client goal is judged on its timings, so it must read every answer whole, keep one
connection, and refuse an answer it cannot delimit.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
serve = importlib.import_module("serve")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    connections: list[tuple[str, int]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.connections.append(self.client_address)
        answer = b"echo:" + body + b":" + self.headers.get("x-kind", "").encode() + b"." * 70_000
        if self.path == "/no-length":
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(answer)
            self.close_connection = True
            return
        self.send_response(201 if self.path == "/created" else 200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Handler.connections = []
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_posts_on_one_connection_and_reads_each_answer_whole(port):
    client = serve.KeepAliveClient(port, "/infer", b"abc", {"X-Kind": "json"})
    try:
        answers = [client.post() for _ in range(3)]
    finally:
        client.close()
    assert answers == [(200, b"echo:abc:json" + b"." * 70_000)] * 3  # larger than one read
    assert len(set(Handler.connections)) == 1


def test_the_status_is_the_servers(port):
    client = serve.KeepAliveClient(port, "/created", b"", {})
    try:
        assert client.post()[0] == 201
    finally:
        client.close()


def test_an_answer_without_content_length_is_refused(port):
    client = serve.KeepAliveClient(port, "/no-length", b"x", {})
    try:
        with pytest.raises(RuntimeError, match=r"^an answer without content-length$"):
            client.post()
    finally:
        client.close()
