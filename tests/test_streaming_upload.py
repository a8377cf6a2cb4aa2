"""Uploads stream from the client to storage under a real ASGI server, and oversized bodies are refused early."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from django.conf import settings

from modelyard.streaming import StreamingASGIHandler
from registry.models import ModelVersion
from storage import get_storage
from tests.onnx_models import add_model_bytes

pytestmark = pytest.mark.django_db(transaction=True)
BOUNDARY = "modelyardtestboundary"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def server() -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(StreamingASGIHandler(), host="127.0.0.1", port=port, lifespan="off", log_level="warning")
    instance = uvicorn.Server(config)
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not instance.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield port
    instance.should_exit = True
    thread.join(timeout=10)


def part(name: str, data: bytes) -> bytes:
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    )
    return head.encode() + data + b"\r\n"


def incoming_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob(".incoming-*")) if root.exists() else 0


def test_upload_reaches_storage_while_the_client_is_still_sending(server, owner, registered):
    extra = bytes(range(256)) * (6 * 4096)  # 6 MiB
    body = part("model.onnx", add_model_bytes()) + part("extra.bin", extra) + f"--{BOUNDARY}--\r\n".encode()
    split = len(body) - 2 * 1024 * 1024
    sock = socket.create_connection(("127.0.0.1", server))
    head = (
        f"POST /api/v1/models/{registered}/versions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {owner.token}\r\nContent-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body[:split])
    root = Path(settings.STORAGE.path)
    deadline = time.monotonic() + 20
    while incoming_bytes(root) < 1024 * 1024 and time.monotonic() < deadline:
        time.sleep(0.05)
    # Two MiB of the body have not been sent yet, and over one MiB of the extra file is already in storage.
    assert incoming_bytes(root) >= 1024 * 1024
    sock.sendall(body[split:])
    response = http.client.HTTPResponse(sock)
    response.begin()
    assert response.status == 201, response.read()
    sock.close()
    version = ModelVersion.objects.get()
    stored = version.files.get(name="extra.bin")
    with get_storage().open(stored.storage_key) as fh:
        assert fh.read() == extra


def test_upload_over_the_limit_is_refused_before_the_body_is_read(server, owner, registered, settings):
    settings.MAX_UPLOAD_BYTES = 1000
    connection = http.client.HTTPConnection("127.0.0.1", server, timeout=10)
    connection.putrequest("POST", f"/api/v1/models/{registered}/versions")
    connection.putheader("Authorization", f"Bearer {owner.token}")
    connection.putheader("Content-Type", f"multipart/form-data; boundary={BOUNDARY}")
    connection.putheader("Content-Length", str(50 * 1024**3))
    connection.endheaders()  # no body is ever sent
    response = connection.getresponse()
    assert response.status == 413
    assert b"larger than the limit of 1000 bytes" in response.read()


def test_other_request_bodies_are_capped(server, owner, settings):
    settings.MAX_REQUEST_BODY_BYTES = 2048
    connection = http.client.HTTPConnection("127.0.0.1", server, timeout=10)
    body = b'{"name": "x", "description": "' + b"a" * 5000 + b'"}'
    connection.request(
        "POST",
        "/api/v1/models",
        body=body,
        headers={"Authorization": f"Bearer {owner.token}", "Content-Type": "application/json"},
    )
    response = connection.getresponse()
    assert response.status == 413
    assert not ModelVersion.objects.exists()
