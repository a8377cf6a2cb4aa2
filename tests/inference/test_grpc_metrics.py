"""gRPC inference calls feed the same Prometheus metrics as /v2 over HTTP: requests by status, and latency.

A real ``grpc.aio`` server on loopback in front of an in-process runtime with a real ONNX Runtime
session; calls come from ``tritonclient.grpc``. The ``status`` label is the HTTP status the same
outcome has over REST.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from inference.dataplane import DataPlane
from inference.grpc.server import GrpcServer
from modelyard import metrics as exposition
from tests.support.polling import reconcile_until
from tests.support.prometheus import value
from tests.support.registry import create_model, promote, upload_versions

pytestmark = pytest.mark.django_db(transaction=True)

REQUESTS = "modelyard_inference_requests_total"
LATENCY_COUNT = "modelyard_inference_request_seconds_count"


def scraped(name: str, **labels: str) -> float:
    body, _ = exposition.render()
    return value(body.decode(), name, **labels)


def call(port: int, model: str, x: np.ndarray) -> grpcclient.InferResult:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        tensor = grpcclient.InferInput("x", list(x.shape), "FP32" if x.dtype == np.float32 else "INT64")
        tensor.set_data_from_numpy(x)
        return client.infer(model, [tensor])
    finally:
        client.close()


def test_grpc_calls_are_counted_by_model_version_and_status_with_their_latency(
    owner, approver, make_runtime, asgi_loop, settings
):
    settings.INFERENCE_PUBLIC = True
    create_model(owner)
    upload_versions(owner, [1.0])
    promote(owner, approver, 1)
    runtime = make_runtime()
    reconcile_until(runtime, lambda: runtime.router.resolve("demo"), what="demo never served")
    server = GrpcServer(DataPlane(runtime), host="127.0.0.1", port=0, reuse_port=False, max_message_bytes=1 << 20)
    port = asyncio.run_coroutine_threadsafe(server.start(), asgi_loop.loop).result(timeout=30)
    ok_before = scraped(REQUESTS, model="demo", version="1", status="200")
    bad_before = scraped(REQUESTS, model="demo", version="1", status="400")
    unknown_before = scraped(REQUESTS, model="_unknown", version="", status="404")
    latency_before = scraped(LATENCY_COUNT, model="demo", version="1")
    try:
        for _ in range(3):
            x = np.ones((1, 4), np.float32)
            np.testing.assert_array_equal(call(port, "demo", x).as_numpy("y"), x + np.float32(1.0))
        with pytest.raises(InferenceServerException, match="datatype"):
            call(port, "demo", np.ones((1, 4), np.int64))
        with pytest.raises(InferenceServerException, match="nosuch"):
            call(port, "nosuch", np.ones((1, 4), np.float32))
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0), asgi_loop.loop).result(timeout=30)

    assert scraped(REQUESTS, model="demo", version="1", status="200") == ok_before + 3
    assert scraped(REQUESTS, model="demo", version="1", status="400") == bad_before + 1
    assert scraped(REQUESTS, model="_unknown", version="", status="404") == unknown_before + 1
    assert scraped(LATENCY_COUNT, model="demo", version="1") == latency_before + 4
