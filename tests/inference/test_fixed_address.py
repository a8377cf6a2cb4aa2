"""Fixed-address serving, what CUDA graphs need, run here on the CPU: which versions qualify, exact outputs.

A captured CUDA graph replays on the buffers it was captured with, so a version served with
``MODELYARD_CUDA_GRAPHS`` copies each request into buffers allocated once
(``inference.sessions.FixedAddressRunner``). The graph itself needs a GPU; the buffers, the copies
and the wiring through the runtime are the same on the CPU and are tested here.
"""

from __future__ import annotations

import asyncio

import numpy as np
import onnxruntime as ort
import pytest

from inference import loader
from inference.sessions import FixedAddressRunner, unfixed_tensors
from tests.support.onnx_models import fixed_add_model
from tests.support.polling import reconcile_until
from tests.support.registry import create_model, promote


def test_only_versions_with_every_shape_fixed_and_numeric_qualify():
    batching = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
    }
    fixed = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [2, 4]}],
    }
    strings = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1]}],
        "outputs": [{"name": "ids", "datatype": "INT64", "shape": [1, 8]}, {"name": "n", "datatype": "INT64"}],
    }
    assert unfixed_tensors(batching) == ["x", "y"]
    assert unfixed_tensors(fixed) == []
    assert unfixed_tensors(strings) == ["text", "n"]  # a string tensor, and an output of unknown shape


def test_runs_at_fixed_addresses_give_exactly_the_outputs_of_run_and_never_overwrite_earlier_ones():
    session = ort.InferenceSession(fixed_add_model(bias=0.5).SerializeToString(), providers=["CPUExecutionProvider"])
    signature = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [2, 4]}],
    }
    runner = FixedAddressRunner(session, signature, device="cpu")
    inputs = [np.arange(8, dtype=np.float32).reshape(2, 4) * i for i in range(4)]
    results = [runner.run(None, {"x": x}) for x in inputs]
    for x, (y,) in zip(inputs, results, strict=True):
        np.testing.assert_array_equal(y, session.run(["y"], {"x": x})[0])  # the first results survive the later runs
    # A float64 request is copied into the float32 buffer, as the signature says.
    np.testing.assert_array_equal(runner.run(["y"], {"x": inputs[1].astype(np.float64)})[0], inputs[1] + 0.5)


@pytest.mark.django_db(transaction=True)
def test_a_graph_session_is_served_through_fixed_buffers_one_batch_at_a_time(
    owner, approver, admin, make_runtime, asgi_loop, monkeypatch
):
    real = loader.build_session
    asked: list[bool] = []

    def as_if_captured(path, *, fixed_address_io=False, spinning=None, **saved_graph):
        # What build_session returns on a GPU with MODELYARD_CUDA_GRAPHS for a fixed-shape model.
        asked.append(fixed_address_io)
        built = real(path, fixed_address_io=fixed_address_io, spinning=spinning, **saved_graph)
        built.graphs = fixed_address_io
        return built

    monkeypatch.setattr(loader, "build_session", as_if_captured)
    create_model(owner)
    response = owner.upload("demo", [("model.onnx", fixed_add_model(bias=2.0).SerializeToString())])
    assert response.status_code == 201, response.content
    promote(owner, approver, 1)
    runtime = make_runtime()
    loaded = reconcile_until(runtime, lambda: runtime.router.resolve("demo"), what="demo never served")
    assert asked == [True]  # the runtime asked for fixed-address IO: every shape is fixed
    assert isinstance(loaded.runner, FixedAddressRunner)
    assert admin.patch("/api/v1/models/demo", {"instances": 4}).status_code == 200
    runtime.reconcile_once()
    assert loaded.instances == 1  # one set of buffers: runs take turns whatever the model asks

    inputs = [np.full((2, 4), i, np.float32) for i in range(5)]

    async def infer():
        return await asyncio.gather(*[loaded.batcher.submit({"x": x}) for x in inputs])

    outputs = asyncio.run_coroutine_threadsafe(infer(), asgi_loop.loop).result(timeout=30)
    for x, out in zip(inputs, outputs, strict=True):
        np.testing.assert_array_equal(out["y"], x + np.float32(2.0))
