"""What Triton's own clients and tests check, run against Modelyard: they compare error texts, not only statuses.

Triton's example clients (``simple_http_infer_client.py``, ``simple_http_aio_infer_client.py``,
``simple_grpc_infer_client.py`` and the ``*_health_metadata.py`` ones) run against a model named
``simple`` and test that an unknown model's message starts with "Request for unknown model". Triton's
HTTP tests look for its phrases for a raw binary request that cannot be deduced, a shape whose size
overflows, JSON nested too deeply and an output asked for twice. Modelyard's messages begin with
Triton's phrase and go on with its own detail; these tests do what those clients and tests do.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from inference.errors import InvalidInput
from inference.grpc import grpc_service_pb2 as pb
from inference.grpc import grpc_service_pb2_grpc as pb_grpc
from inference.protocol import decode_request
from tests.support.v2server import V2Server

UNKNOWN_MODEL = "Request for unknown model"
INPUT0 = np.expand_dims(np.arange(0, 16, dtype=np.int32), axis=0)
INPUT1 = np.full(shape=(1, 16), fill_value=-1, dtype=np.int32)
QUERY = {"test_1": 1, "test_2": 2}
RAW = {"Inference-Header-Content-Length": "0"}


def http_inputs(module: Any) -> list[Any]:
    """As the example builds them: INPUT0 as JSON, INPUT1 as binary data."""
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(INPUT0, binary_data=False)
    inputs[1].set_data_from_numpy(INPUT1, binary_data=True)
    return inputs


def http_outputs(module: Any) -> list[Any]:
    return [
        module.InferRequestedOutput("OUTPUT0", binary_data=True),
        module.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]


def refusal(call: Any) -> tuple[str, str]:
    """The status and message of the error ``call`` raises; no traceback outlives it (the client's is a gevent one)."""
    try:
        call()
    except InferenceServerException as exc:
        return str(exc.status()), exc.message()
    raise AssertionError("no error was raised")


def assert_sum_and_difference(result: Any) -> None:
    """The examples' check, element by element: OUTPUT0 is the sum and OUTPUT1 the difference."""
    output0, output1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    for i in range(16):
        assert INPUT0[0][i] + INPUT1[0][i] == output0[0][i], "incorrect sum"
        assert INPUT0[0][i] - INPUT1[0][i] == output1[0][i], "incorrect difference"


# --- The example clients ------------------------------------------------------------------------------------------


def test_simple_http_infer_client_passes_unmodified(v2: V2Server):
    with httpclient.InferenceServerClient(v2.url) as client:
        results = client.infer("simple", http_inputs(httpclient), outputs=http_outputs(httpclient), query_params=QUERY)
        statistics = client.get_inference_statistics(model_name="simple")
        assert len(statistics["model_stats"]) == 1
        assert_sum_and_difference(results)
        assert_sum_and_difference(client.infer("simple", http_inputs(httpclient), outputs=None, query_params=QUERY))

        status, message = refusal(
            lambda: client.infer("wrong_model_name", http_inputs(httpclient), outputs=http_outputs(httpclient))
        )
        assert message.startswith(UNKNOWN_MODEL), message
        assert status == "404"
        _, message = refusal(lambda: client.get_model_metadata("wrong_model_name"))  # simple_http_health_metadata.py
        assert UNKNOWN_MODEL in message


def test_simple_http_aio_infer_client_passes_unmodified(v2: V2Server):
    async def main() -> tuple[Any, ...]:
        client = aioclient.InferenceServerClient(v2.url)
        try:
            results = await client.infer(
                "simple", http_inputs(aioclient), outputs=http_outputs(aioclient), query_params=QUERY
            )
            statistics = await client.get_inference_statistics(model_name="simple")
            without_outputs = await client.infer("simple", http_inputs(aioclient), outputs=None, query_params=QUERY)
            try:
                await client.infer("wrong_model_name", http_inputs(aioclient), outputs=http_outputs(aioclient))
            except InferenceServerException as exc:
                error = exc
            parallel = await asyncio.gather(
                client.infer("simple", http_inputs(aioclient), outputs=http_outputs(aioclient), query_params=QUERY),
                client.infer("simple", http_inputs(aioclient), outputs=None, query_params=QUERY),
            )
            return results, statistics, without_outputs, error, parallel
        finally:
            await client.close()

    results, statistics, without_outputs, error, parallel = asyncio.run(main())
    assert len(statistics["model_stats"]) == 1
    for result in (results, without_outputs, *parallel):
        assert_sum_and_difference(result)
    assert error.message().startswith(UNKNOWN_MODEL), error.message()


def test_simple_grpc_infer_client_passes_unmodified(v2: V2Server):
    ones = np.ones(shape=(1, 16), dtype=np.int32)  # this example's second input
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(INPUT0)
    inputs[1].set_data_from_numpy(ones)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    with grpcclient.InferenceServerClient(v2.grpc_url) as client:
        results = client.infer(model_name="simple", inputs=inputs, outputs=outputs, headers={"test": "1"})
        statistics = client.get_inference_statistics(model_name="simple")
        assert len(statistics.model_stats) == 1
        for result in (results, client.infer(model_name="simple", inputs=inputs, outputs=None)):
            assert np.array_equal(result.as_numpy("OUTPUT0"), INPUT0 + ones)
            assert np.array_equal(result.as_numpy("OUTPUT1"), INPUT0 - ones)

        # simple_grpc_health_metadata.py, and an inference on the wrong name as the HTTP examples send it
        with pytest.raises(InferenceServerException) as caught:
            client.get_model_metadata("wrong_model_name")
        assert UNKNOWN_MODEL in caught.value.message()
        with pytest.raises(InferenceServerException) as caught:
            client.infer(model_name="wrong_model_name", inputs=inputs)
        assert caught.value.message().startswith(UNKNOWN_MODEL)
        assert caught.value.status() == "StatusCode.NOT_FOUND"


# --- Triton's HTTP tests: its phrase first, then ours ---------------------------------------------------------------


def nested(depth: int, value: Any) -> Any:
    for _ in range(depth):
        value = [value]
    return value


def body(*inputs: dict[str, Any], **extra: Any) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


X = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}
SIMPLE = [
    {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": INPUT0.tolist()},
    {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": INPUT1.tolist()},
]


@pytest.mark.parametrize(
    ("path", "payload", "headers", "phrase", "ours"),
    [
        (
            "/v2/models/multi/infer",
            np.arange(24, dtype=np.float32).tobytes(),
            RAW,
            "Raw request must only have 1 input (found 1) to be deduced but got 3 inputs in 'multi' model "
            "configuration",
            "needs a model with exactly one input; this one takes 3 (a, b, text)",
        ),
        (
            "/v2/models/strings/infer",
            b"427",
            RAW,
            "For BYTE datatype raw input 'text', the model must have input shape [1]",
            "input 'text' has shape [-1, 2]",
        ),
        (
            "/v2/models/adder/infer",
            body({**X, "shape": [2**4, 2**60 + 2], "data": [1.0]}),
            {},
            "invalid shape for input 'x': shape [16, 1152921504606846978] causes total element count to exceed "
            "maximum size of",
            "2147483648",
        ),
        (
            "/v2/models/adder/infer",
            body({**X, "shape": [2**2, 2**60 + 2], "data": [1.0]}),
            {},
            "byte size overflow for input 'x': element count (4611686018427387912) * data type size (4) exceeds "
            "maximum allowed size",
            "(9223372036854775807)",
        ),
        (
            "/v2/models/adder/infer",
            body({**X, "data": nested(120, [1.0, 2.0, 3.0, 4.0])}),
            {},
            "JSON nesting depth exceeds maximum allowed limit",
            "(64): input 'x': data is nested 121 deep, and a tensor has at most 64 dimensions",
        ),
        (
            "/v2/models/adder/infer",
            b'{"inputs": ' + b"[" * 2000 + b"]" * 2000 + b"}",
            {},
            "JSON nesting depth exceeds maximum allowed limit",
            "the request JSON is nested too deeply",
        ),
        (
            "/v2/models/simple/infer",
            body(*SIMPLE, outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]),
            {},
            "output 'OUTPUT0' already exists in request",
            "each output may be asked for once",
        ),
        (
            "/v2/models/simple/infer",
            body(SIMPLE[0], SIMPLE[0], SIMPLE[1]),
            {},
            "input 'INPUT0' already exists in request",
            "each input may be sent once",
        ),
        (
            "/v2/models/adder/versions/7/infer",
            body(X),
            {},
            "Request for unknown model: 'adder' version 7 is not found",
            "model 'adder' has no served version or alias '7'",
        ),
    ],
    ids=[
        "raw-several-inputs",
        "raw-bytes-not-one-element",
        "element-count-overflow",
        "byte-size-overflow",
        "data-nested-too-deeply",
        "body-nested-too-deeply",
        "duplicate-output",
        "duplicate-input",
        "unknown-version",
    ],
)
def test_a_refusal_begins_with_tritons_phrase_and_goes_on_with_ours(v2: V2Server, path, payload, headers, phrase, ours):
    response = v2.request("POST", path, payload, headers)
    assert response.status == (404 if phrase.startswith("Request for unknown model") else 400), response.body
    message = response.json()["error"]
    assert message.startswith(phrase), message
    assert ours in message[len(phrase) :], message


def test_json_data_nested_within_the_limit_is_served_as_triton_serves_it(v2: V2Server):
    response = v2.request("POST", "/v2/models/adder/infer", body({**X, "data": nested(50, [1.0, 2.0, 3.0, 4.0])}))
    assert response.status == 200, response.body
    assert response.json()["outputs"][0]["data"] == [2.0, 3.0, 4.0, 5.0]


def test_a_raw_request_with_several_dynamic_dimensions_says_so_in_tritons_words():
    signature = {
        "inputs": [{"name": "INPUT0", "datatype": "FP16", "shape": [-1, -1, -1]}],  # a batch of [-1, -1]
        "outputs": [{"name": "OUTPUT0", "datatype": "FP16", "shape": [-1, -1, -1]}],
    }
    with pytest.raises(InvalidInput) as caught:
        decode_request(np.ones([2, 2], np.float16).tobytes(), "0", signature, model="zero")
    assert caught.value.message.startswith(
        "The shape of the raw input 'INPUT0' can not be deduced because there are more than one variable-sized "
        "dimension: "
    ), caught.value.message


def test_grpc_refuses_an_overflowing_shape_and_a_duplicate_output_in_tritons_words(v2: V2Server):
    def request(shape: list[int], outputs: list[str]) -> pb.ModelInferRequest:
        message = pb.ModelInferRequest(model_name="adder", raw_input_contents=[np.ones(4, np.float32).tobytes()])
        message.inputs.add(name="x", datatype="FP32", shape=shape)
        for name in outputs:
            message.outputs.add(name=name)
        return message

    with grpc.insecure_channel(v2.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for message, phrase in (
            (request([2**4, 2**60 + 2], []), "invalid shape for input 'x': shape [16, 1152921504606846978] causes"),
            (request([2**2, 2**60 + 2], []), "byte size overflow for input 'x': "),
            (request([1, 4], ["y", "y"]), "output 'y' already exists in request"),
        ):
            with pytest.raises(grpc.RpcError) as caught:
                stub.ModelInfer(message)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details().startswith(phrase), caught.value.details()
