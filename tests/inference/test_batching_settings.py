"""A model's batching settings, changed while it serves (``PATCH /api/v1/models/{m}``), reach its loaded version.

Before, the served version kept the settings it was loaded with until its next promotion; now the
next reconcile pass hands them to the version's batcher and to ``/config``, without reloading the
session and without losing what is queued.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from inference.dataplane import DataPlane
from inference.errors import Overloaded
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
