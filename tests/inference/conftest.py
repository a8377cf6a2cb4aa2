"""Fixtures for the inference tests: an admin, in-process runtimes, held session builds, an event loop for the /v2 app.

Nothing here is autouse: the batcher tests share the folder and need none of it. Helpers live in
``tests/support`` (``registry``, ``inference``, ``processes``, ``polling``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from registry.models import RegisteredModel, Role
from tests.support.inference import AsgiLoop, BuildGate
from tests.support.onnx_models import mlp_model
from tests.support.people import Person, make_person
from tests.support.polling import reconcile_until
from tests.support.processes import ServeProcess, subprocess_database_url
from tests.support.registry import create_model, promote
from tests.support.servers import inference_env


@pytest.fixture
def admin(db: None) -> Person:
    return make_person("admin", Role.ADMIN)


@pytest.fixture
def build_gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[BuildGate]:
    from inference import loader

    gate = BuildGate()
    monkeypatch.setattr(loader, "build_session", gate.wrap(loader.build_session))
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


@pytest.fixture
def asgi_loop() -> Iterator[AsgiLoop]:
    loop = AsgiLoop()
    yield loop
    loop.close()


@pytest.fixture
def served_mlp(owner: Person, approver: Person, make_runtime: Any, asgi_loop: AsgiLoop, settings: Any) -> Any:
    """(runtime, loaded): ``demo`` v1, :func:`mlp_model` (``x`` [N, 32] in, ``y`` [N, 8] out), uploaded and validated
    through the API and promoted, loaded by an in-process runtime that runs on ``asgi_loop``; /v2 is public."""
    settings.INFERENCE_PUBLIC = True
    create_model(owner)
    response = owner.upload("demo", [("model.onnx", mlp_model().SerializeToString())])
    assert response.status_code == 201, response.content
    RegisteredModel.objects.filter(name="demo").update(max_batch_size=4, max_queue_delay_us=0)
    promote(owner, approver, 1)
    runtime = make_runtime()
    loaded = reconcile_until(runtime, lambda: runtime.router.resolve("demo"), what="v1 never loaded")
    runtime.loop = asgi_loop.loop
    return runtime, loaded


# --- Real serve processes -------------------------------------------------------------------------------


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., ServeProcess]]:
    """Start serve processes on the test database and artifact folder; all are killed at the end."""
    started: list[ServeProcess] = []

    def start(
        name: str,
        *,
        role: str = "inference",
        storage: Path | None = None,
        database_url: str | None = None,
        args: tuple[str, ...] = (),
        wait: bool = True,
        extra_env: dict[str, str] | None = None,
    ) -> ServeProcess:
        env = inference_env(
            name,
            tmp_path / f"{name}-data",
            database_url or subprocess_database_url(),
            storage or Path(django_settings.STORAGE.path),
        )
        env.update(extra_env or {})
        server = ServeProcess(name, role, env, tmp_path / f"{name}.log", args=args)
        started.append(server)
        if wait:
            server.wait_ready()
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def run() -> Iterator[Callable[[Coroutine[Any, Any, Any]], Any]]:
    """Run coroutines on one event loop for the whole test (a batcher lives on the loop of its first request)."""
    loop = asyncio.new_event_loop()
    yield loop.run_until_complete

    async def cancel_all() -> None:
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    loop.run_until_complete(cancel_all())
    loop.close()
