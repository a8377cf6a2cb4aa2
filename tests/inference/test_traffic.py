"""Rolling traffic per loaded version (``inference/traffic.py``): the ring, its quantiles, and the heartbeat.

The ring is tested on a clock of the test's own; the last test sends real requests through
``DataPlane.infer`` on an in-process runtime and reads them back from the fleet as the registry sees it.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from inference import traffic
from inference.dataplane import DataPlane
from inference.protocol import decode_request
from inference.traffic import BUCKET_SECONDS, BUCKETS, Traffic
from registry import serving
from registry.serving import LoadedRow, LoadState, TrafficBucket
from tests.support.polling import reconcile_until
from tests.support.registry import create_model, promote, upload_versions


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_requests_fall_into_ten_second_buckets_with_rate_errors_and_quantiles():
    clock = Clock(1_000_000.0)  # the start of a bucket
    ring = Traffic(clock)
    for _ in range(98):
        ring.record(0.002)
    ring.record(0.5, error=True)
    ring.record(1.0, error=True)
    clock.now += BUCKET_SECONDS  # the next bucket
    ring.record(0.010)
    clock.now += 4
    [first, second] = ring.summary()
    assert (first.start, first.seconds, first.requests, first.errors) == (1_000_000.0, 10, 100, 2)
    assert first.rate == 10.0
    # Quantiles are the upper edge of their bin, which is at most 2**(1/4) above the true value.
    assert first.p50_ms is not None and 2.0 <= first.p50_ms < 2.0 * 2**0.25
    assert first.p99_ms is not None and 500.0 <= first.p99_ms < 500.0 * 2**0.25
    # The bucket still filling counts only the time that has passed.
    assert (second.start, second.seconds, second.requests, second.errors) == (1_000_010.0, 4.0, 1, 0)
    assert second.p50_ms == second.p99_ms
    assert second.p50_ms is not None and 10.0 <= second.p50_ms < 10.0 * 2**0.25


def test_the_ring_keeps_five_minutes_and_reuses_old_slots():
    assert BUCKETS * BUCKET_SECONDS == 300
    clock = Clock(2_000_000.0)
    ring = Traffic(clock)
    ring.record(0.001)
    clock.now += BUCKETS * BUCKET_SECONDS  # the same slot of the ring, five minutes on
    assert ring.summary() == ()  # the old bucket is out of the window
    ring.record(0.001)
    ring.record(0.001)
    [bucket] = ring.summary()
    assert (bucket.start, bucket.requests) == (2_000_300.0, 2)  # the slot started afresh


def test_an_idle_version_reports_nothing_and_extreme_latencies_stay_in_range():
    clock = Clock(3_000_000.0)
    ring = Traffic(clock)
    assert ring.summary() == ()
    ring.record(0.0)
    ring.record(10_000.0)  # past the last bin
    [bucket] = ring.summary()
    assert bucket.p50_ms == float(f"{traffic.BOUNDS[0] * 1000:.3g}")
    assert bucket.p99_ms is not None and bucket.p99_ms > 120_000


def test_watch_counts_outputs_and_errors_but_not_requests_whose_client_left():
    ring = Traffic()
    loop = asyncio.new_event_loop()
    try:
        answered, failed, gone = (loop.create_future() for _ in range(3))
        for future in (answered, failed, gone):
            ring.watch(future)
        answered.set_result({"y": np.zeros(1)})
        failed.set_exception(RuntimeError("ORT refused"))
        gone.cancel()
        loop.run_until_complete(asyncio.sleep(0))  # done-callbacks run on the loop
    finally:
        loop.close()
    [bucket] = ring.summary()
    assert (bucket.requests, bucket.errors) == (2, 1)


def test_traffic_does_not_make_rows_differ_but_crosses_the_seam_as_json():
    bucket = TrafficBucket(start=10.0, seconds=10.0, requests=5, errors=1, p50_ms=1.19, p99_ms=2.38)
    quiet = LoadedRow(model="demo", version=1, state=LoadState.READY)
    busy = LoadedRow(model="demo", version=1, state=LoadState.READY, traffic=(bucket,))
    assert quiet == busy  # traffic alone does not trigger an early heartbeat
    assert busy.as_json()["traffic"] == [
        {"start": 10.0, "seconds": 10.0, "requests": 5, "errors": 1, "p50_ms": 1.19, "p99_ms": 2.38}
    ]
    assert LoadedRow.from_json(json.loads(json.dumps(busy.as_json()))).traffic == (bucket,)
    # Rows written before traffic existed still read.
    old = {key: value for key, value in busy.as_json().items() if key != "traffic"}
    assert LoadedRow.from_json(old).traffic == ()


async def _cancel_tasks() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.django_db(transaction=True)
def test_requests_through_the_data_plane_reach_the_fleet_with_the_heartbeat(owner, approver, make_runtime):
    create_model(owner)
    upload_versions(owner, [1.0])
    promote(owner, approver, 1)
    runtime = make_runtime()
    reconcile_until(runtime, lambda: runtime.router.resolve("demo") is not None, what="v1 never served")
    plane = DataPlane(runtime)
    loaded = plane.resolve("demo")
    x = np.ones((2, 4), dtype=np.float32)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": x.tolist()}]}
    loop = asyncio.new_event_loop()
    try:
        for _ in range(3):
            request = decode_request(json.dumps(body).encode(), None, loaded.spec.signature)
            result = loop.run_until_complete(plane.infer("demo", None, request))
            assert np.array_equal(result.outputs["y"], x + 1)
        runtime.heartbeat()
    finally:
        loop.run_until_complete(_cancel_tasks())  # the batcher's runner lives on this loop
        loop.close()
    [worker] = serving.fleet_list()
    [row] = worker.loaded
    assert row.state == LoadState.READY
    assert sum(b.requests for b in row.traffic) == 3
    assert sum(b.errors for b in row.traffic) == 0
    assert all(b.p50_ms is not None and b.p99_ms is not None for b in row.traffic)
