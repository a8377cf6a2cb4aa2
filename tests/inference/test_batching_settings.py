"""A model's batching settings, changed while it serves (``PATCH /api/v1/models/{m}``), reach its loaded version.

Before, the served version kept the settings it was loaded with until its next promotion; now the
next reconcile pass hands them to the version's batcher and to ``/config``, without reloading the
session and without losing what is queued.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from django.contrib.auth import get_user_model

from inference.dataplane import DataPlane
from inference.errors import Overloaded
from tests.support.onnx_models import first_dim_model
from tests.support.polling import reconcile_until
from tests.support.registry import create_model, promote, upload_versions

pytestmark = pytest.mark.django_db(transaction=True)


def test_new_batching_settings_reach_the_loaded_version_on_the_next_pass_without_a_reload(
    owner, approver, admin, make_runtime
):
    create_model(owner)
    upload_versions(owner, [1.0])
    promote(owner, approver, 1)
    runtime = make_runtime()
    loaded = reconcile_until(runtime, lambda: runtime.router.resolve("demo"), what="demo never served")
    session, batcher = loaded.session, loaded.batcher
    assert (batcher.max_batch_size, batcher.max_delay, batcher.max_queue_size) == (32, 0.0, 1024)

    response = admin.patch(
        "/api/v1/models/demo", {"max_batch_size": 4, "max_queue_delay_us": 2500, "max_queue_size": 3}
    )
    assert response.status_code == 200, response.content
    runtime.reconcile_once()

    assert runtime.router.resolve("demo") is loaded and loaded.session is session  # the same session: no reload
    assert loaded.batcher is batcher
    assert (batcher.max_batch_size, batcher.max_delay, batcher.max_queue_size) == (4, 0.0025, 3)
    config = DataPlane(runtime).model_config("demo")
    assert config["max_batch_size"] == 4
    assert config["dynamic_batching"] == {
        "max_queue_delay_microseconds": 2500,
        "default_queue_policy": {"max_queue_size": 3},
    }

    async def fill() -> str:
        # No await between the submits: the batcher's task has not taken any of them yet.
        futures = [batcher.submit({"x": np.ones((1, 4), np.float32)}) for _ in range(3)]
        try:
            batcher.submit({"x": np.ones((1, 4), np.float32)})
        except Overloaded as exc:
            refused = str(exc)
        else:
            refused = ""
        outputs = await asyncio.gather(*futures)
        assert all(np.array_equal(out["y"], np.full((1, 4), 2.0, np.float32)) for out in outputs)
        return refused

    assert asyncio.run(fill()) == "the queue is full (3 requests)"


def _run_together(loop, batcher, feeds: list[dict]) -> list[dict]:
    """Submit every request before the batcher's task takes one, as concurrent clients would, on the one loop."""

    async def run() -> list[dict]:
        return await asyncio.gather(*(batcher.submit(f) for f in feeds))

    return asyncio.run_coroutine_threadsafe(run(), loop.loop).result(timeout=60)


def test_batching_turned_off_and_on_reaches_the_loaded_version_without_a_reload(
    owner, approver, admin, make_runtime, asgi_loop
):
    create_model(owner)
    upload_versions(owner, [1.0])
    promote(owner, approver, 1)
    assert admin.patch("/api/v1/models/demo", {"max_queue_delay_us": 200_000}).status_code == 200
    runtime = make_runtime()
    loaded = reconcile_until(runtime, lambda: runtime.router.resolve("demo"), what="demo never served")
    session, batcher = loaded.session, loaded.batcher
    assert (loaded.batching, batcher.batching) == (True, True)
    requests = [{"x": np.full((1, 4), float(i), np.float32)} for i in range(3)]

    assert admin.patch("/api/v1/models/demo", {"batching": "off"}).status_code == 200
    runtime.reconcile_once()
    assert runtime.router.resolve("demo") is loaded and loaded.session is session and loaded.batcher is batcher
    assert (loaded.batching, batcher.batching) == (False, False)
    config = DataPlane(runtime).model_config("demo")
    assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 4]}]
    [row] = runtime.snapshot()
    assert (row.batching, row.batching_reason) == (False, "the model's batching is off")
    before = loaded.stats.execution_count
    outputs = _run_together(asgi_loop, batcher, requests)
    assert [out["y"].tolist() for out in outputs] == [[[i + 1.0] * 4] for i in range(3)]
    assert loaded.stats.execution_count - before == 3  # one run per request

    assert admin.patch("/api/v1/models/demo", {"batching": "auto"}).status_code == 200
    runtime.reconcile_once()
    assert (loaded.batching, batcher.batching) == (True, True)
    assert DataPlane(runtime).model_config("demo")["max_batch_size"] == 32
    before = loaded.stats.execution_count
    outputs = _run_together(asgi_loop, batcher, requests)
    assert [out["y"].tolist() for out in outputs] == [[[i + 1.0] * 4] for i in range(3)]
    assert loaded.stats.execution_count - before == 1  # the three merged into one run


def test_a_version_that_must_not_batch_is_loaded_without_merging_and_the_fleet_says_why(owner, approver, make_runtime):
    create_model(owner)
    response = owner.upload("demo", [("model.onnx", first_dim_model("softmax0").SerializeToString())])
    assert response.status_code == 201
    promote(owner, approver, 1)
    runtime = make_runtime()
    loaded = reconcile_until(runtime, lambda: runtime.router.resolve("demo"), what="demo never served")
    assert (loaded.batching, loaded.batcher.batching) == (False, False)
    runtime.heartbeat()
    [worker] = owner.get("/api/v1/fleet").json()
    [row] = worker["loaded"]
    assert row["batching"] is False
    assert row["batching_reason"].startswith("output 'y' of two synthetic samples run together differs")
    owner.client.force_login(get_user_model().objects.get(username=owner.username))
    page = owner.client.get("/ui/fleet").content.decode()
    assert 'data-batching="off">one request per run<span class="muted">: output' in page
