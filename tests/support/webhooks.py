"""A webhook receiver for tests: a real HTTP server on 127.0.0.1 in a thread that checks each delivery's signature."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    """One request as the receiver saw it."""

    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    def signature_ok(self, secret: str, *, tolerance: float = 300) -> bool:
        """Check ``Modelyard-Signature: t=...,v1=...`` as a receiver should: the HMAC, and a recent timestamp."""
        header = self.headers.get("modelyard-signature", "")
        fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
        if "t" not in fields or "v1" not in fields:
            return False
        expected = hmac.new(secret.encode(), fields["t"].encode() + b"." + self.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, fields["v1"]) and abs(time.time() - int(fields["t"])) <= tolerance


@dataclass
class Receiver:
    """Records every request; answers each with the next planned status (200 when none is left)."""

    url: str
    received: list[Received] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    hold: threading.Event | None = None  # when set up, each answer waits until the test sets it
    drip_seconds: float = 0.0  # answer one byte of the status line at a time, this far apart

    def events(self) -> list[str]:
        return [request.json["event"] for request in self.received]


@contextmanager
def webhook_receiver() -> Iterator[Receiver]:
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            receiver.received.append(
                Received(path=self.path, headers={k.lower(): v for k, v in self.headers.items()}, body=body)
            )
            if receiver.hold is not None:
                receiver.hold.wait(30)
            status = receiver.statuses.pop(0) if receiver.statuses else 200
            if receiver.drip_seconds:
                try:
                    for byte in f"HTTP/1.1 {status} OK\r\n".encode():
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(receiver.drip_seconds)
                except OSError:
                    pass  # the sender gave up, as it should
                return
            answer = b"boom" if status >= 500 else b"ok"
            self.send_response(status)
            for name, value in receiver.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}/hooks/modelyard")
    thread = threading.Thread(target=server.serve_forever, name="webhook-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        if receiver.hold is not None:
            receiver.hold.set()
        server.shutdown()
        server.server_close()
