"""The real /v2 data plane on a loopback port, serving models registered through the real services.

One server serves the whole package: models are uploaded to storage, validated in-process,
promoted to ``production`` by a maintainer and approved by an approver (and one served
``canary`` alias is made by an admin), loaded by an :class:`InferenceRuntime` and served by
uvicorn in a background thread. The database is flushed afterwards, as a transactional test
would leave it.
"""

from __future__ import annotations

import gc
import http.client
import io
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort
import pytest
import uvicorn
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from inference.app import build_app
from inference.runtime import InferenceRuntime, LoadedVersion
from modelyard.env import StorageConfig
from registry import promotions, services
from registry.audit import Actor
from registry.models import RegisteredModel, Role, VersionStatus
from registry.work import upload_key_prefix
from storage import get_storage
from tests.compat import onnx_compat

HOST = "127.0.0.1"


@dataclass(frozen=True)
class ServedModel:
    """A model the fixture registers: its versions in upload order, where its aliases point, its settings."""

    name: str
    versions: list[onnx.ModelProto]
    production: int = 1
    served_aliases: dict[str, int] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)


MODELS = [
    ServedModel("dtypes", [onnx_compat.all_datatypes_model()]),
    ServedModel("multi", [onnx_compat.multi_io_dynamic_model()]),
    ServedModel("fixed", [onnx_compat.fixed_shape_model()]),
    ServedModel("adder", [onnx_compat.add_model(1.0), onnx_compat.add_model(2.0)], served_aliases={"canary": 2}),
    # A long queue delay makes merging of concurrent requests certain rather than likely.
    ServedModel("batchy", [onnx_compat.add_model(0.5)], settings={"max_queue_delay_us": 50_000, "max_batch_size": 64}),
    ServedModel("gated", [onnx_compat.add_model(3.0)], settings={"max_queue_size": 1}),
    # Every input has a fixed shape: its body limit is what those inputs can need, not the global one.
    ServedModel("pinned", [onnx_compat.add_model(1.0, rows=2)]),
]


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class V2Server:
    """The running server, the runtime behind it, and what was registered."""

    port: int
    runtime: InferenceRuntime
    model_bytes: dict[tuple[str, int], bytes]
    inference_token: str
    viewer_token: str
    _sessions: dict[tuple[str, int], ort.InferenceSession] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """What tritonclient takes: host:port, no scheme."""
        return f"{HOST}:{self.port}"

    def reference(self, model: str, version: int = 1) -> ort.InferenceSession:
        """ONNX Runtime on the very bytes that were uploaded, to compare the server with."""
        key = (model, version)
        if key not in self._sessions:
            self._sessions[key] = ort.InferenceSession(self.model_bytes[key], providers=["CPUExecutionProvider"])
        return self._sessions[key]

    def expected(self, model: str, feeds: dict[str, Any], version: int = 1) -> dict[str, Any]:
        """Every output of the model, by name, from ONNX Runtime run directly."""
        session = self.reference(model, version)
        names = [output.name for output in session.get_outputs()]
        return dict(zip(names, session.run(names, feeds), strict=True))

    def loaded(self, model: str, ref: str | None = None) -> LoadedVersion:
        found = self.runtime.router.resolve(model, ref)
        assert found is not None, f"{model} {ref} is not loaded"
        return found

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> Response:
        """One raw HTTP request on a fresh connection (nothing added that the caller did not ask for)."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return Response(
                status=response.status, headers={k.lower(): v for k, v in response.getheaders()}, body=response.read()
            )
        finally:
            conn.close()

    def metrics(self) -> str:
        response = self.request("GET", "/metrics", headers={"Authorization": f"Bearer {self.inference_token}"})
        assert response.status == 200
        return response.body.decode()


def _register(served: ServedModel, *, owner: Actor, approver: Actor, admin: Actor) -> dict[tuple[str, int], bytes]:
    model = services.model_create(name=served.name, description="compat test model", actor=owner)
    if served.settings:
        model = services.model_update(model=model, actor=admin, **served.settings)
    stored: dict[tuple[str, int], bytes] = {}
    storage = get_storage()
    for proto in served.versions:
        data = proto.SerializeToString()
        key = f"{upload_key_prefix(model.name, uuid.uuid4().hex)}/model.onnx"
        written = storage.write(key, io.BytesIO(data))
        file = services.StoredFile(
            name="model.onnx", storage_key=written.key, sha256=written.sha256, size_bytes=len(data)
        )
        version = services.version_create(model=model, files=[file], actor=owner)  # validated in-process on commit
        version.refresh_from_db()
        assert version.status == VersionStatus.READY, version.errors
        stored[(model.name, version.version)] = data
    outcome = promotions.alias_set(
        model=model, alias_name=promotions.PRODUCTION, version_number=served.production, actor=owner, reason="compat"
    )
    assert outcome.promotion is not None  # production is protected: a second person approves
    promotions.promotion_approve(promotion_id=outcome.promotion.pk, actor=approver, reason="looks good")
    for alias, number in served.served_aliases.items():
        promotions.alias_update_flags(model=model, alias_name=alias, actor=admin, served=True)
        promotions.alias_set(model=model, alias_name=alias, version_number=number, actor=owner)
    return stored


def _actor(username: str, *roles: str) -> tuple[Actor, str]:
    token, raw = services.token_create(username=username, create_user=True, roles=list(roles))
    return Actor(user=token.user, label=username), raw


def _wait_loaded(runtime: InferenceRuntime, expected: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runtime.reconcile_once()
        if runtime.status.failures:
            raise AssertionError(f"loading failed: {runtime.status.failures}")
        if len(runtime.loaded) == expected and not runtime.status.loading:
            return
        time.sleep(0.05)
    raise AssertionError(f"only {len(runtime.loaded)} of {expected} versions loaded in {timeout}s")


def _terminate_stray_backends() -> None:
    """Close PostgreSQL sessions that server threads opened (token checks run in worker threads).

    The test database cannot be flushed or dropped while they stay open. Only sessions of this
    test database, other than our own, are ended.
    """
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(scope="package")
def compat_database(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """The test database, even when no test of this run is marked ``django_db`` (pytest-django then skips it).

    These tests reach the database only through the server and the fixture, never inside a test's
    transaction, so they are not marked; the fixture flushes what it wrote.
    """
    from django.test.utils import setup_databases, teardown_databases

    if connection.settings_dict["NAME"] == connection.creation._get_test_db_name():
        yield  # pytest-django already made it for the other tests of this run
        return
    with django_db_blocker.unblock():
        created = setup_databases(verbosity=0, interactive=False, aliases={"default"})
    yield
    with django_db_blocker.unblock():
        _terminate_stray_backends()
        teardown_databases(created, verbosity=0)


@pytest.fixture(scope="package")
def v2(compat_database: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[V2Server]:
    root: Path = tmp_path_factory.mktemp("compat")
    overrides = override_settings(
        STORAGE=StorageConfig(kind="file", path=str(root / "artifacts")),
        VALIDATION_WORK_DIR=str(root / "work"),
        CACHE_DIR=root / "cache",
        INFERENCE_PUBLIC=True,
    )
    with django_db_blocker.unblock(), overrides:
        get_storage.cache_clear()
        runtime: InferenceRuntime | None = None
        server: uvicorn.Server | None = None
        thread: threading.Thread | None = None
        try:
            owner, _ = _actor("compat-owner", Role.MAINTAINER)
            approver, _ = _actor("compat-approver", Role.APPROVER)
            admin, _ = _actor("compat-admin", Role.ADMIN)
            _, inference_token = _actor("compat-client", Role.INFERENCE)
            _, viewer_token = _actor("compat-viewer", Role.VIEWER)
            model_bytes: dict[tuple[str, int], bytes] = {}
            for served in MODELS:
                model_bytes |= _register(served, owner=owner, approver=approver, admin=admin)
            assert RegisteredModel.objects.count() == len(MODELS)

            runtime = InferenceRuntime(worker_id="compat-tests")
            _wait_loaded(runtime, expected=len(model_bytes))

            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((HOST, 0))
            port = sock.getsockname()[1]
            config = uvicorn.Config(build_app(runtime), host=HOST, port=port, log_level="warning", lifespan="off")
            server = uvicorn.Server(config)
            thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="v2-server", daemon=True)
            thread.start()
            deadline = time.monotonic() + 30
            while not server.started:
                assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
                time.sleep(0.02)
            yield V2Server(
                port=port,
                runtime=runtime,
                model_bytes=model_bytes,
                inference_token=inference_token,
                viewer_token=viewer_token,
            )
        finally:
            if runtime is not None:
                runtime.stop()  # while the server's loop still runs: unloading retires its batchers there
            if server is not None:
                server.should_exit = True
            if thread is not None:
                thread.join(timeout=30)
            gc.collect()  # finished worker threads leave their connections to the collector
            _terminate_stray_backends()
            call_command("flush", interactive=False, verbosity=0)
            get_storage.cache_clear()
