"""``instances``: how many batches of one version run at once, on its shared ONNX Runtime session or,
on the CPU, on lanes: one narrower session per instance, with the version's own session kept for a
lone batch.

The runs are held inside ``run()`` until a second one arrives (or a short wait passes), so whether
two batches overlap is counted, not timed: with two instances they meet, with one they never do.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest
from django.contrib.auth import get_user_model

from inference.batcher import Batcher
from inference.dataplane import DataPlane
from inference.sessions import build_cpu_lanes, lane_threads, usable_cores
from registry.models import RegisteredModel
from tests.support.onnx_models import add_model_bytes
from tests.support.polling import reconcile_until
from tests.support.registry import create_model, promote, upload_versions


class Overlap:
    """Counts ``run()`` calls in flight; each waits (up to ``wait`` seconds) for a second one to join it."""

    def __init__(self, wait: float) -> None:
        self.wait = wait
        self.now = 0
        self.most = 0
        self.calls = 0
        self._cond = threading.Condition()

    def enter(self) -> None:
        with self._cond:
            self.now += 1
            self.calls += 1
            self.most = max(self.most, self.now)
            self._cond.notify_all()
            self._cond.wait_for(lambda: self.now >= 2, timeout=self.wait)

    def leave(self) -> None:
        with self._cond:
            self.now -= 1

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.enter()
        try:
            return {"y": feeds["x"] * 2}
        finally:
            self.leave()


def serve_six(overlap: Overlap, instances: int) -> list[dict[str, np.ndarray]]:
    async def main() -> list[dict[str, np.ndarray]]:
        batcher = Batcher(
            overlap.run, batching=False, max_batch_size=1, max_queue_delay_us=0, max_queue_size=100, instances=instances
        )
        futures = [batcher.submit({"x": np.full((1, 2), i, np.float32)}) for i in range(6)]
        results = await asyncio.gather(*futures)
        batcher.close()
        return results

    return asyncio.run(main())


def test_two_instances_run_two_batches_at_once_and_never_three():
    overlap = Overlap(wait=5)
    results = serve_six(overlap, instances=2)
    assert overlap.most == 2
    assert overlap.calls == 6
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result["y"], np.full((1, 2), 2 * i, np.float32))


def test_one_instance_never_runs_two_batches_at_once():
    overlap = Overlap(wait=0.05)  # each run waits this long for a partner that must never come
    results = serve_six(overlap, instances=1)
    assert (overlap.most, overlap.calls) == (1, 6)
    assert [r["y"][0, 0] for r in results] == [0, 2, 4, 6, 8, 10]


def test_fewer_instances_take_effect_as_batches_finish():
    overlap = Overlap(wait=0.05)

    async def main() -> None:
        batcher = Batcher(
            overlap.run, batching=False, max_batch_size=1, max_queue_delay_us=0, max_queue_size=100, instances=4
        )
        batcher.configure(max_batch_size=1, max_queue_delay_us=0, max_queue_size=100, instances=1)
        await asyncio.gather(*[batcher.submit({"x": np.zeros((1, 2), np.float32)}) for _ in range(4)])
        batcher.close()

    asyncio.run(main())
    assert (overlap.most, overlap.calls) == (1, 4)


class Lanes:
    """A wide run and one run per lane, each recording where it ran; the lanes wait for a partner like
    :class:`Overlap`, and the wide run checks that nothing else is in flight while it runs."""

    def __init__(self, count: int, wait: float) -> None:
        self.lanes = Overlap(wait)
        self.ran: list[str] = []
        self.wide_beside_other = 0
        self._wide_now = 0
        self.runs = [self._lane(i) for i in range(count)]

    def _lane(self, index: int) -> Any:
        def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            self.ran.append(f"lane{index}")
            if self._wide_now:
                self.wide_beside_other += 1
            return self.lanes.run(feeds)

        return run

    def wide(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.ran.append("wide")
        if self.lanes.now:
            self.wide_beside_other += 1
        self._wide_now += 1
        try:
            return {"y": feeds["x"] * 2}
        finally:
            self._wide_now -= 1


def test_lone_requests_run_on_the_wide_session_and_a_busy_queue_on_the_lanes_side_by_side():
    lanes = Lanes(2, wait=1)

    async def main() -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
        batcher = Batcher(
            lanes.wide,
            batching=False,
            max_batch_size=1,
            max_queue_delay_us=0,
            max_queue_size=100,
            instances=2,
            lanes=lanes.runs,
        )
        one_by_one = [await batcher.submit({"x": np.full((1, 2), i, np.float32)}) for i in range(3)]
        at_once = await asyncio.gather(*[batcher.submit({"x": np.full((1, 2), i, np.float32)}) for i in range(6)])
        batcher.close()
        return one_by_one, at_once

    one_by_one, at_once = asyncio.run(main())
    # One at a time: each finds nothing in flight and nothing waiting, so it runs on the session with every core.
    assert lanes.ran[:3] == ["wide"] * 3
    # Six at once: the first starts alone on the wide session and the rest queue behind it; then two lanes run
    # side by side (held until both are in), and the wide session never runs beside a lane.
    assert lanes.ran[3:6] == ["wide", "lane0", "lane1"]
    assert lanes.lanes.most == 2 and lanes.wide_beside_other == 0
    for i, result in enumerate(one_by_one + at_once):
        np.testing.assert_array_equal(result["y"], np.full((1, 2), 2 * (i if i < 3 else i - 3), np.float32))


def test_a_lone_request_starts_its_run_without_waiting_for_the_loop():
    started = threading.Event()

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        started.set()
        return {"y": feeds["x"]}

    async def main() -> tuple[bool, int]:
        batcher = Batcher(run, batching=True, max_batch_size=8, max_queue_delay_us=0, max_queue_size=10)
        future = batcher.submit({"x": np.zeros((1, 2), np.float32)})
        # The loop is blocked here: only a run handed to the worker thread inside submit() can start.
        began = started.wait(timeout=5)
        queued = batcher.queued
        await future
        batcher.close()
        return began, queued

    assert asyncio.run(main()) == (True, 0)


def test_lanes_must_match_the_instances():
    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return feeds

    with pytest.raises(ValueError, match="1 lanes for 2 instances"):
        Batcher(run, batching=True, max_batch_size=8, max_queue_delay_us=0, max_queue_size=10, instances=2, lanes=[run])
    batcher = Batcher(
        run, batching=True, max_batch_size=8, max_queue_delay_us=0, max_queue_size=10, instances=2, lanes=[run, run]
    )
    with pytest.raises(ValueError, match="3 instances need 3 lanes; 2 are set"):
        batcher.configure(max_batch_size=8, max_queue_delay_us=0, max_queue_size=10, instances=3)
    batcher.configure(max_batch_size=8, max_queue_delay_us=0, max_queue_size=10, instances=1, lanes=[])
    assert (batcher.instances, batcher.lanes) == (1, ())


class HeldSession:
    """A real ORT session whose ``run()`` is counted by an :class:`Overlap` (ORT's run is thread-safe)."""

    def __init__(self, session: Any, overlap: Overlap) -> None:
        self._session = session
        self._overlap = overlap

    def run(self, output_names: Any, feeds: Any) -> Any:
        self._overlap.enter()
        try:
            return self._session.run(output_names, feeds)
        finally:
            self._overlap.leave()


async def infer_concurrently(loaded: Any, count: int) -> list[dict[str, np.ndarray]]:
    # With max_batch_size 1 each request is its own batch.
    return await asyncio.gather(*[loaded.batcher.submit({"x": np.ones((1, 4), np.float32) * i}) for i in range(count)])


@pytest.mark.django_db(transaction=True)
def test_instances_by_provider_then_from_the_model_reach_the_version_the_fleet_and_config(
    owner, approver, admin, make_runtime, asgi_loop
):
    def infer(count: int) -> list[dict[str, np.ndarray]]:
        # One loop for every request, as a server has: the batcher lives on the loop of its first request.
        return asyncio.run_coroutine_threadsafe(infer_concurrently(loaded, count), asgi_loop.loop).result(timeout=30)

    create_model(owner)
    upload_versions(owner, [1.0])
    promote(owner, approver, 1)
    runtime = make_runtime()
    loaded = reconcile_until(runtime, lambda: runtime.router.resolve("demo"), what="demo never served")
    assert loaded.provider == "CPUExecutionProvider"
    assert owner.get("/api/v1/models/demo").json()["instances"] is None  # unset: by provider
    assert loaded.instances == 1  # the CPU's default
    session = loaded.session
    assert admin.patch("/api/v1/models/demo", {"max_batch_size": 1}).status_code == 200
    runtime.reconcile_once()

    # One instance: the held runs never meet.
    one = Overlap(wait=0.05)
    loaded.session = HeldSession(session, one)
    infer(4)
    assert (one.most, one.calls) == (1, 4)

    response = admin.patch("/api/v1/models/demo", {"instances": 2})
    assert response.status_code == 200, response.content
    assert response.json()["instances"] == 2
    runtime.reconcile_once()
    assert runtime.router.resolve("demo") is loaded and loaded.instances == 2  # no reload

    # On the CPU, two instances are two lanes: sessions of their own, each with half the cores.
    lanes = list(loaded.lane_sessions)
    assert len(lanes) == 2 and session not in lanes
    threads = max(1, usable_cores() // 2)
    assert [lane.get_session_options().intra_op_num_threads for lane in lanes] == [threads, threads]
    # The first of four starts alone on the version's session; the rest queue behind it and then run on the
    # lanes, two side by side (each held until the other is in).
    two = Overlap(wait=1)
    loaded.lane_sessions = [HeldSession(lane, two) for lane in lanes]
    outputs = infer(4)
    assert two.most == 2 and two.calls in (2, 3)
    for i, out in enumerate(outputs):
        np.testing.assert_array_equal(out["y"], session.run(["y"], {"x": np.ones((1, 4), np.float32) * i})[0])
    loaded.lane_sessions = lanes

    # Three instances: three new lanes, built before the batcher takes them.
    assert admin.patch("/api/v1/models/demo", {"instances": 3}).status_code == 200
    runtime.reconcile_once()
    assert loaded.instances == 3 and len(loaded.lane_sessions) == 3
    assert not set(loaded.lane_sessions) & set(lanes)
    assert admin.patch("/api/v1/models/demo", {"instances": 2}).status_code == 200
    runtime.reconcile_once()
    assert len(loaded.lane_sessions) == 2

    runtime.heartbeat()
    [worker] = admin.get("/api/v1/fleet").json()
    assert [(row["version"], row["instances"]) for row in worker["loaded"]] == [(1, 2)]
    assert DataPlane(runtime).model_config("demo")["instance_group"] == [{"kind": "KIND_CPU", "count": 2}]
    admin.client.force_login(get_user_model().objects.get(username=admin.username))
    page = admin.client.get("/ui/fleet").content.decode()
    assert 'data-instances="2">2 instances</span>' in page

    # Unset again: back to the provider's default, and the lanes are dropped.
    assert admin.patch("/api/v1/models/demo", {"instances": None}).status_code == 200
    runtime.reconcile_once()
    assert loaded.instances == 1 and loaded.lane_sessions == []
    one = Overlap(wait=0.05)
    loaded.session = HeldSession(session, one)
    infer(3)
    assert (one.most, one.calls) == (1, 3)
    loaded.session = session


@pytest.mark.django_db
def test_instances_out_of_range_are_refused_and_nothing_changes(owner, admin):
    create_model(owner)
    for value, error in ((0, "greater than or equal to 1"), (17, "less than or equal to 16"), ("two", "valid integer")):
        response = admin.patch("/api/v1/models/demo", {"instances": value})
        assert response.status_code == 400, response.content
        assert error in str(response.json()), response.json()
    assert RegisteredModel.objects.get(name="demo").instances is None


def test_cpu_lanes_share_out_the_cores_unless_the_threads_are_set(tmp_path, settings):
    path = tmp_path / "model.onnx"
    path.write_bytes(add_model_bytes(bias=1.0))
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    settings.ORT_INTRA_OP_THREADS = 0
    lanes = build_cpu_lanes(path, 2)
    assert lane_threads(2) == max(1, usable_cores() // 2)
    assert [lane.get_session_options().intra_op_num_threads for lane in lanes] == [lane_threads(2)] * 2
    assert lane_threads(64) == 1  # never none
    for lane in lanes:
        np.testing.assert_array_equal(lane.run(None, feeds)[0], feeds["x"] + 1.0)
    settings.ORT_INTRA_OP_THREADS = 3  # MODELYARD_ORT_INTRA_OP_THREADS: every session, lanes too
    (lane,) = build_cpu_lanes(path, 1)
    assert lane.get_session_options().intra_op_num_threads == 3
