"""Fixtures for the inference tests: an admin, in-process runtimes, held session builds, an event loop for the /v2 app.

Nothing here is autouse: the batcher tests share the folder and need none of it. Helpers live in
``tests/support`` (``registry``, ``inference``, ``processes``, ``polling``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from registry.models import Role
from tests.support.inference import AsgiLoop, BuildGate
from tests.support.people import Person, make_person


@pytest.fixture
def admin(db: None) -> Person:
    return make_person("admin", Role.ADMIN)


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


@pytest.fixture
def asgi_loop() -> Iterator[AsgiLoop]:
    loop = AsgiLoop()
    yield loop
    loop.close()
