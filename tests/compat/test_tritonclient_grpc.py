"""The real tritonclient.grpc (and grpc.aio) against Modelyard's gRPC server, compared with ONNX Runtime run directly.

The same matrix as ``test_tritonclient.py`` runs over HTTP: health, metadata, config, every datatype,
several inputs and outputs, routing, errors with their status codes and our messages, tokens, the
aio client, many concurrent clients, plus what only gRPC has: typed contents, streams, deadlines,
trailing metadata. The server is the package's (``tests/support/v2server.py``): gRPC on the event
loop that serves /v2, over the same data plane.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from functools import partial
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from inference.dataplane import NEEDS_ROLE, NEEDS_TOKEN
from inference.grpc import grpc_service_pb2 as pb
from inference.grpc import grpc_service_pb2_grpc as pb_grpc
from inference.grpc.codec import CONTENTS
from tests.support.onnx_compat import DATATYPES
from tests.support.tensors import assert_same, sample
from tests.support.v2server import LABELS, V2Server

DUPLICATE_Y = "output 'y' already exists in request: each output may be asked for once"
EXTENSIONS = [
    "binary_tensor_data",
    "classification",
    "model_configuration",
    "model_repository",
    "parameters",
    "statistics",
]


@pytest.fixture
def client(v2: V2Server) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(v2.grpc_url) as triton:
        yield triton


@pytest.fixture
def stub(v2: V2Server) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    """The service's own stub, for what tritonclient never sends (typed contents) or never shows (metadata)."""
    with grpc.insecure_channel(v2.grpc_url) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def infer_input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    item = grpcclient.InferInput(name, list(array.shape), datatype)
    item.set_data_from_numpy(array)
    return item


def x_input(x: np.ndarray) -> grpcclient.InferInput:
    return infer_input("x", x, "FP32")


def refused(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


# --- health and metadata ------------------------------------------------------------------------------


def test_server_live_and_ready(client):
    assert client.is_server_live()
    assert client.is_server_ready()


def test_model_ready_for_served_models_and_not_for_unknown_ones(client):
    assert client.is_model_ready("dtypes")
    assert client.is_model_ready("adder", model_version="1")
    assert client.is_model_ready("adder", model_version="canary")
    assert not client.is_model_ready("no-such-model")
    assert not client.is_model_ready("adder", model_version="9")


def test_server_metadata_advertises_exactly_the_extensions_served(client):
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "modelyard"
    assert metadata["version"]
    assert metadata["extensions"] == EXTENSIONS


def test_model_metadata_has_platform_datatypes_and_dynamic_dimensions(client):
    metadata = client.get_model_metadata("multi")
    assert (metadata.name, list(metadata.versions), metadata.platform) == ("multi", ["1"], "onnxruntime_onnx")
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("a", "FP32", [-1, -1]),
        ("b", "INT64", [-1, 2]),
        ("text", "BYTES", [-1]),
    ]
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.outputs] == [
        ("a_plus_one", "FP32", [-1, -1]),
        ("a_positive", "BOOL", [-1, -1]),
        ("b_sum", "INT64", [-1, 1]),
        ("text_out", "BYTES", [-1]),
    ]
    assert [t.datatype for t in client.get_model_metadata("dtypes").outputs] == list(DATATYPES)
    assert list(client.get_model_metadata("adder").versions) == ["1", "2"]
    assert list(client.get_model_metadata("adder", model_version="2").versions) == ["2"]


def test_model_config_as_triton_writes_it(client):
    config = client.get_model_config("batchy").config
    assert (config.name, config.platform, config.backend, config.max_batch_size) == (
        "batchy",
        "onnxruntime_onnx",
        "onnxruntime",
        64,
    )
    assert config.dynamic_batching.max_queue_delay_microseconds == 50_000
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 1024
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [("x", 11, [4])]  # 11: TYPE_FP32
    assert list(config.version_policy.specific.versions) == [1]
    assert config.parameters["execution_provider"].string_value == "CPUExecutionProvider"
    fixed = client.get_model_config("fixed", as_json=True)["config"]
    assert "max_batch_size" not in fixed and "dynamic_batching" not in fixed  # 0 and absent
    assert fixed["input"] == [
        {"name": "a", "data_type": "TYPE_INT64", "dims": ["2", "3"]},
        {"name": "b", "data_type": "TYPE_BOOL", "dims": ["-1"]},
    ]
    types = {i["name"]: i["data_type"] for i in client.get_model_config("dtypes", as_json=True)["config"]["input"]}
    assert (types["in_bytes"], types["in_fp16"], types["in_uint64"]) == ("TYPE_STRING", "TYPE_FP16", "TYPE_UINT64")


# --- inference ------------------------------------------------------------------------------------------


def test_every_datatype_round_trips_raw_and_matches_onnx_runtime(client, v2):
    feeds = {f"in_{t.lower()}": sample(t, rows=4, seed=i) for i, t in enumerate(DATATYPES)}
    inputs = [infer_input(f"in_{t.lower()}", feeds[f"in_{t.lower()}"], t) for t in DATATYPES]
    outputs = [grpcclient.InferRequestedOutput(f"out_{t.lower()}") for t in DATATYPES]

    result = client.infer("dtypes", inputs, outputs=outputs)

    response = result.get_response()
    assert [o.datatype for o in response.outputs] == list(DATATYPES)
    assert len(response.raw_output_contents) == len(DATATYPES)
    for name, want in v2.expected("dtypes", feeds).items():
        assert_same(result.as_numpy(name), want)


def typed_tensor(name: str, array: np.ndarray, datatype: str) -> pb.ModelInferRequest.InferInputTensor:
    tensor = pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=array.shape)
    values = [v.encode() for v in array.flat] if datatype == "BYTES" else array.reshape(-1).tolist()
    getattr(tensor.contents, CONTENTS[datatype]).extend(values)
    return tensor


def test_every_datatype_with_typed_contents_comes_back_typed(stub, v2):
    types = [t for t in DATATYPES if t != "FP16"]  # FP16 has no typed field in the protocol
    feeds = {f"in_{t.lower()}": sample(t, rows=3, seed=i) for i, t in enumerate(types)}
    request = pb.ModelInferRequest(
        model_name="typed", inputs=[typed_tensor(f"in_{t.lower()}", feeds[f"in_{t.lower()}"], t) for t in types]
    )

    response = stub.ModelInfer(request)

    assert len(response.raw_output_contents) == 0
    expected = v2.expected("typed", feeds)
    for output, datatype in zip(response.outputs, types, strict=True):
        want = expected[output.name]
        assert (output.datatype, list(output.shape)) == (datatype, list(want.shape))
        got = list(getattr(output.contents, CONTENTS[datatype]))
        if datatype == "BYTES":
            assert got == [v.encode() for v in want.flat]
        elif datatype == "FP32":
            np.testing.assert_array_equal(np.array(got, np.float32), want.reshape(-1))
        else:
            assert got == want.reshape(-1).tolist()


def test_typed_contents_that_do_not_fit_are_refused_by_name(stub):
    request = pb.ModelInferRequest(model_name="dtypes")
    request.inputs.append(typed_tensor("in_fp16", np.ones((1, 3), np.float16), "FP32"))
    request.inputs[0].datatype = "FP16"
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "input 'in_fp16': FP16 has no typed contents field; send it in raw_input_contents"

    tensor = pb.ModelInferRequest.InferInputTensor(name="in_int8", datatype="INT8", shape=[1, 3])
    tensor.contents.int_contents.extend([1, 2, 300])
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(pb.ModelInferRequest(model_name="typed", inputs=[tensor]))
    assert caught.value.details() == (
        "input 'in_int8': contents.int_contents do not fit INT8: Python integer 300 out of bounds for int8"
    )

    x = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[2, 4])
    x.contents.fp32_contents.extend([1.0] * 7)
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(pb.ModelInferRequest(model_name="adder", inputs=[x]))
    assert caught.value.details() == "input 'x': shape [2, 4] needs 8 values, got 7 in contents.fp32_contents"

    raw = pb.ModelInferRequest(model_name="adder", inputs=[x], raw_input_contents=[b"\x00" * 32])
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(raw)
    assert caught.value.details() == "input 'x' has contents as well as raw_input_contents; send one or the other"


def test_several_inputs_and_outputs_with_dynamic_dimensions(client, v2):
    for rows, cols in ((1, 1), (3, 5), (7, 2)):
        a = np.linspace(-3, 3, rows * cols, dtype=np.float32).reshape(rows, cols)
        b = np.arange(rows * 2, dtype=np.int64).reshape(rows, 2) - 3
        text = np.array([f"row {i} ✓" for i in range(rows)], dtype=object)
        inputs = [infer_input("a", a, "FP32"), infer_input("b", b, "INT64"), infer_input("text", text, "BYTES")]
        result = client.infer("multi", inputs)
        names = ["a_plus_one", "a_positive", "b_sum", "text_out"]
        for name, want in zip(names, v2.reference("multi").run(names, {"a": a, "b": b, "text": text}), strict=True):
            assert_same(result.as_numpy(name), want)


def test_a_fixed_shape_model_without_batch_dimension(client, v2):
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    b = np.array([True, False, True, True])
    result = client.infer("fixed", [infer_input("a", a, "INT64"), infer_input("b", b, "BOOL")])
    s, t = v2.reference("fixed").run(["s", "t"], {"a": a, "b": b})
    assert_same(result.as_numpy("s"), s)
    assert_same(result.as_numpy("t"), t)


def test_requested_outputs_come_back_alone_and_in_the_asked_order(client):
    inputs = [
        infer_input("a", np.ones((2, 2), np.float32), "FP32"),
        infer_input("b", np.ones((2, 2), np.int64), "INT64"),
        infer_input("text", np.array(["p", "q"], dtype=object), "BYTES"),
    ]
    outputs = [grpcclient.InferRequestedOutput("text_out"), grpcclient.InferRequestedOutput("b_sum")]
    result = client.infer("multi", inputs, outputs=outputs)
    assert [o.name for o in result.get_response().outputs] == ["text_out", "b_sum"]
    assert result.as_numpy("a_plus_one") is None
    np.testing.assert_array_equal(result.as_numpy("b_sum"), [[2], [2]])
    np.testing.assert_array_equal(result.as_numpy("text_out"), np.array([b"p", b"q"], dtype=object))


def test_nan_and_infinity_survive(client):
    x = np.array([[np.nan, np.inf, -np.inf, -0.0]], dtype=np.float32)
    np.testing.assert_array_equal(client.infer("adder", [x_input(x)]).as_numpy("y"), x + 1)


def test_request_id_is_echoed(client):
    x = np.zeros((1, 4), np.float32)
    assert client.infer("adder", [x_input(x)], request_id="req-42").get_response().id == "req-42"
    assert client.infer("adder", [x_input(x)]).get_response().id == ""


@pytest.mark.parametrize(
    ("version", "bias", "served"),
    [("", 1.0, "1"), ("1", 1.0, "1"), ("2", 2.0, "2"), ("canary", 2.0, "2"), ("production", 1.0, "1")],
    ids=["none-is-production", "number-1", "number-2", "alias-canary", "alias-production"],
)
def test_version_routing(client, version, bias, served):
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    result = client.infer("adder", [x_input(x)], model_version=version)
    assert (result.get_response().model_name, result.get_response().model_version) == ("adder", served)
    assert_same(result.as_numpy("y"), x + np.float32(bias))


def test_priority_timeout_and_a_deadline_are_accepted(client):
    x = np.ones((1, 4), np.float32)
    result = client.infer("adder", [x_input(x)], priority=1, timeout=10_000_000, client_timeout=30)
    assert_same(result.as_numpy("y"), x + 1)


def test_compressed_requests(client, v2):
    feeds = {f"in_{t.lower()}": sample(t, rows=16, seed=3) for t in DATATYPES}
    inputs = [infer_input(f"in_{t.lower()}", feeds[f"in_{t.lower()}"], t) for t in DATATYPES]
    for algorithm in ("gzip", "deflate"):
        result = client.infer("dtypes", inputs, compression_algorithm=algorithm)
        for name, want in v2.expected("dtypes", feeds).items():
            assert_same(result.as_numpy(name), want)


def test_classification_with_labels(client):
    scores = np.array([[0.1, 0.7, 0.05, 0.9, 0.2]], np.float32)
    result = client.infer("scores", [x_input(scores)], outputs=[grpcclient.InferRequestedOutput("out", class_count=2)])
    np.testing.assert_array_equal(result.as_numpy("out"), np.array([[b"0.900000:3:owl", b"0.700000:1:dog"]]))
    assert LABELS[1] == "dog"


# --- errors: status codes and our messages ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "inputs", "outputs", "code", "message"),
    [
        ("adder", [("x", (2, 5), "FP32")], None, "INVALID_ARGUMENT", "input 'x': expected shape [-1, 4], got [2, 5]"),
        ("adder", [("x", (2, 4), "INT32")], None, "INVALID_ARGUMENT", "input 'x': expected datatype FP32, got INT32"),
        ("adder", [("z", (1, 4), "FP32")], None, "INVALID_ARGUMENT", "unknown input 'z'; the model takes x"),
        ("adder", [("x", (1, 4), "FP32")], ["w"], "INVALID_ARGUMENT", "unknown output 'w'; the model gives y"),
        ("adder", [("x", (1, 4), "FP32")], ["y", "y"], "INVALID_ARGUMENT", DUPLICATE_Y),
        ("multi", [("a", (1, 1), "FP32")], None, "INVALID_ARGUMENT", "missing input(s): b, text"),
        (
            "no-such-model",
            [("x", (1, 4), "FP32")],
            None,
            "NOT_FOUND",
            "Request for unknown model: 'no-such-model' is not found",
        ),
    ],
    ids=["shape", "datatype", "unknown-input", "unknown-output", "output-twice", "missing-input", "unknown-model"],
)
def test_bad_requests_get_the_status_code_and_our_message(client, model, inputs, outputs, code, message):
    items = [
        infer_input(name, np.ones(shape, np.dtype(dt.lower().replace("fp", "float"))), dt) for name, shape, dt in inputs
    ]
    requested = [grpcclient.InferRequestedOutput(name) for name in outputs] if outputs else None
    error = refused(lambda: client.infer(model, items, outputs=requested))
    assert (error.status(), error.message()) == (f"StatusCode.{code}", message)


def test_unknown_version_and_unknown_model_elsewhere_are_not_found(client):
    error = refused(lambda: client.infer("adder", [x_input(np.ones((1, 4), np.float32))], model_version="7"))
    assert (error.status(), error.message()) == (
        "StatusCode.NOT_FOUND",
        "Request for unknown model: 'adder' version 7 is not found: model 'adder' has no served version or alias '7'",
    )
    for call in (partial(client.get_model_metadata, "nope"), partial(client.get_model_config, "nope")):
        error = refused(call)
        assert (error.status(), error.message()) == (
            "StatusCode.NOT_FOUND",
            "Request for unknown model: 'nope' is not found",
        )


def test_bytes_that_are_not_utf8_are_refused_by_name(client):
    inputs = [
        infer_input("a", np.ones((1, 1), np.float32), "FP32"),
        infer_input("b", np.ones((1, 2), np.int64), "INT64"),
        infer_input("text", np.array([b"\xff\xfe"], dtype=object), "BYTES"),
    ]
    error = refused(lambda: client.infer("multi", inputs))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.message() == "input 'text': BYTES element 0 is not valid UTF-8, which ONNX Runtime string tensors need"


def test_a_full_queue_is_unavailable_with_retry_after(stub, v2, monkeypatch):
    """The gated model (max_queue_size 1) with its run held: one runs, one waits, the third is refused."""
    hold, running = threading.Event(), threading.Event()
    loaded = v2.loaded("gated")
    real = loaded.run

    def held(feeds: Any, output_names: Any = None) -> Any:
        running.set()
        assert hold.wait(30)
        return real(feeds, output_names)

    monkeypatch.setattr(loaded, "run", held)
    x = np.ones((1, 4), np.float32)
    request = pb.ModelInferRequest(model_name="gated", raw_input_contents=[x.tobytes()])
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    pending = [stub.ModelInfer.future(request)]
    assert running.wait(20)
    pending.append(stub.ModelInfer.future(request))
    deadline = 200
    while loaded.batcher.queued < 1 and deadline:
        deadline -= 1
        threading.Event().wait(0.05)
    try:
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request)
    finally:
        hold.set()
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert caught.value.details() == "model 'gated' is overloaded: the queue is full (1 requests)"
    assert dict(caught.value.trailing_metadata())["retry-after"] == "1"
    for call in pending:
        assert np.frombuffer(call.result(timeout=30).raw_output_contents[0], "<f4").tolist() == [4.0] * 4


def test_a_request_past_its_timeout_in_the_queue_is_deadline_exceeded(client, v2, monkeypatch):
    hold, running = threading.Event(), threading.Event()
    loaded = v2.loaded("gated")
    real = loaded.run

    def held(feeds: Any, output_names: Any = None) -> Any:
        running.set()
        assert hold.wait(30)
        return real(feeds, output_names)

    monkeypatch.setattr(loaded, "run", held)
    x = np.ones((1, 4), np.float32)
    blocker: queue.Queue[Any] = queue.Queue()
    client.async_infer("gated", [x_input(x)], callback=lambda result, error: blocker.put((result, error)))
    assert running.wait(20)
    late: queue.Queue[Any] = queue.Queue()
    # 1 us: long gone by the time the blocker's run ends, however fast this machine is.
    client.async_infer("gated", [x_input(x)], timeout=1, callback=lambda result, error: late.put((result, error)))
    while loaded.batcher.queued < 1:
        threading.Event().wait(0.01)
    hold.set()
    result, error = blocker.get(timeout=30)
    assert error is None and result.as_numpy("y").tolist() == [[4.0] * 4]
    result, error = late.get(timeout=30)
    assert result is None
    assert error.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert error.message() == "the request timed out in the queue before it ran (timeout 1 us)"


def test_an_oversized_message_is_resource_exhausted(client):
    x = np.ones((300_000, 4), np.float32)  # 4.8 MB; the fixture's server takes 4 MiB
    error = refused(lambda: client.infer("adder", [x_input(x)]))
    assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "larger than max" in error.message() and f"vs. {4 * 1024**2})" in error.message()


# --- authentication ----------------------------------------------------------------------------------------


def test_without_public_inference_the_token_travels_as_authorization_metadata(v2, settings):
    settings.INFERENCE_PUBLIC = False
    x = np.ones((1, 4), np.float32)
    with grpcclient.InferenceServerClient(v2.grpc_url) as triton:
        assert triton.is_server_live() and triton.is_server_ready()  # health stays open for probes
        for headers, code, message in (
            (None, "StatusCode.UNAUTHENTICATED", NEEDS_TOKEN),
            ({"authorization": "Bearer nonsense"}, "StatusCode.UNAUTHENTICATED", NEEDS_TOKEN),
            ({"authorization": f"Bearer {v2.viewer_token}"}, "StatusCode.PERMISSION_DENIED", NEEDS_ROLE),
        ):
            for call in (
                partial(triton.infer, "adder", [x_input(x)], headers=headers),
                partial(triton.is_model_ready, "adder", headers=headers),
                partial(triton.get_model_metadata, "adder", headers=headers),
                partial(triton.get_inference_statistics, "adder", headers=headers),
                partial(triton.get_model_repository_index, headers=headers),
            ):
                error = refused(call)
                assert (error.status(), error.message()) == (code, message)
        headers = {"authorization": f"Bearer {v2.inference_token}"}
        assert triton.is_model_ready("adder", headers=headers)
        assert triton.get_model_metadata("adder", headers=headers).name == "adder"
        assert_same(triton.infer("adder", [x_input(x)], headers=headers).as_numpy("y"), x + 1)


# --- extensions ------------------------------------------------------------------------------------------------


def test_statistics_count_the_requests_sent(client):
    def stats() -> Any:
        [one] = client.get_inference_statistics("echo").model_stats
        return one

    before = stats()
    for rows in (1, 3, 2):
        text = np.array([f"t{i}" for i in range(rows)], dtype=object)
        assert client.infer("echo", [infer_input("x", text, "BYTES")]).as_numpy("out").shape == (rows,)
    after = stats()
    assert (after.name, after.version) == ("echo", "1")
    assert after.inference_stats.success.count - before.inference_stats.success.count == 3
    assert after.inference_stats.compute_infer.count - before.inference_stats.compute_infer.count == 3
    assert after.inference_count - before.inference_count == 6
    assert after.inference_stats.fail.count == before.inference_stats.fail.count
    everything = client.get_inference_statistics(as_json=True)["model_stats"]
    assert ("echo", "1") in {(s["name"], s["version"]) for s in everything}
    error = refused(lambda: client.get_inference_statistics("nope"))
    assert error.status() == "StatusCode.NOT_FOUND"


def test_repository_index_and_load_unload_refused(client):
    index = client.get_model_repository_index().models
    assert ("adder", "2", "READY") in {(m.name, m.version, m.state) for m in index}
    assert len(client.get_model_repository_index().models) == len(index)
    for call, action in ((client.load_model, "load"), (client.unload_model, "unload")):
        error = refused(partial(call, "adder"))
        assert error.status() == "StatusCode.FAILED_PRECONDITION"
        assert error.message().startswith(f"models are not {action}ed on request: they are loaded by promotion")


# --- streaming -----------------------------------------------------------------------------------------------------


def test_a_stream_answers_each_request_and_an_error_does_not_end_it(client):
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        sent = {}
        for i in range(12):
            x = np.full((1 + i % 3, 4), i, np.float32)
            sent[f"r{i}"] = x
            client.async_stream_infer("adder", [x_input(x)], request_id=f"r{i}", model_version="canary")
        client.async_stream_infer("adder", [infer_input("x", np.ones((1, 3), np.float32), "FP32")], request_id="bad")
        sent["after"] = np.full((2, 4), 99, np.float32)
        client.async_stream_infer("adder", [x_input(sent["after"])], request_id="after")
        got = [answers.get(timeout=30) for _ in range(len(sent) + 1)]
    finally:
        client.stop_stream()
    errors = [error for result, error in got if error is not None]
    assert [e.message() for e in errors] == ["input 'x': expected shape [-1, 4], got [1, 3]"]
    results = {result.get_response().id: result for result, error in got if error is None}
    assert set(results) == set(sent)
    for request_id, x in sent.items():
        bias = 1.0 if request_id == "after" else 2.0  # "after" went to production, the rest to canary
        assert_same(results[request_id].as_numpy("y"), x + np.float32(bias))


def test_a_stream_without_a_token_is_unauthenticated_and_one_without_the_role_permission_denied(v2, settings):
    settings.INFERENCE_PUBLIC = False
    for headers, code, message in (
        (None, "StatusCode.UNAUTHENTICATED", NEEDS_TOKEN),
        ({"authorization": f"Bearer {v2.viewer_token}"}, "StatusCode.PERMISSION_DENIED", NEEDS_ROLE),
    ):
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        with grpcclient.InferenceServerClient(v2.grpc_url) as triton:
            triton.start_stream(
                callback=lambda result, error, answers=answers: answers.put((result, error)), headers=headers
            )
            try:
                result, error = answers.get(timeout=30)  # refused as it opens, before any request
            finally:
                triton.stop_stream()
        assert result is None
        assert (error.status(), error.message()) == (code, message)


# --- tritonclient.grpc.aio -----------------------------------------------------------------------------------------


def test_aio_client_metadata_infer_and_an_error(v2):
    feeds = {f"in_{t.lower()}": sample(t, rows=5, seed=11) for t in DATATYPES}

    async def main() -> tuple[Any, ...]:
        async with aioclient.InferenceServerClient(v2.grpc_url) as triton:
            live = await triton.is_server_live()
            ready = await triton.is_model_ready("dtypes")
            server = await triton.get_server_metadata(as_json=True)
            config = await triton.get_model_config("dtypes", as_json=True)
            inputs = []
            for t in DATATYPES:
                item = aioclient.InferInput(f"in_{t.lower()}", [5, 3], t)
                item.set_data_from_numpy(feeds[f"in_{t.lower()}"])
                inputs.append(item)
            result = await triton.infer("dtypes", inputs, request_id="aio-1")
            bad = aioclient.InferInput("x", [1, 3], "FP32")
            bad.set_data_from_numpy(np.ones((1, 3), np.float32))
            try:
                await triton.infer("adder", [bad])
            except InferenceServerException as exc:
                error = exc
            return live, ready, server, config, result, error

    live, ready, server, config, result, error = asyncio.run(main())
    assert live and ready
    assert server["extensions"] == EXTENSIONS
    assert config["config"]["max_batch_size"] == 32
    assert result.get_response().id == "aio-1"
    for name, want in v2.expected("dtypes", feeds).items():
        assert_same(result.as_numpy(name), want)
    assert (error.status(), error.message()) == (
        "StatusCode.INVALID_ARGUMENT",
        "input 'x': expected shape [-1, 4], got [1, 3]",
    )


def test_64_concurrent_clients_each_get_their_own_outputs(v2):
    """64 aio clients, each on its own channel, on the batching model: requests merge, answers split back exactly."""
    clients, rounds = 64, 5

    async def one(client_id: int) -> list[tuple[np.ndarray, np.ndarray]]:
        answers = []
        async with aioclient.InferenceServerClient(v2.grpc_url) as triton:
            for round_ in range(rounds):
                rows = 1 + (client_id + round_) % 3
                x = (np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + client_id * 1000 + round_ * 100).astype(
                    np.float32
                )
                item = aioclient.InferInput("x", list(x.shape), "FP32")
                item.set_data_from_numpy(x)
                result = await triton.infer("batchy", [item], request_id=f"{client_id}-{round_}")
                assert result.get_response().id == f"{client_id}-{round_}"
                answers.append((x, result.as_numpy("y")))
        return answers

    async def main() -> list[list[tuple[np.ndarray, np.ndarray]]]:
        return await asyncio.gather(*(one(i) for i in range(clients)))

    before = v2.loaded("batchy").stats.execution_count
    everything = asyncio.run(main())
    assert sum(len(answers) for answers in everything) == clients * rounds
    for answers in everything:
        for x, y in answers:
            assert_same(y, x + np.float32(0.5))
    # They were merged: fewer runs than requests.
    assert v2.loaded("batchy").stats.execution_count - before < clients * rounds
