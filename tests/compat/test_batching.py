"""Dynamic batching through the real server: concurrent clients are merged and each gets exactly its own rows."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from prometheus_client.parser import text_string_to_metric_families

from tests.support.v2server import V2Server

CLIENTS = 64


def batch_histogram(v2: V2Server, model: str) -> dict[str, float]:
    """The ``modelyard_batch_requests`` histogram of one model: its count, sum, and the le="1" bucket."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(v2.metrics()):
        if family.name != "modelyard_batch_requests":
            continue
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            if sample.name.endswith("_count"):
                found["count"] = sample.value
            elif sample.name.endswith("_sum"):
                found["sum"] = sample.value
            elif sample.name.endswith("_bucket") and float(sample.labels["le"]) == 1.0:
                found["single"] = sample.value
    return {"count": 0.0, "sum": 0.0, "single": 0.0} | found


def client_input(index: int) -> np.ndarray:
    """Different rows and values for every client, so a mix-up between clients cannot go unseen."""
    rows = 1 + index % 3
    return (np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + index * 100).astype(np.float32)


def test_64_concurrent_clients_are_merged_and_each_gets_its_own_outputs(v2):
    before = batch_histogram(v2, "batchy")
    start = threading.Barrier(CLIENTS)
    results: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def one(index: int) -> None:
        try:
            x = client_input(index)
            binary = index % 2 == 0  # half binary, half JSON: both merge into the same batches
            item = httpclient.InferInput("x", list(x.shape), "FP32")
            item.set_data_from_numpy(x, binary_data=binary)
            with httpclient.InferenceServerClient(v2.url) as triton:
                start.wait(timeout=30)
                result = triton.infer(
                    "batchy", [item], outputs=[httpclient.InferRequestedOutput("y", binary_data=binary)]
                )
            results[index] = result.as_numpy("y")
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert errors == []
    assert sorted(results) == list(range(CLIENTS))
    for index, y in results.items():
        x = client_input(index)
        (expected,) = v2.reference("batchy").run(["y"], {"x": x})
        assert y.shape == x.shape
        np.testing.assert_array_equal(y, expected)

    after = batch_histogram(v2, "batchy")
    runs = after["count"] - before["count"]
    assert after["sum"] - before["sum"] == CLIENTS  # every request ran exactly once
    assert runs < CLIENTS  # fewer ONNX Runtime runs than requests...
    assert after["single"] - before["single"] < runs  # ...because some run held more than one request


def test_64_concurrent_aio_requests_with_mixed_shapes(v2):
    """One event loop, 64 requests in flight; trailing shapes differ, so only matching ones may merge."""
    before = batch_histogram(v2, "multi")

    def feeds(index: int) -> dict[str, Any]:
        rows, cols = 1 + index % 2, 1 + index % 4
        return {
            "a": np.full((rows, cols), index - 30, dtype=np.float32),
            "b": np.full((rows, 2), index, dtype=np.int64),
            "text": np.array([f"client {index} row {r}" for r in range(rows)], dtype=object),
        }

    async def main() -> list[Any]:
        async with aioclient.InferenceServerClient(v2.url, conn_limit=CLIENTS) as triton:

            async def one(index: int) -> Any:
                inputs = []
                for name, datatype in (("a", "FP32"), ("b", "INT64"), ("text", "BYTES")):
                    array = feeds(index)[name]
                    item = aioclient.InferInput(name, list(array.shape), datatype)
                    item.set_data_from_numpy(array)
                    inputs.append(item)
                return await triton.infer("multi", inputs)

            return await asyncio.gather(*(one(i) for i in range(CLIENTS)))

    results = asyncio.run(main())
    for index, result in enumerate(results):
        for name, expected in v2.expected("multi", feeds(index)).items():
            actual = result.as_numpy(name)
            if expected.dtype == np.object_:
                expected = np.array([v.encode() for v in expected.flat], dtype=object).reshape(expected.shape)
            np.testing.assert_array_equal(actual, expected)
    after = batch_histogram(v2, "multi")
    assert after["sum"] - before["sum"] == CLIENTS
