"""Uploads stream from the client to storage under a real ASGI server, and oversized bodies are refused early."""

from __future__ import annotations

import http.client
import json
import logging
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
from tests.support.onnx_models import add_model_bytes
from tests.support.polling import eventually
from tests.support.processes import ServeProcess, base_env, subprocess_database_url
from tests.support.rawhttp import read_response, send_chunked, send_head

pytestmark = pytest.mark.django_db(transaction=True)
BOUNDARY = "modelyardtestboundary"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def server() -> Iterator[int]:
    port = free_port()
    # log_config=None: uvicorn's own errors reach the root logger, where caplog sees them.
    config = uvicorn.Config(
        StreamingASGIHandler(), host="127.0.0.1", port=port, lifespan="off", log_level="warning", log_config=None
    )
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


# --- bodies are bounded while they arrive, chunked or not ------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/v1/models", "/accounts/login/"])
def test_chunked_body_over_the_limit_is_refused_while_it_arrives_before_authentication(server, settings, path):
    settings.MAX_REQUEST_BODY_BYTES = 64 * 1024
    # 4 MiB offered in 16 KiB chunks and never ended: the server must answer without waiting for the rest.
    sock = send_chunked(server, path, {"Content-Type": "application/json"}, [b"a" * 16384] * 256, end=False)
    status, headers, body = read_response(sock)
    assert status == 413
    assert json.loads(body) == {"error": "the request body is larger than the limit of 65536 bytes", "detail": None}
    assert headers["connection"] == "close"


def test_chunked_json_body_under_the_limit_is_read(server, owner):
    body = json.dumps({"name": "chunky", "description": "sent in chunks"}).encode()
    sock = send_chunked(
        server,
        "/api/v1/models",
        {"Content-Type": "application/json", "Authorization": f"Bearer {owner.token}"},
        [body[:10], body[10:]],
        end=True,
    )
    status, _, response = read_response(sock)
    assert status == 201, response
    assert json.loads(response)["description"] == "sent in chunks"


def multipart(*files: tuple[str, bytes]) -> bytes:
    return b"".join(part(name, data) for name, data in files) + f"--{BOUNDARY}--\r\n".encode()


def test_chunked_multipart_upload_is_stored_whole(server, owner, registered):
    extra = bytes(range(256)) * 4096  # 1 MiB
    model = add_model_bytes()
    body = multipart(("model.onnx", model), ("extra.bin", extra))
    pieces = [body[i : i + 65536] for i in range(0, len(body), 65536)]
    headers = {"Authorization": f"Bearer {owner.token}", "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    status, _, response = read_response(
        send_chunked(server, f"/api/v1/models/{registered}/versions", headers, pieces, end=True)
    )
    assert status == 201, response
    version = ModelVersion.objects.get()
    stored = sorted(version.files.values_list("name", "size_bytes"))
    assert stored == [("extra.bin", len(extra)), ("model.onnx", len(model))]
    with get_storage().open(version.files.get(name="extra.bin").storage_key) as fh:
        assert fh.read() == extra


def test_chunked_upload_over_the_limit_is_refused_while_it_arrives(server, owner, registered, settings):
    settings.MAX_UPLOAD_BYTES = 256 * 1024
    body = multipart(("model.onnx", add_model_bytes()), ("extra.bin", b"x" * (8 * 1024 * 1024)))
    pieces = [body[i : i + 16384] for i in range(0, len(body), 16384)]
    headers = {"Authorization": f"Bearer {owner.token}", "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    status, headers, response = read_response(
        send_chunked(server, f"/api/v1/models/{registered}/versions", headers, pieces, end=False)
    )
    assert status == 413
    assert json.loads(response)["error"] == "the upload is larger than the limit of 262144 bytes"
    assert headers["connection"] == "close"
    assert not ModelVersion.objects.exists()
    assert incoming_bytes(Path(settings.STORAGE.path)) == 0


def upload_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("upload-")]


def test_stalled_upload_is_ended_and_frees_its_thread(server, owner, registered, settings):
    settings.BODY_IDLE_TIMEOUT_SECONDS = 0.5
    body = multipart(("model.onnx", add_model_bytes()), ("extra.bin", b"x" * (1024 * 1024)))
    headers = {
        "Authorization": f"Bearer {owner.token}",
        "Content-Type": f"multipart/form-data; boundary={BOUNDARY}",
        "Content-Length": str(len(body)),
    }
    sock = send_head(server, f"/api/v1/models/{registered}/versions", headers, body[: len(body) // 2])  # then nothing
    status, headers, response = read_response(sock)
    assert status == 408
    assert json.loads(response) == {
        "error": "no request body bytes arrived for 0.5 s (MODELYARD_BODY_IDLE_TIMEOUT_SECONDS)",
        "detail": {"seconds": 0.5},
    }
    assert headers["connection"] == "close"
    # The view returned (it sent the answer) and its storage writer stopped; nothing was kept.
    assert not ModelVersion.objects.exists()
    deadline = time.monotonic() + 10
    while upload_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert upload_threads() == []
    assert incoming_bytes(Path(settings.STORAGE.path)) == 0


def test_stalled_json_body_gets_408_before_django_runs(server, settings):
    settings.BODY_IDLE_TIMEOUT_SECONDS = 0.5
    sock = send_head(server, "/api/v1/models", {"Content-Length": "100"}, b"{")
    status, _, response = read_response(sock)
    assert status == 408
    assert json.loads(response) == {
        "error": "no request body bytes arrived for 0.5 s (MODELYARD_BODY_IDLE_TIMEOUT_SECONDS)",
        "detail": None,
    }


def wait_for_log(caplog: pytest.LogCaptureFixture, text: str) -> None:
    deadline = time.monotonic() + 20
    while not any(text in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("upload", [True, False], ids=["upload", "json"])
def test_client_that_disconnects_mid_body_is_one_info_line(server, owner, registered, caplog, upload):
    caplog.set_level(logging.INFO)
    if upload:
        path, body = f"/api/v1/models/{registered}/versions", multipart(("model.onnx", add_model_bytes()))
        content_type = f"multipart/form-data; boundary={BOUNDARY}"
    else:
        path, body, content_type = "/api/v1/models", b'{"name": "never-finished"}', "application/json"
    headers = {
        "Authorization": f"Bearer {owner.token}",
        "Content-Type": content_type,
        "Content-Length": str(len(body) + 1000),
    }
    sock = send_head(server, path, headers, body)
    time.sleep(0.3)  # let the server start reading; the assertions below do not depend on it
    sock.close()
    wait_for_log(caplog, "disconnected")
    deadline = time.monotonic() + 10
    while upload_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [r for r in caplog.records if r.name.startswith(("modelyard", "django", "uvicorn", "registry"))]
    assert [(r.levelname, r.getMessage()) for r in lines] == [
        ("INFO", f"{path}: the client disconnected after {len(body)} body bytes")
    ]
    assert not any(r.exc_info for r in caplog.records)
    assert not ModelVersion.objects.exists()
    assert upload_threads() == []


# --- a body that ends inside a file part ------------------------------------------------------------------

UNTERMINATED = {"error": "the multipart body ended inside a file part", "detail": None}


def unterminated(kind: str) -> tuple[bytes, str]:
    """A whole body (its Content-Length all sent) whose last file part never reaches a closing boundary."""
    if kind == "no closing boundary":
        return part("model.onnx", add_model_bytes()) + part("extra.bin", b"x" * 5000)[:-2], BOUNDARY
    # The body's own boundary is not the one announced: everything reads as one file part that never ends.
    return multipart(("model.onnx", add_model_bytes())), "anotherboundary"


def post_unterminated(port: int, token: str, model: str, kind: str) -> tuple[int, bytes]:
    body, boundary = unterminated(kind)
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": f"multipart/form-data; boundary={boundary}",
        "Content-Length": str(len(body)),
    }
    status, _, response = read_response(send_head(port, f"/api/v1/models/{model}/versions", headers, body))
    return status, response


@pytest.mark.parametrize("kind", ["no closing boundary", "another boundary"])
def test_a_body_that_ends_inside_a_file_part_is_400_and_leaves_nothing(server, owner, registered, settings, kind):
    status, response = post_unterminated(server, owner.token, registered, kind)
    assert status == 400
    assert json.loads(response) == UNTERMINATED
    assert not ModelVersion.objects.exists()
    eventually(lambda: upload_threads() == [], timeout=10, what=lambda: str(upload_threads()))
    assert incoming_bytes(Path(settings.STORAGE.path)) == 0
    assert list(get_storage().list("")) == []


def process_usage(pid: int) -> tuple[int, int, int]:
    """Threads, open descriptors and resident KiB of a process."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    return int(status["Threads"]), fds, int(status["VmRSS"].split()[0])


def test_many_bodies_that_end_inside_a_file_part_leave_a_real_servers_threads_and_descriptors_as_they_were(
    owner, registered, settings, tmp_path
):
    env = base_env(
        MODELYARD_DATABASE_URL=subprocess_database_url(),
        MODELYARD_STORAGE_URL=Path(settings.STORAGE.path).as_uri(),
        MODELYARD_DATA_DIR=str(tmp_path / "data"),
    )
    web = ServeProcess("web", "web", env, tmp_path / "web.log")
    try:
        web.wait_ready()
        pid = web.process.pid
        kinds = ["no closing boundary", "another boundary"]
        for i in range(10):  # the server's lazily made threads and connections exist from here on
            status, response = post_unterminated(web.port, owner.token, registered, kinds[i % 2])
            assert (status, json.loads(response)) == (400, UNTERMINATED), web.log()
        threads, fds, rss = eventually(lambda: process_usage(pid), what=web.log)
        for i in range(150):
            status, response = post_unterminated(web.port, owner.token, registered, kinds[i % 2])
            assert (status, json.loads(response)) == (400, UNTERMINATED), web.log()

        # Each such upload held a thread and two descriptors for good before: +150 threads, +300 descriptors.
        # What a healthy server adds meanwhile stays far below that: an executor thread made lazily, a
        # database connection per thread that first touches the database (CI saw +8 descriptors).
        def settled() -> bool:
            now = process_usage(pid)
            return now[0] <= threads + 8 and now[1] <= fds + 24

        eventually(settled, timeout=30, what=lambda: f"before {(threads, fds, rss)}, now {process_usage(pid)}")
        assert process_usage(pid)[2] - rss < 32 * 1024, (rss, process_usage(pid))  # KiB: no 150 buffers kept
        assert not ModelVersion.objects.exists()
        assert incoming_bytes(Path(settings.STORAGE.path)) == 0
        # And the server still takes an upload.
        body = multipart(("model.onnx", add_model_bytes()))
        headers = {
            "Authorization": f"Bearer {owner.token}",
            "Content-Type": f"multipart/form-data; boundary={BOUNDARY}",
            "Content-Length": str(len(body)),
        }
        status, _, response = read_response(send_head(web.port, f"/api/v1/models/{registered}/versions", headers, body))
        assert status == 201, response
    finally:
        web.kill()
