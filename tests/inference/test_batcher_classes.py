"""The batcher's priority classes: high, normal, low, then the chunks of asynchronous jobs, whatever came first."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from inference.batcher import CLASS_HIGH, CLASS_JOB, CLASS_LOW, CLASS_NAMES, CLASS_NORMAL, Batcher


def _recording(order: list[float], gate: threading.Event):
    def run(feeds):
        gate.wait(5)
        order.extend(float(v) for v in feeds["x"][:, 0])
        return {"y": feeds["x"] * 2}

    return run


def _row(value: float, rows: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.full((rows, 4), value, np.float32)}


def test_class_names_and_numbers_agree():
    assert CLASS_NAMES == ("high", "normal", "low", "job")
    assert [CLASS_NAMES[k] for k in (CLASS_HIGH, CLASS_NORMAL, CLASS_LOW, CLASS_JOB)] == list(CLASS_NAMES)


def test_a_job_request_queued_first_runs_after_the_normal_and_high_ones_queued_later():
    gate = threading.Event()
    order: list[float] = []

    async def main():
        batcher = Batcher(
            _recording(order, gate), batching=False, max_batch_size=4, max_queue_delay_us=0, max_queue_size=10
        )
        blocker = batcher.submit(_row(0))  # runs at once and holds the one instance
        await asyncio.sleep(0.05)
        job = batcher.submit(_row(9, rows=4), klass=CLASS_JOB)
        normal = batcher.submit(_row(2))
        high = batcher.submit(_row(1), klass=CLASS_HIGH)
        gate.set()
        results = await asyncio.gather(blocker, job, normal, high)
        batcher.close()
        return results

    results = asyncio.run(main())
    assert order == [0.0, 1.0, 2.0, 9.0, 9.0, 9.0, 9.0]
    assert results[1]["y"].tolist() == [[18.0] * 4] * 4


def test_high_runs_before_normal_before_low_and_priority_orders_within_a_class():
    gate = threading.Event()
    order: list[float] = []

    async def main():
        batcher = Batcher(
            _recording(order, gate), batching=False, max_batch_size=1, max_queue_delay_us=0, max_queue_size=10
        )
        blocker = batcher.submit(_row(0))
        await asyncio.sleep(0.05)
        futures = [
            batcher.submit(_row(5), klass=CLASS_LOW),
            batcher.submit(_row(4), klass=CLASS_NORMAL, priority=20),
            batcher.submit(_row(3), klass=CLASS_NORMAL),  # the default priority, 10, before 20
            batcher.submit(_row(2), klass=CLASS_HIGH, priority=50),
            batcher.submit(_row(1), klass=CLASS_HIGH, priority=1),
        ]
        gate.set()
        await asyncio.gather(blocker, *futures)
        batcher.close()

    asyncio.run(main())
    assert order == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_a_merged_batch_takes_the_higher_classes_first_when_not_all_fit():
    gate = threading.Event()
    order: list[float] = []
    sizes: list[int] = []

    def run(feeds):
        sizes.append(feeds["x"].shape[0])
        return _recording(order, gate)(feeds)

    async def main():
        batcher = Batcher(run, batching=True, max_batch_size=3, max_queue_delay_us=0, max_queue_size=10)
        blocker = batcher.submit(_row(0))
        await asyncio.sleep(0.05)
        futures = [
            batcher.submit(_row(9, rows=2), klass=CLASS_JOB),
            batcher.submit(_row(3), klass=CLASS_LOW),
            batcher.submit(_row(2)),
            batcher.submit(_row(1), klass=CLASS_HIGH),
        ]
        gate.set()
        await asyncio.gather(blocker, *futures)
        batcher.close()

    asyncio.run(main())
    assert order == [0.0, 1.0, 2.0, 3.0, 9.0, 9.0]
    assert sizes == [1, 3, 2]


def test_queued_by_class_counts_the_waiting_requests_of_each_class():
    gate = threading.Event()

    async def main():
        batcher = Batcher(
            _recording([], gate), batching=False, max_batch_size=1, max_queue_delay_us=0, max_queue_size=10
        )
        assert batcher.queued_by_class() == {"high": 0, "normal": 0, "low": 0, "job": 0}
        blocker = batcher.submit(_row(0))  # running, not waiting
        await asyncio.sleep(0.05)
        futures = [
            batcher.submit(_row(1), klass=CLASS_JOB),
            batcher.submit(_row(1), klass=CLASS_HIGH),
            batcher.submit(_row(1), klass=CLASS_HIGH),
            batcher.submit(_row(1)),
        ]
        counts = batcher.queued_by_class()
        assert sum(counts.values()) == batcher.queued
        gate.set()
        await asyncio.gather(blocker, *futures)
        after = batcher.queued_by_class()
        batcher.close()
        return counts, after

    counts, after = asyncio.run(main())
    assert counts == {"high": 2, "normal": 1, "low": 0, "job": 1}
    assert after == {"high": 0, "normal": 0, "low": 0, "job": 0}


def test_an_unknown_class_is_refused():
    async def main():
        batcher = Batcher(
            lambda feeds: feeds, batching=False, max_batch_size=1, max_queue_delay_us=0, max_queue_size=10
        )
        with pytest.raises(ValueError, match="unknown priority class"):
            batcher.submit(_row(1), klass=len(CLASS_NAMES))
        batcher.close()

    asyncio.run(main())


def test_a_jobs_request_takes_only_the_room_online_requests_left_as_a_batch_closes():
    order: list[float] = []
    sizes: list[int] = []

    def run(feeds):
        sizes.append(feeds["x"].shape[0])
        order.extend(float(v) for v in feeds["x"][:, 0])
        return {"y": feeds["x"] * 2}

    async def main(late_online: bool):
        batcher = Batcher(run, batching=True, max_batch_size=3, max_queue_delay_us=100_000, max_queue_size=10)
        futures = [batcher.submit(_row(1)), batcher.submit(_row(9, rows=2), klass=CLASS_JOB)]
        await asyncio.sleep(0.02)  # the batch of the first request is filling, the job's request set aside
        if late_online:
            futures.append(batcher.submit(_row(2, rows=2)))
        await asyncio.gather(*futures)
        batcher.close()

    asyncio.run(main(late_online=True))
    assert (sizes, order) == ([3, 2], [1.0, 2.0, 2.0, 9.0, 9.0])  # the online request arriving later took the room
    sizes.clear()
    order.clear()
    asyncio.run(main(late_online=False))
    assert (sizes, order) == ([3], [1.0, 9.0, 9.0])  # nobody else came: the job's rows filled the batch as it closed
