"""Helpers for the inference tests: versions with known outputs, promotions, polling, and real serve processes.

Every model here is ``y = x + bias`` (``tests.onnx_models.add_model``), so the bias a response carries says
which version answered. Nothing in this file is autouse: the batcher tests share the folder and need none of it.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import numpy as np
import pytest
from django.conf import settings as django_settings

from registry.models import FileRole, ModelFile, ModelVersion, Role, VersionStatus
from tests.conftest import Person, make_person
from tests.onnx_models import add_model_bytes
from tests.processes import kill_group

T = TypeVar("T")
MODEL = "demo"


# --- Polling ------------------------------------------------------------------------------------------


def eventually(
    condition: Callable[[], T], *, timeout: float = 20.0, interval: float = 0.02, what: Callable[[], str] | str = ""
) -> T:
    """Call ``condition`` until it returns something truthy, and return that; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = what() if callable(what) else what
            raise AssertionError(f"condition not met within {timeout} s: {detail}")
        time.sleep(interval)


def reconcile_until(runtime: Any, condition: Callable[[], T], *, timeout: float = 20.0, what: str = "") -> T:
    """Drive an in-process runtime pass by pass until ``condition`` holds."""

    def step() -> T:
        runtime.reconcile_once()
        return condition()

    return eventually(step, timeout=timeout, what=lambda: f"{what}; fleet row: {runtime.snapshot()}")


# --- Registry set-up ----------------------------------------------------------------------------------


@pytest.fixture
def admin(db: None) -> Person:
    return make_person("admin", Role.ADMIN)


def create_model(person: Person, name: str = MODEL) -> str:
    response = person.post("/api/v1/models", {"name": name})
    assert response.status_code == 201, response.content
    return name


def upload_versions(person: Person, biases: list[float], model: str = MODEL) -> list[ModelVersion]:
    """Upload ``y = x + bias`` once per bias; validation runs in-process, so each comes back ready."""
    versions = []
    for bias in biases:
        response = person.upload(model, [("model.onnx", add_model_bytes(bias=bias))])
        assert response.status_code == 201, response.content
        version = ModelVersion.objects.get(model__name=model, version=response.json()["version"])
        assert version.status == VersionStatus.READY, version.errors
        versions.append(version)
    return versions


def set_alias(person: Person, alias: str, version: int, *, model: str = MODEL, wait: float | None = None) -> Any:
    query = f"?wait={wait:g}" if wait is not None else ""
    return person.client.put(
        f"/api/v1/models/{model}/aliases/{alias}{query}",
        {"version": version, "reason": "test"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {person.token}",
    )


def promote(
    requester: Person, approver: Person, version: int, *, alias: str = "production", model: str = MODEL
) -> None:
    """Point a protected alias at ``version``: one person asks, another approves."""
    response = set_alias(requester, alias, version, model=model)
    assert response.status_code == 202, response.content
    approved = approver.post(f"/api/v1/promotions/{response.json()['id']}/approve", {"reason": "ok"})
    assert approved.status_code == 200, approved.content


def set_served(admin: Person, alias: str, served: bool, *, model: str = MODEL) -> None:
    response = admin.patch(f"/api/v1/models/{model}/aliases/{alias}", {"served": served})
    assert response.status_code == 200, response.content


def artifact_path(version: ModelVersion) -> Path:
    """Where the local storage keeps the version's .onnx file."""
    key = ModelFile.objects.get(version=version, role=FileRole.MODEL).storage_key
    return Path(django_settings.STORAGE.path, *key.split("/"))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sample(rows: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 4)).astype(np.float32)


# --- Load gates ---------------------------------------------------------------------------------------


class BuildGate:
    """Holds ONNX Runtime session builds of chosen bundles (by sha256) until :meth:`open` is called.

    It wraps the real ``build_session``: what is built is real, only when is decided by the test.
    """

    def __init__(self) -> None:
        self.held: set[str] = set()
        self.entered: list[str] = []
        self._open = threading.Event()

    def hold(self, sha256: str) -> None:
        self.held.add(sha256)

    def open(self) -> None:
        self._open.set()

    def waiting(self, sha256: str) -> bool:
        return sha256 in self.entered and not self._open.is_set()

    def wrap(self, real: Callable[[Path], Any]) -> Callable[[Path], Any]:
        def gated(path: Path) -> Any:
            sha = path.parent.name
            self.entered.append(sha)
            if sha in self.held:
                assert self._open.wait(60), "the build gate was never opened"
            return real(path)

        return gated


@pytest.fixture
def build_gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[BuildGate]:
    from inference import runtime

    gate = BuildGate()
    monkeypatch.setattr(runtime, "build_session", gate.wrap(runtime.build_session))
    yield gate
    gate.open()


# --- In-process runtimes ------------------------------------------------------------------------------


@pytest.fixture
def inference_settings(settings: Any, tmp_path: Path) -> Any:
    settings.CACHE_DIR = tmp_path / "cache"
    settings.CACHE_MAX_BYTES = 1024**3
    settings.FLEET_HEARTBEAT_SECONDS = 0.2
    settings.DRAIN_TIMEOUT_SECONDS = 120.0
    return settings


@pytest.fixture
def make_runtime(inference_settings: Any) -> Iterator[Callable[..., Any]]:
    """Build in-process runtimes (no threads started: tests drive ``reconcile_once``); stopped afterwards."""
    from inference.runtime import InferenceRuntime

    made: list[InferenceRuntime] = []

    def make(worker_id: str = "inproc-1") -> InferenceRuntime:
        runtime = InferenceRuntime(worker_id=worker_id)
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime.stop()


# --- Real processes -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def subprocess_database_url() -> str:
    """The URL of the database this test runs on (pytest-django's test database), for subprocesses."""
    database = django_settings.DATABASES["default"]
    assert database["ENGINE"] == "django.db.backends.postgresql", "these tests need the PostgreSQL test database"
    credentials = quote(str(database["USER"] or "postgres"))
    if database.get("PASSWORD"):
        credentials += ":" + quote(str(database["PASSWORD"]))
    host, port = database["HOST"] or "127.0.0.1", database["PORT"] or 5432
    return f"postgres://{credentials}@{host}:{port}/{database['NAME']}"


def base_env(**extra: str) -> dict[str, str]:
    """This process's environment without any MODELYARD_/DJANGO_ setting, plus ``extra``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("MODELYARD_", "DJANGO_"))}
    env.update(DJANGO_SETTINGS_MODULE="modelyard.settings", PYTHONUNBUFFERED="1", MODELYARD_LOG_LEVEL="INFO")
    env.update(extra)
    return env


class ServeProcess:
    """One ``modelyard serve`` process in a process group of its own, killed with the group at the end."""

    def __init__(
        self,
        name: str,
        role: str,
        env: dict[str, str],
        log_path: Path,
        *,
        args: tuple[str, ...] = (),
        host: str = "127.0.0.1",
        netns: str | None = None,
    ) -> None:
        self.name = name
        self.role = role
        self.host = host
        self.port = free_port()
        self.log_path = log_path
        argv = [sys.executable, "-m", "modelyard.cli", "serve", "--role", role, "--port", str(self.port)]
        argv += ["--host", host, "--log-level", "warning", *args]
        if netns:  # a host of its own (tests/inference/test_fleet_hosts.py)
            argv = ["ip", "netns", "exec", netns, *argv]
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def request(
        self, method: str, path: str, body: Any = None, *, token: str | None = None, timeout: float = 30
    ) -> tuple[int, Any]:
        """One HTTP request on a fresh connection; returns (status, JSON body or raw text)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            conn.request(method, path, None if body is None else json.dumps(body), headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, raw.decode(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")
            try:
                path = "/v2/health/ready" if self.role != "web" else "/api/v1/fleet"
                status, _ = self.request("GET", path, timeout=2)
            except OSError:
                return False
            return status in (200, 401, 403)

        eventually(ready, timeout=timeout, interval=0.1, what=lambda: f"{self.name} not ready:\n{self.log()}")

    def kill(self) -> None:
        kill_group(self.process)


def infer_body(x: np.ndarray, request_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.reshape(-1).tolist()}]
    }
    if request_id is not None:
        body["id"] = request_id
    return body


def answered_bias(x: np.ndarray, response: dict[str, Any], biases: tuple[float, ...] = (1.0, 2.0, 3.0)) -> float:
    """The one bias of ``biases`` for which every output value is exactly ``x + bias``; fails if there is none."""
    [output] = response["outputs"]
    assert output["name"] == "y" and output["shape"] == list(x.shape), response
    y = np.asarray(output["data"], dtype=np.float32).reshape(x.shape)
    matches = [bias for bias in biases if np.array_equal(y, x + np.float32(bias))]
    assert len(matches) == 1, f"the outputs are not wholly one version's: x={x.tolist()} response={response}"
    return matches[0]


# --- The /v2 app in this process ----------------------------------------------------------------------


class AsgiLoop:
    """An event loop in a thread of its own, as uvicorn runs it, for driving the /v2 Starlette app directly."""

    def __init__(self) -> None:
        import asyncio

        self._asyncio = asyncio
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-asgi-loop", daemon=True)
        self._thread.start()

    def request(self, app: Any, method: str, path: str, body: Any = None, *, token: str = "") -> tuple[int, Any]:
        raw = b"" if body is None else json.dumps(body).encode()
        future = self._asyncio.run_coroutine_threadsafe(self._call(app, method, path, raw, token), self.loop)
        status, payload = future.result(timeout=30)
        try:
            return status, json.loads(payload)
        except ValueError:
            return status, payload

    async def _call(self, app: Any, method: str, path: str, body: bytes, token: str) -> tuple[int, bytes]:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if token:
            headers.append((b"authorization", f"Bearer {token}".encode()))
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
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 80),
        }
        delivered = False
        finished = self._asyncio.Event()
        status = 0
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await finished.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        try:
            await app(scope, receive, send)
        finally:
            finished.set()
        return status, b"".join(chunks)

    def close(self) -> None:
        """Cancel what still runs on the loop (a batcher's task, say), then stop and close it."""

        async def cancel_all() -> None:
            current = self._asyncio.current_task()
            tasks = [task for task in self._asyncio.all_tasks() if task is not current]
            for task in tasks:
                task.cancel()
            await self._asyncio.gather(*tasks, return_exceptions=True)

        self._asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def asgi_loop() -> Iterator[AsgiLoop]:
    loop = AsgiLoop()
    yield loop
    loop.close()
