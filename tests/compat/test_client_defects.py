"""What clients no one here wrote found wrong with /v2 (issue 10), each pinned by the request that showed it.

Triton's examples, a port of Triton's server QA suite and KServe's SDK ran against Modelyard; each
test below is one of their findings, sent the way that client sent it.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnxruntime.capi.onnxruntime_pybind11_state import EPFail, RuntimeException
from tritonclient.utils import InferenceServerException

from inference.dataplane import OUT_OF_MEMORY
from inference.errors import InvalidInput
from inference.protocol import decode_request
from tests.support.v2server import V2Server

RAW = {"Inference-Header-Content-Length": "0"}


def binary_answer(response: Any) -> tuple[dict[str, Any], bytes]:
    assert response.status == 200, response.body
    length = int(response.headers["inference-header-content-length"])
    return json.loads(response.body[:length]), response.body[length:]


# --- 1. The raw binary request ---------------------------------------------------------------------------------


def test_a_raw_binary_request_is_the_data_of_the_one_input(v2: V2Server):
    x = np.array([1.5, -2.0, 3.25, 8.0], np.float32)
    header, blob = binary_answer(v2.request("POST", "/v2/models/adder/infer", x.tobytes(), RAW))
    assert header["outputs"] == [
        {"name": "y", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}}
    ]
    assert header["model_version"] == "1"
    np.testing.assert_array_equal(np.frombuffer(blob, "<f4"), x + 1)


def test_a_raw_binary_request_of_bytes_is_one_element(v2: V2Server):
    text = "héllo, wörld".encode()
    header, blob = binary_answer(v2.request("POST", "/v2/models/echo/infer", text, RAW))
    assert header["outputs"] == [
        {"name": "out", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 4 + len(text)}}
    ]
    assert blob == struct.pack("<I", len(text)) + text


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (
            "/v2/models/multi/infer",
            b"\x00" * 16,
            "Raw request must only have 1 input (found 1) to be deduced but got 3 inputs in 'multi' model "
            "configuration: a raw binary request (Inference-Header-Content-Length: 0) needs a model with exactly one "
            "input; this one takes 3 (a, b, text): send a JSON header with the inputs described",
        ),
        (
            "/v2/models/adder/infer",
            b"\x00" * 32,
            "input 'x': shape [1, 4] of FP32 needs 16 bytes, got a body of 32",
        ),
        (
            "/v2/models/strings/infer",
            b"12",
            "For BYTE datatype raw input 'text', the model must have input shape [1]: a raw binary request "
            "(Inference-Header-Content-Length: 0) of BYTES needs an input of one element; input 'text' has shape "
            "[-1, 2]",
        ),
    ],
    ids=["several-inputs", "size", "bytes-not-one-element"],
)
def test_a_raw_binary_request_that_cannot_be_deduced_is_a_400(v2: V2Server, path, body, message):
    response = v2.request("POST", path, body, RAW)
    assert (response.status, response.json()) == (400, {"error": message})


def raw_signature(shape: list[int], datatype: str = "INT16") -> dict[str, Any]:
    return {
        "inputs": [{"name": "x", "datatype": datatype, "shape": shape}],
        "outputs": [{"name": "y", "datatype": datatype, "shape": shape}],
    }


def test_a_raw_binary_request_deduces_one_dynamic_dimension_from_its_size():
    data = np.arange(6, dtype="<i2").tobytes()
    assert decode_request(data, "0", raw_signature([2, -1])).inputs["x"].tolist() == [[0, 1, 2], [3, 4, 5]]
    # A batching model's raw request is one row: its other dynamic dimension is deduced.
    assert decode_request(data, "0", raw_signature([-1, 2, -1])).inputs["x"].shape == (1, 2, 3)
    with pytest.raises(InvalidInput) as caught:
        decode_request(data, "0", raw_signature([-1, -1, -1]))
    assert caught.value.message == (
        "The shape of the raw input 'x' can not be deduced because there are more than one variable-sized "
        "dimension: a raw binary request (Inference-Header-Content-Length: 0): the shape of input 'x' [-1, -1, -1] "
        "cannot be deduced from the body's size; send a JSON header with the shape"
    )
    with pytest.raises(InvalidInput) as caught:
        decode_request(data[:5], "0", raw_signature([2, -1]))
    assert caught.value.message == (
        "a raw binary request (Inference-Header-Content-Length: 0): the body's 5 bytes do not fill input 'x' "
        "of INT16 [2, -1]: its dynamic dimension takes 4 bytes a step"
    )


# --- 2. JSON data nested a thousand deep -------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [64, 900, 960, 990, 1000, 1100, 20_000])
@pytest.mark.parametrize("model", ["adder", "echo"])
def test_json_data_nested_deep_is_a_400(v2: V2Server, model, depth):
    datatype, shape = ("FP32", [1, 4]) if model == "adder" else ("BYTES", [1])
    data = "[" * depth + "1" + "]" * depth
    body = f'{{"inputs": [{{"name": "x", "datatype": "{datatype}", "shape": {shape}, "data": {data}}}]}}'
    response = v2.request("POST", f"/v2/models/{model}/infer", body.encode())
    assert response.status == 400, response.body[:300]
    assert response.json()["error"]


# --- 4. An output asked for twice ---------------------------------------------------------------------------------


def test_an_output_asked_for_twice_is_a_400(v2: V2Server):
    x = np.ones((1, 4), np.float32)
    with httpclient.InferenceServerClient(v2.url) as client:
        item = httpclient.InferInput("x", [1, 4], "FP32")
        item.set_data_from_numpy(x)
        outputs = [httpclient.InferRequestedOutput("y"), httpclient.InferRequestedOutput("y", binary_data=False)]
        with pytest.raises(InferenceServerException) as caught:
            client.infer("adder", [item], outputs=outputs)
    assert (caught.value.status(), caught.value.message()) == (
        "400",
        "output 'y' already exists in request: each output may be asked for once",
    )


# --- 5. A request waiting for its batch to fill counts against the queue -------------------------------------------


def test_a_request_waiting_for_its_batch_to_fill_counts_against_max_queue_size(v2: V2Server):
    batcher = v2.loaded("slowfill").batcher
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
    first: list[Any] = []
    thread = threading.Thread(
        target=lambda: first.append(v2.request("POST", "/v2/models/slowfill/infer", body.encode()))
    )
    thread.start()
    deadline = time.monotonic() + 20
    while not batcher.started:  # the first request reached the batcher, and waits a second for company
        assert time.monotonic() < deadline, "the first request never reached the batcher"
        time.sleep(0.005)

    second = v2.request("POST", "/v2/models/slowfill/infer", body.encode())
    thread.join(20)

    assert (second.status, second.headers["retry-after"]) == (503, "1")
    assert second.json() == {"error": "model 'slowfill' is overloaded: the queue is full (1 requests)"}
    assert first[0].status == 200
    assert first[0].json()["outputs"][0]["data"] == [5.0, 6.0, 7.0, 8.0]


# --- 7. A model that parses its string inputs is served ------------------------------------------------------------


def test_a_string_parsing_model_that_validation_could_not_run_is_served(v2: V2Server):
    text = np.array([["1", "22"], ["-3", "40"]], dtype=object)
    with httpclient.InferenceServerClient(v2.url) as client:
        item = httpclient.InferInput("text", [2, 2], "BYTES")
        item.set_data_from_numpy(text)
        result = client.infer("strings", [item])
    np.testing.assert_array_equal(result.as_numpy("sum"), np.array([[23], [37]], np.int32))


# --- 8. The device's failures are the server's, not the request's ---------------------------------------------------

ILLEGAL_ACCESS = (
    "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running MatMul node. "
    "Name:'/MatMul' Status Message: CUDA error cudaErrorIllegalAddress:an illegal memory access was encountered"
)
ARENA_FULL = (
    "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running Add node. "
    "Name:'' Status Message: /onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:376 void* "
    "onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*, bool, "
    "onnxruntime::WaitNotificationFn) Failed to allocate memory for requested buffer of size 1073741824"
)
CUDA_OOM = (
    "[ONNXRuntimeError] : 1 : FAIL : CUDA failure 2: out of memory ; GPU=0 ; hostname=gpu-7 ; "
    "file=/onnxruntime_src/onnxruntime/core/providers/cuda/cuda_allocator.cc ; line=50 ; "
    "expr=cudaMalloc((void**)&p, size);"
)
BAD_INPUT = (
    "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code returned while running Reshape node. "
    "Name:'' Status Message: The input tensor cannot be reshaped to the requested shape. Input shape:{1,5}"
)


@pytest.mark.parametrize(
    ("error", "status", "message", "retry"),
    [
        (
            RuntimeException(ILLEGAL_ACCESS),
            500,
            "the device failed while running the model, not because of the request: Non-zero status code returned "
            "while running MatMul node. Name:'/MatMul' Status Message: CUDA error cudaErrorIllegalAddress:an "
            "illegal memory access was encountered",
            None,
        ),
        (
            EPFail("[ONNXRuntimeError] : 11 : EP_FAIL : TensorRT EP execution context enqueue failed."),
            500,
            "the device failed while running the model, not because of the request: "
            "TensorRT EP execution context enqueue failed.",
            None,
        ),
        (
            RuntimeException(CUDA_OOM),
            503,
            f"{OUT_OF_MEMORY} (ONNX Runtime: CUDA failure 2: out of memory)",
            "1",
        ),
        (RuntimeException(ARENA_FULL), 503, None, "1"),
        (RuntimeException(BAD_INPUT), 400, f"inference failed: {BAD_INPUT}", None),
    ],
    ids=["illegal-address", "ep-fail", "cuda-oom", "arena-full", "bad-input"],
)
def test_a_device_failure_is_the_servers_fault_and_not_the_requests(
    v2: V2Server, monkeypatch, error, status, message, retry
):
    def fails(feeds: Any, output_names: Any = None) -> Any:
        raise error

    monkeypatch.setattr(v2.loaded("scores"), "run", fails)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 5], "data": [1, 2, 3, 4, 5]}]}

    response = v2.request("POST", "/v2/models/scores/infer", json.dumps(body).encode())

    assert response.status == status
    if message is not None:
        assert response.json() == {"error": message}
    else:
        assert response.json()["error"].startswith(f"{OUT_OF_MEMORY} (ONNX Runtime: Non-zero status code")
    assert response.headers.get("retry-after") == retry


def test_failed_runs_are_counted_as_failures_in_the_statistics(v2: V2Server, monkeypatch):
    def fails(feeds: Any, output_names: Any = None) -> Any:
        raise RuntimeException(ILLEGAL_ACCESS)

    def stats() -> dict[str, Any]:
        response = v2.request("GET", "/v2/models/scores/stats")
        assert response.status == 200, response.body
        [one] = response.json()["model_stats"]
        return one["inference_stats"]

    before = stats()
    monkeypatch.setattr(v2.loaded("scores"), "run", fails)
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 5], "data": [1, 2, 3, 4, 5]}]})
    assert [v2.request("POST", "/v2/models/scores/infer", body.encode()).status for _ in range(3)] == [500] * 3
    after = stats()
    assert after["fail"]["count"] == before["fail"]["count"] + 3
    assert after["fail"]["ns"] > before["fail"]["ns"]
    assert after["success"]["count"] == before["success"]["count"]
