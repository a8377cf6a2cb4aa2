"""The dynamic batcher on a real ONNX Runtime session: merging, exact splitting, priority, timeouts, limits."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import onnxruntime as ort
import pytest

from inference.batcher import Batcher, Overloaded, RequestTimeout
from tests.support.onnx_models import add_model_bytes


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    return ort.InferenceSession(add_model_bytes(bias=0.5), providers=["CPUExecutionProvider"])


def runner(session, sizes: list[int], gate: threading.Event | None = None):
    def run(feeds):
        if gate is not None:
            gate.wait(5)
        sizes.append(feeds["x"].shape[0])
        return {"y": session.run(["y"], feeds)[0]}

    return run


def test_concurrent_requests_merge_and_each_gets_its_own_outputs(session):
    sizes: list[int] = []
    merged: list[tuple[int, int]] = []

    async def main():
        batcher = Batcher(
            runner(session, sizes),
            batching=True,
            max_batch_size=64,
            max_queue_delay_us=20_000,
            max_queue_size=1000,
            on_batch=lambda requests, rows: merged.append((requests, rows)),
        )
        inputs = [np.full((1 + i % 3, 4), i, dtype=np.float32) for i in range(64)]
        futures = [batcher.submit({"x": x}) for x in inputs]
        results = await asyncio.gather(*futures)
        batcher.close()
        return inputs, results

    inputs, results = asyncio.run(main())
    for x, result in zip(inputs, results, strict=True):
        np.testing.assert_array_equal(result["y"], session.run(["y"], {"x": x})[0])
    assert max(requests for requests, _ in merged) > 1
    assert sum(rows for _, rows in merged) == sum(x.shape[0] for x in inputs)
    assert max(sizes) <= 64


def test_different_trailing_shapes_never_share_a_batch():
    sizes: list[tuple[int, ...]] = []

    def run(feeds):
        sizes.append(feeds["x"].shape)
        return {"y": feeds["x"] * 2}

    async def main():
        batcher = Batcher(run, batching=True, max_batch_size=8, max_queue_delay_us=10_000, max_queue_size=100)
        a = [batcher.submit({"x": np.ones((1, 3), np.float32)}) for _ in range(3)]
        b = [batcher.submit({"x": np.ones((1, 5), np.float32)}) for _ in range(3)]
        out = await asyncio.gather(*a, *b)
        batcher.close()
        return out

    out = asyncio.run(main())
    assert all(o["y"].shape == (1, 3) for o in out[:3]) and all(o["y"].shape == (1, 5) for o in out[3:])
    assert sorted(sizes) == [(3, 3), (3, 5)]


def test_requests_whose_inputs_disagree_on_rows_are_never_merged():
    """Outputs are split back by the rows of the first input; a request whose inputs differ in rows runs alone."""
    shapes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def run(feeds):
        shapes.append((feeds["a"].shape, feeds["b"].shape))
        return {"total": np.full((feeds["a"].shape[0], 1), feeds["a"].sum() + feeds["b"].sum(), np.float32)}

    async def main():
        batcher = Batcher(run, batching=True, max_batch_size=8, max_queue_delay_us=20_000, max_queue_size=100)
        requests = [
            {"a": np.full((1, 2), 1.0, np.float32), "b": np.full((3, 2), 10.0, np.float32)},
            {"a": np.full((1, 2), 2.0, np.float32), "b": np.full((3, 2), 20.0, np.float32)},
        ]
        out = await asyncio.gather(*(batcher.submit(r) for r in requests))
        batcher.close()
        return out

    first, second = asyncio.run(main())
    assert first["total"].tolist() == [[62.0]] and second["total"].tolist() == [[124.0]]
    assert shapes == [((1, 2), (3, 2)), ((1, 2), (3, 2))]


def test_a_batcher_told_not_to_batch_runs_each_request_alone_and_may_be_told_again(session):
    sizes: list[int] = []

    async def main():
        batcher = Batcher(
            runner(session, sizes), batching=True, max_batch_size=8, max_queue_delay_us=20_000, max_queue_size=100
        )
        batcher.configure(max_batch_size=8, max_queue_delay_us=20_000, max_queue_size=100, batching=False)
        inputs = [np.full((1 + i % 2, 4), i, dtype=np.float32) for i in range(4)]
        alone = await asyncio.gather(*(batcher.submit({"x": x}) for x in inputs))
        runs_alone = list(sizes)
        batcher.configure(max_batch_size=8, max_queue_delay_us=20_000, max_queue_size=100, batching=True)
        merged = await asyncio.gather(*(batcher.submit({"x": x}) for x in inputs))
        batcher.close()
        return inputs, alone, runs_alone, merged

    inputs, alone, runs_alone, merged = asyncio.run(main())
    for x, one, two in zip(inputs, alone, merged, strict=True):
        expected = session.run(["y"], {"x": x})[0]
        np.testing.assert_array_equal(one["y"], expected)
        np.testing.assert_array_equal(two["y"], expected)
    assert runs_alone == [1, 2, 1, 2]
    assert sizes[4:] == [6]


def test_full_queue_is_refused_at_once(session):
    gate = threading.Event()

    async def main():
        batcher = Batcher(
            runner(session, [], gate), batching=False, max_batch_size=1, max_queue_delay_us=0, max_queue_size=2
        )
        first = batcher.submit({"x": np.ones((1, 4), np.float32)})
        await asyncio.sleep(0.05)  # the first one is now running (blocked on the gate)
        batcher.submit({"x": np.ones((1, 4), np.float32)})
        batcher.submit({"x": np.ones((1, 4), np.float32)})
        with pytest.raises(Overloaded, match="the queue is full"):
            batcher.submit({"x": np.ones((1, 4), np.float32)})
        gate.set()
        await first
        batcher.close()

    asyncio.run(main())


def test_timed_out_request_gets_an_error_and_never_runs(session):
    gate = threading.Event()
    sizes: list[int] = []

    async def main():
        batcher = Batcher(
            runner(session, sizes, gate), batching=False, max_batch_size=1, max_queue_delay_us=0, max_queue_size=10
        )
        blocker = batcher.submit({"x": np.ones((1, 4), np.float32)})
        await asyncio.sleep(0.05)
        late = batcher.submit({"x": np.full((2, 4), 7, np.float32)}, timeout_us=1000)
        await asyncio.sleep(0.05)
        gate.set()
        await blocker
        with pytest.raises(RequestTimeout):
            await late
        batcher.close()

    asyncio.run(main())
    assert sizes == [1]


def test_priority_runs_first_and_cancelled_requests_are_dropped(session):
    gate = threading.Event()
    order: list[float] = []

    def run(feeds):
        gate.wait(5)
        order.append(float(feeds["x"][0, 0]))
        return {"y": feeds["x"]}

    async def main():
        batcher = Batcher(run, batching=False, max_batch_size=1, max_queue_delay_us=0, max_queue_size=10)
        blocker = batcher.submit({"x": np.zeros((1, 4), np.float32)})
        await asyncio.sleep(0.05)
        low = batcher.submit({"x": np.full((1, 4), 1, np.float32)}, priority=5)
        gone = batcher.submit({"x": np.full((1, 4), 2, np.float32)}, priority=1)
        high = batcher.submit({"x": np.full((1, 4), 3, np.float32)}, priority=1)
        gone.cancel()  # its client disconnected
        gate.set()
        await asyncio.gather(blocker, low, high)
        batcher.close()

    asyncio.run(main())
    assert order == [0.0, 3.0, 1.0]


def test_a_bad_request_fails_alone_not_its_whole_batch():
    def run(feeds):
        if (feeds["x"] < 0).any():
            raise ValueError("negative values are not allowed")
        return {"y": feeds["x"] + 1}

    async def main():
        batcher = Batcher(run, batching=True, max_batch_size=8, max_queue_delay_us=50_000, max_queue_size=10)
        good = [batcher.submit({"x": np.full((1, 2), i, np.float32)}) for i in range(3)]
        bad = batcher.submit({"x": np.full((1, 2), -1, np.float32)})
        results = await asyncio.gather(*good, bad, return_exceptions=True)
        batcher.close()
        return results

    *good, bad = asyncio.run(main())
    for i, result in enumerate(good):
        np.testing.assert_array_equal(result["y"], np.full((1, 2), i + 1, np.float32))
    assert isinstance(bad, ValueError)
    assert str(bad) == "negative values are not allowed"


def test_a_merged_run_that_fails_after_its_version_was_unloaded_answers_each_request_unloaded():
    """Its requests would each run alone, but the batcher's threads have ended: none is left waiting."""
    first_gate, merged_gate = threading.Event(), threading.Event()
    rows: list[int] = []

    def run(feeds):
        rows.append(feeds["x"].shape[0])
        if len(rows) == 1:
            first_gate.wait(5)
            return {"y": feeds["x"]}
        merged_gate.wait(5)
        raise ValueError("the merged run failed")

    async def main():
        # The first request runs alone at once; the next two wait, then run merged when it is done.
        batcher = Batcher(run, batching=True, max_batch_size=8, max_queue_delay_us=0, max_queue_size=10)
        first = batcher.submit({"x": np.zeros((1, 2), np.float32)})
        await asyncio.sleep(0.05)
        merged = [batcher.submit({"x": np.full((1, 2), i, np.float32)}) for i in range(2)]
        first_gate.set()
        await first
        while len(rows) < 2:  # the merged run has started
            await asyncio.sleep(0.01)
        batcher.close()  # as the unload does, while the merged run is in flight
        merged_gate.set()
        return await asyncio.wait_for(asyncio.gather(*merged, return_exceptions=True), 5)

    results = asyncio.run(main())
    assert rows == [1, 2]
    assert [type(r) for r in results] == [Overloaded, Overloaded]
    assert [str(r) for r in results] == ["the model was unloaded"] * 2


def test_cancelled_requests_do_not_fill_the_queue():
    gate = threading.Event()

    def run(feeds):
        gate.wait(5)
        return {"y": feeds["x"]}

    async def main():
        batcher = Batcher(run, batching=False, max_batch_size=1, max_queue_delay_us=0, max_queue_size=2)
        running = batcher.submit({"x": np.zeros((1, 2), np.float32)})
        await asyncio.sleep(0.05)
        abandoned = [batcher.submit({"x": np.ones((1, 2), np.float32)}) for _ in range(2)]
        for future in abandoned:
            future.cancel()  # their clients hung up
        fresh = batcher.submit({"x": np.full((1, 2), 5, np.float32)})
        gate.set()
        await running
        result = await fresh
        batcher.close()
        return result

    np.testing.assert_array_equal(asyncio.run(main())["y"], np.full((1, 2), 5, np.float32))


def test_a_run_that_ends_after_its_loop_closed_is_dropped_quietly(caplog):
    """The worker thread hands a finished run to the loop; a closed loop leaves nobody to hand it to."""
    gate, finished = threading.Event(), threading.Event()

    def run(feeds):
        gate.wait(5)
        return {"y": feeds["x"]}

    loop = asyncio.new_event_loop()
    batcher = Batcher(run, batching=False, max_batch_size=1, max_queue_delay_us=0, max_queue_size=2)

    async def start():
        future = batcher.submit({"x": np.zeros((1, 2), np.float32)})
        future.add_done_callback(lambda _: finished.set())
        await asyncio.sleep(0.05)  # the run has started on its worker thread
        return future

    with caplog.at_level("DEBUG", logger="inference.batcher"):
        future = loop.run_until_complete(start())
        batcher.close()  # as the server's shutdown does; the run in flight goes on
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
        gate.set()
        batcher._threads.shutdown(wait=True)  # the run and its hand-back are over
    assert not future.done() and not finished.is_set()
    assert caplog.records == []  # "handing back a run failed" would be logged here


def test_a_freed_instance_takes_the_next_batch_before_the_answers_of_the_last_are_handed_out():
    """The runner wakes first when a batch ends, so the instance does not idle while answers are encoded."""
    gate = threading.Event()

    def run(feeds):
        gate.wait(5)
        return {"y": feeds["x"] + 1}

    async def main():
        batcher = Batcher(run, batching=True, max_batch_size=8, max_queue_delay_us=0, max_queue_size=10)
        first = batcher.submit({"x": np.zeros((1, 2), np.float32)})
        await asyncio.sleep(0.05)  # running
        waiting = [batcher.submit({"x": np.full((1, 2), i, np.float32)}) for i in range(3)]
        seen: list[int] = []
        first.add_done_callback(lambda _: seen.append(batcher.queued))
        gate.set()
        await asyncio.gather(first, *waiting)
        batcher.close()
        return seen

    assert asyncio.run(main()) == [0]  # the three waiting requests had left the queue for their run
