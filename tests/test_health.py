"""The web role's probes: ``/healthz`` (alive) and ``/readyz`` (database, storage and broker reachable).

The in-process tests call ``modelyard.asgi.application`` as uvicorn would; the database outage runs a
real ``modelyard serve --role web`` whose database URL points at a closed port.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from modelyard import health

# Imported at collection: its django.setup() configures logging again, which would detach the handler of
# a test's caplog if the first import came inside that test.
from modelyard.asgi import application
from modelyard.env import StorageConfig
from registry.models import AuditEvent
from storage import get_storage
from tests.support.polling import eventually
from tests.support.processes import ServeProcess, base_env
from tests.support.s3 import closed_port_url

REDIS_DB = os.environ.get("MODELYARD_TEST_REDIS_DB", "0")
ALL_UP = {"database": "ok", "storage": "ok", "broker": "ok"}


def call(path: str, *, method: str = "GET", host: str = "127.0.0.1:8000") -> tuple[int, dict[str, Any]]:
    """One request through the ASGI entry point, with ``host`` as its Host header."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", host.encode())],
        "client": ("10.0.0.9", 40000),
        "server": ("10.0.0.7", 8000),
    }
    asyncio.run(application(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body) if body else {}


@pytest.fixture(autouse=True)
def fresh_checks(monkeypatch: pytest.MonkeyPatch, _fresh_storage: None, settings: Any) -> Iterator[None]:
    """Each test gets its own check threads, so an attempt still hanging from another test is not reused.

    The test's artifact folder exists, as the embedded default's does from start-up.
    """
    monkeypatch.setattr(health, "readiness", health.Readiness(health.CHECKS))
    Path(settings.STORAGE.path).mkdir(parents=True)
    get_storage.cache_clear()
    yield
    get_storage.cache_clear()


@pytest.fixture
def broker(settings: Any) -> Any:
    settings.BROKER_URL = f"redis://127.0.0.1:6379/{REDIS_DB}"
    return settings


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- /healthz -------------------------------------------------------------------------------------------


def test_healthz_answers_alive_without_database_credentials_or_an_allowed_host(settings):
    # No db fixture: pytest-django refuses any query here, so the answer touches no database.
    settings.ALLOWED_HOSTS = ["modelyard.example.com"]
    assert call("/healthz", host="10.0.0.7:8000") == (200, {"status": "alive"})
    assert call("/healthz", method="HEAD", host="10.0.0.7:8000")[0] == 200


def test_probes_refuse_other_methods(settings):
    assert call("/healthz", method="POST") == (405, {"error": "method POST not allowed; use GET"})
    assert call("/readyz", method="DELETE") == (405, {"error": "method DELETE not allowed; use GET"})


def test_an_inference_process_leaves_probes_to_v2_health(settings):
    settings.ROLE = "inference"
    assert call("/readyz") == (404, {"error": "this process serves only /v2 (role inference)"})


# --- /readyz: all up ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_readyz_is_ready_with_database_folder_and_broker_up(broker):
    broker.ALLOWED_HOSTS = ["modelyard.example.com"]
    assert call("/readyz", host="10.0.0.7:8000") == (200, {"status": "ready", "checks": ALL_UP})


@pytest.mark.django_db
def test_readyz_is_ready_on_rabbitmq_and_s3(settings, s3_settings):
    settings.BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"
    # What is checked is that both answer, not how fast: a busy CI machine once kept moto past 2 s.
    settings.READY_TIMEOUT_SECONDS = 30.0
    assert call("/readyz") == (200, {"status": "ready", "checks": ALL_UP})


@pytest.mark.django_db
def test_readyz_without_a_broker_checks_database_and_storage(settings):
    settings.BROKER_URL = None  # the embedded default: tasks run in-process
    assert call("/readyz") == (200, {"status": "ready", "checks": ALL_UP})


@pytest.mark.django_db
def test_probes_are_neither_throttled_nor_audited(broker):
    broker.API_RATE_ANON = "2/min"
    events = AuditEvent.objects.count()
    for _ in range(6):
        assert call("/readyz")[0] == 200
        assert call("/healthz")[0] == 200
    assert AuditEvent.objects.count() == events


# --- /readyz: storage down ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_readyz_names_storage_when_the_folder_is_gone(broker):
    assert call("/readyz")[0] == 200
    Path(broker.STORAGE.path).rmdir()
    get_storage.cache_clear()
    assert call("/readyz") == (
        503,
        {"error": "not ready: storage down", "checks": {**ALL_UP, "storage": health.DOWN}},
    )


@pytest.mark.django_db
def test_readyz_names_storage_when_the_s3_server_stops_or_the_bucket_is_gone(broker, caplog):
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = boto3.session.Session().client(
            "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
        )
        client.create_bucket(Bucket="readyz")
        broker.STORAGE = StorageConfig(kind="s3", bucket="readyz", prefix="pfx")
        broker.S3_ENDPOINT_URL, broker.S3_REGION, broker.S3_ADDRESSING_STYLE = endpoint, "us-east-1", "path"
        broker.S3_MAX_ATTEMPTS = 1
        # The first check builds boto3's client, which on a loaded machine may take longer than the 2 s default.
        broker.READY_TIMEOUT_SECONDS = 30.0
        assert call("/readyz") == (200, {"status": "ready", "checks": ALL_UP})

        client.delete_bucket(Bucket="readyz")
        status, body = call("/readyz")
        assert (status, body["error"], body["checks"]["storage"]) == (503, "not ready: storage down", health.DOWN)
        assert "readyz: storage is unreachable: StorageUnavailable: bucket readyz does not exist" in caplog.text
    finally:
        server.stop()
    assert call("/readyz") == (503, {"error": "not ready: storage down", "checks": {**ALL_UP, "storage": health.DOWN}})


# --- /readyz: broker down -------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("scheme", ["redis://127.0.0.1:{port}/0", "amqp://guest:guest@127.0.0.1:{port}//"])
def test_readyz_names_the_broker_on_a_closed_port(settings, scheme, caplog):
    settings.BROKER_URL = scheme.format(port=closed_port())
    assert call("/readyz") == (503, {"error": "not ready: broker down", "checks": {**ALL_UP, "broker": health.DOWN}})
    # The reason is logged (once), not told to an unauthenticated caller.
    assert "readyz: broker is unreachable: OperationalError" in caplog.text
    assert "Connection refused" in caplog.text


@pytest.mark.django_db
def test_readyz_gives_up_on_a_silent_broker_after_its_timeout(settings):
    # The kernel completes the handshake for the listening socket; nothing ever answers.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        settings.BROKER_URL = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        settings.READY_TIMEOUT_SECONDS = 0.2
        status, body = call("/readyz")
    assert status == 503
    assert body == {
        "error": "not ready: broker down",
        "checks": {**ALL_UP, "broker": "no answer within 0.2 s (MODELYARD_READY_TIMEOUT_SECONDS)"},
    }


@pytest.mark.django_db
def test_several_dependencies_down_are_all_named(settings, tmp_path: Path):
    settings.BROKER_URL = f"redis://127.0.0.1:{closed_port()}/0"
    settings.STORAGE = StorageConfig(kind="file", path=str(tmp_path / "never-made"))
    status, body = call("/readyz")
    assert (status, body["error"]) == (503, "not ready: storage, broker down")


# --- /readyz: database down, in a real server -----------------------------------------------------------


def test_readyz_names_the_database_when_it_is_unreachable(tmp_path: Path, settings: Any):
    storage = Path(settings.STORAGE.path)  # made by fresh_checks
    env = base_env(
        MODELYARD_DATABASE_URL=f"postgres://postgres@127.0.0.1:{closed_port()}/modelyard?connect_timeout=1",
        MODELYARD_STORAGE_URL=storage.as_uri(),
        MODELYARD_DATA_DIR=str(tmp_path / "data"),
        MODELYARD_BROKER_URL=closed_port_url().replace("http://", "redis://") + "/0",
        MODELYARD_ALLOWED_HOSTS="modelyard.example.com",
    )
    server = ServeProcess("web-nodb", "web", env, tmp_path / "web.log")
    try:
        eventually(lambda: _status(server, "/healthz") == 200, timeout=60, what=server.log)
        status, body = server.request("GET", "/readyz")
        assert status == 503, body
        assert body == {
            "error": "not ready: database, broker down",
            "checks": {"database": health.DOWN, "storage": "ok", "broker": health.DOWN},
        }
        assert "readyz: database is unreachable: OperationalError" in server.log()
    finally:
        server.kill()


def _status(server: ServeProcess, path: str) -> int:
    try:
        return server.request("GET", path, timeout=5)[0]
    except OSError:
        return 0
