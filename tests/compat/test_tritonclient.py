"""The real tritonclient (http and http.aio) against the /v2 data plane, compared with ONNX Runtime run directly."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from inference.dataplane import NEEDS_ROLE, NEEDS_TOKEN, SHARED_MEMORY_OFF
from tests.support.onnx_compat import DATATYPES
from tests.support.tensors import assert_same, sample
from tests.support.v2server import V2Server


@pytest.fixture
def client(v2: V2Server) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(v2.url) as triton:
        yield triton


def infer_input(name: str, array: np.ndarray, datatype: str, *, binary: bool) -> httpclient.InferInput:
    item = httpclient.InferInput(name, list(array.shape), datatype)
    item.set_data_from_numpy(array, binary_data=binary)
    return item


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


def test_server_metadata_lists_the_binary_tensor_extension(client):
    metadata = client.get_server_metadata()
    assert metadata["name"] == "modelyard"
    assert metadata["version"]
    assert "binary_tensor_data" in metadata["extensions"]


def test_model_metadata_has_platform_datatypes_and_dynamic_dimensions(client):
    metadata = client.get_model_metadata("multi")
    assert metadata["name"] == "multi"
    assert metadata["platform"] == "onnxruntime_onnx"
    assert metadata["versions"] == ["1"]
    assert metadata["inputs"] == [
        {"name": "a", "datatype": "FP32", "shape": [-1, -1]},
        {"name": "b", "datatype": "INT64", "shape": [-1, 2]},
        {"name": "text", "datatype": "BYTES", "shape": [-1]},
    ]
    assert metadata["outputs"] == [
        {"name": "a_plus_one", "datatype": "FP32", "shape": [-1, -1]},
        {"name": "a_positive", "datatype": "BOOL", "shape": [-1, -1]},
        {"name": "b_sum", "datatype": "INT64", "shape": [-1, 1]},
        {"name": "text_out", "datatype": "BYTES", "shape": [-1]},
    ]


def test_model_metadata_names_every_datatype(client):
    metadata = client.get_model_metadata("dtypes")
    assert [(i["name"], i["datatype"], i["shape"]) for i in metadata["inputs"]] == [
        (f"in_{t.lower()}", t, [-1, 3]) for t in DATATYPES
    ]
    assert [o["datatype"] for o in metadata["outputs"]] == list(DATATYPES)


def test_model_metadata_of_a_version_and_of_a_model_with_two(client):
    assert client.get_model_metadata("adder")["versions"] == ["1", "2"]
    assert client.get_model_metadata("adder", model_version="2")["versions"] == ["2"]


def test_model_config_of_a_batching_model_leaves_out_the_batch_dimension(client):
    config = client.get_model_config("batchy")
    assert config["name"] == "batchy"
    assert config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == 64
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 50_000
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}]
    assert config["output"] == [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}]


def test_model_config_of_a_fixed_shape_model_does_not_batch(client):
    config = client.get_model_config("fixed")
    assert config["max_batch_size"] == 0
    assert "dynamic_batching" not in config
    assert config["input"] == [
        {"name": "a", "data_type": "TYPE_INT64", "dims": [2, 3]},
        {"name": "b", "data_type": "TYPE_BOOL", "dims": [-1]},
    ]


def test_model_config_types_strings_as_triton_does(client):
    config = client.get_model_config("dtypes")
    types = {i["name"]: i["data_type"] for i in config["input"]}
    assert types["in_bytes"] == "TYPE_STRING"
    assert types["in_fp16"] == "TYPE_FP16"
    assert types["in_uint64"] == "TYPE_UINT64"


# --- inference ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_datatype_round_trips_and_matches_onnx_runtime(client, v2, binary):
    feeds = {f"in_{t.lower()}": sample(t, rows=4, seed=i) for i, t in enumerate(DATATYPES)}
    inputs = [infer_input(f"in_{t.lower()}", feeds[f"in_{t.lower()}"], t, binary=binary) for t in DATATYPES]
    outputs = [httpclient.InferRequestedOutput(f"out_{t.lower()}", binary_data=binary) for t in DATATYPES]

    result = client.infer("dtypes", inputs, outputs=outputs)

    expected = v2.expected("dtypes", feeds)
    response = result.get_response()
    assert [o["datatype"] for o in response["outputs"]] == list(DATATYPES)
    for datatype in DATATYPES:
        name = f"out_{datatype.lower()}"
        assert ("parameters" in next(o for o in response["outputs"] if o["name"] == name)) == binary
        assert_same(result.as_numpy(name), expected[name])


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_each_datatype_alone_with_binary_input_and_json_output(client, v2, datatype):
    """Mixing the two encodings in one request: binary in, JSON out (and every other input as JSON)."""
    feeds = {f"in_{t.lower()}": sample(t, rows=2, seed=7) for t in DATATYPES}
    inputs = [infer_input(f"in_{t.lower()}", feeds[f"in_{t.lower()}"], t, binary=(t == datatype)) for t in DATATYPES]
    name = f"out_{datatype.lower()}"
    result = client.infer("dtypes", inputs, outputs=[httpclient.InferRequestedOutput(name, binary_data=False)])
    (expected,) = v2.reference("dtypes").run([name], feeds)
    assert [o["name"] for o in result.get_response()["outputs"]] == [name]
    assert_same(result.as_numpy(name), expected)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_several_inputs_and_outputs_with_dynamic_dimensions(client, v2, binary):
    for rows, cols in ((1, 1), (3, 5), (7, 2)):
        a = np.linspace(-3, 3, rows * cols, dtype=np.float32).reshape(rows, cols)
        b = np.arange(rows * 2, dtype=np.int64).reshape(rows, 2) - 3
        text = np.array([f"row {i} ✓" for i in range(rows)], dtype=object)
        inputs = [
            infer_input("a", a, "FP32", binary=binary),
            infer_input("b", b, "INT64", binary=binary),
            infer_input("text", text, "BYTES", binary=binary),
        ]
        names = ["a_plus_one", "a_positive", "b_sum", "text_out"]
        outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in names]
        result = client.infer("multi", inputs, outputs=outputs)
        expected = v2.reference("multi").run(names, {"a": a, "b": b, "text": text})
        for name, want in zip(names, expected, strict=True):
            assert_same(result.as_numpy(name), want)


def test_default_outputs_are_all_binary(client, v2):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = client.infer("adder", [infer_input("x", x, "FP32", binary=True)])  # no outputs: binary_data_output
    (output,) = result.get_response()["outputs"]
    assert output["parameters"]["binary_data_size"] == x.nbytes
    assert_same(result.as_numpy("y"), x + 1)


def test_a_fixed_shape_model_without_batch_dimension(client, v2):
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    b = np.array([True, False, True, True])
    result = client.infer(
        "fixed", [infer_input("a", a, "INT64", binary=True), infer_input("b", b, "BOOL", binary=False)]
    )
    s, t = v2.reference("fixed").run(["s", "t"], {"a": a, "b": b})
    assert_same(result.as_numpy("s"), s)
    assert_same(result.as_numpy("t"), t)


def test_requested_output_subset_comes_back_alone_and_in_the_asked_order(client, v2):
    a = np.ones((2, 2), np.float32)
    b = np.ones((2, 2), np.int64)
    text = np.array(["p", "q"], dtype=object)
    inputs = [infer_input("a", a, "FP32", binary=True), infer_input("b", b, "INT64", binary=True)]
    inputs.append(infer_input("text", text, "BYTES", binary=True))
    outputs = [httpclient.InferRequestedOutput("text_out"), httpclient.InferRequestedOutput("b_sum", binary_data=False)]

    result = client.infer("multi", inputs, outputs=outputs)

    assert [o["name"] for o in result.get_response()["outputs"]] == ["text_out", "b_sum"]
    assert result.as_numpy("a_plus_one") is None
    np.testing.assert_array_equal(result.as_numpy("b_sum"), [[2], [2]])
    np.testing.assert_array_equal(result.as_numpy("text_out"), np.array([b"p", b"q"], dtype=object))


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_nan_and_infinity_survive_both_output_encodings(client, binary):
    x = np.array([[np.nan, np.inf, -np.inf, -0.0]], dtype=np.float32)
    result = client.infer(
        "adder",
        [infer_input("x", x, "FP32", binary=True)],
        outputs=[httpclient.InferRequestedOutput("y", binary_data=binary)],
    )
    np.testing.assert_array_equal(result.as_numpy("y"), x + 1)


def test_nan_in_json_input_is_refused_because_json_has_none(client):
    x = np.array([[1.0, np.nan, 2.0, 3.0]], dtype=np.float32)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("adder", [infer_input("x", x, "FP32", binary=False)])
    assert caught.value.status() == "400"
    assert caught.value.message() == (
        "input 'x': data[1] is NaN as FP32; JSON input data must be finite numbers "
        "(send NaN and Infinity as binary tensor data)"
    )


def test_an_extension_turned_off_raises_our_message(client):
    with pytest.raises(InferenceServerException) as caught:
        client.get_system_shared_memory_status()
    assert caught.value.status() == "501"
    assert caught.value.message() == SHARED_MEMORY_OFF


def test_an_endpoint_we_do_not_have_raises_our_message(client):
    with pytest.raises(InferenceServerException) as caught:
        client.update_trace_settings(model_name="adder", settings={"trace_level": ["TIMESTAMPS"]})
    assert caught.value.status() == "404"
    assert caught.value.message() == "no such endpoint: POST /v2/models/adder/trace/setting"


def test_request_id_is_echoed(client):
    x = np.zeros((1, 4), np.float32)
    result = client.infer("adder", [infer_input("x", x, "FP32", binary=True)], request_id="req-42")
    assert result.get_response()["id"] == "req-42"
    result = client.infer("adder", [infer_input("x", x, "FP32", binary=True)])
    assert "id" not in result.get_response()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_compressed_requests(client, v2, algorithm, binary):
    feeds = {f"in_{t.lower()}": sample(t, rows=16, seed=3) for t in DATATYPES}
    inputs = [infer_input(f"in_{t.lower()}", feeds[f"in_{t.lower()}"], t, binary=binary) for t in DATATYPES]
    result = client.infer("dtypes", inputs, request_compression_algorithm=algorithm)
    for name, want in v2.expected("dtypes", feeds).items():
        assert_same(result.as_numpy(name), want)


def test_compressed_responses_are_read_by_the_client(client):
    x = np.ones((3, 4), np.float32)
    result = client.infer("adder", [infer_input("x", x, "FP32", binary=True)], response_compression_algorithm="gzip")
    assert_same(result.as_numpy("y"), x + 1)


@pytest.mark.parametrize(
    ("version", "bias", "served"),
    [("", 1.0, "1"), ("1", 1.0, "1"), ("2", 2.0, "2"), ("canary", 2.0, "2"), ("production", 1.0, "1")],
    ids=["none-is-production", "number-1", "number-2", "alias-canary", "alias-production"],
)
def test_version_routing(client, version, bias, served):
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    result = client.infer("adder", [infer_input("x", x, "FP32", binary=True)], model_version=version)
    assert result.get_response()["model_name"] == "adder"
    assert result.get_response()["model_version"] == served
    assert_same(result.as_numpy("y"), x + np.float32(bias))


def test_priority_and_timeout_parameters_are_accepted(client):
    x = np.ones((1, 4), np.float32)
    result = client.infer("adder", [infer_input("x", x, "FP32", binary=True)], priority=1, timeout=10_000_000)
    assert_same(result.as_numpy("y"), x + 1)


# --- errors carry our message -----------------------------------------------------------------------------


def test_wrong_shape_names_the_input_and_both_shapes(client):
    x = np.ones((2, 5), np.float32)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("adder", [infer_input("x", x, "FP32", binary=True)])
    assert caught.value.message() == "input 'x': expected shape [-1, 4], got [2, 5]"
    assert caught.value.status() == "400"


def test_wrong_datatype_names_the_input_and_both_datatypes(client):
    x = np.ones((2, 4), np.int32)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("adder", [infer_input("x", x, "INT32", binary=False)])
    assert caught.value.message() == "input 'x': expected datatype FP32, got INT32"
    assert caught.value.status() == "400"


def test_unknown_input_is_named(client):
    with pytest.raises(InferenceServerException) as caught:
        client.infer("adder", [infer_input("z", np.ones((1, 4), np.float32), "FP32", binary=True)])
    assert caught.value.message() == "unknown input 'z'; the model takes x"
    assert caught.value.status() == "400"


def test_unknown_output_is_named(client):
    x = np.ones((1, 4), np.float32)
    with pytest.raises(InferenceServerException) as caught:
        client.infer(
            "adder", [infer_input("x", x, "FP32", binary=True)], outputs=[httpclient.InferRequestedOutput("w")]
        )
    assert caught.value.message() == "unknown output 'w'; the model gives y"


def test_missing_input_is_named(client):
    a = np.ones((1, 1), np.float32)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("multi", [infer_input("a", a, "FP32", binary=True)])
    assert caught.value.message() == "missing input(s): b, text"


def test_unknown_model_is_a_404_with_our_message(client):
    with pytest.raises(InferenceServerException) as caught:
        client.infer("no-such-model", [infer_input("x", np.ones((1, 4), np.float32), "FP32", binary=True)])
    assert caught.value.message() == "Request for unknown model: 'no-such-model' is not found"
    assert caught.value.status() == "404"
    with pytest.raises(InferenceServerException) as caught:
        client.get_model_metadata("no-such-model")
    assert caught.value.message() == "Request for unknown model: 'no-such-model' is not found"
    with pytest.raises(InferenceServerException) as caught:
        client.get_model_config("no-such-model")
    assert caught.value.status() == "404"


def test_unknown_version_is_a_404_naming_it(client):
    with pytest.raises(InferenceServerException) as caught:
        client.infer("adder", [infer_input("x", np.ones((1, 4), np.float32), "FP32", binary=True)], model_version="7")
    assert caught.value.message() == (
        "Request for unknown model: 'adder' version 7 is not found: model 'adder' has no served version or alias '7'"
    )
    assert caught.value.status() == "404"


def test_bytes_that_are_not_utf8_are_refused_by_name(client):
    text = np.array([b"\xff\xfe"], dtype=object)
    inputs = [
        infer_input("a", np.ones((1, 1), np.float32), "FP32", binary=True),
        infer_input("b", np.ones((1, 2), np.int64), "INT64", binary=True),
        infer_input("text", text, "BYTES", binary=True),
    ]
    with pytest.raises(InferenceServerException) as caught:
        client.infer("multi", inputs)
    assert caught.value.status() == "400"
    assert caught.value.message() == (
        "input 'text': BYTES element 0 is not valid UTF-8, which ONNX Runtime string tensors need"
    )


# --- authentication ------------------------------------------------------------------------------------------


def test_without_public_inference_a_token_with_the_inference_role_is_needed(v2, settings):
    settings.INFERENCE_PUBLIC = False
    x = np.ones((1, 4), np.float32)
    with httpclient.InferenceServerClient(v2.url) as triton:
        assert triton.is_server_live()  # health stays open for probes
        for headers, status, message in (
            (None, "401", NEEDS_TOKEN),
            ({"Authorization": "Bearer nonsense"}, "401", NEEDS_TOKEN),
            ({"Authorization": f"Bearer {v2.viewer_token}"}, "403", NEEDS_ROLE),  # valid, but a viewer's
        ):
            with pytest.raises(InferenceServerException) as caught:
                triton.infer("adder", [infer_input("x", x, "FP32", binary=True)], headers=headers)
            assert (caught.value.status(), caught.value.message()) == (status, message)
            with pytest.raises(InferenceServerException) as caught:
                triton.get_model_metadata("adder", headers=headers)
            assert (caught.value.status(), caught.value.message()) == (status, message)
            assert not triton.is_model_ready("adder", headers=headers)

        headers = {"Authorization": f"Bearer {v2.inference_token}"}
        assert triton.is_model_ready("adder", headers=headers)
        assert triton.get_model_metadata("adder", headers=headers)["name"] == "adder"
        result = triton.infer("adder", [infer_input("x", x, "FP32", binary=True)], headers=headers)
        assert_same(result.as_numpy("y"), x + 1)


# --- tritonclient.http.aio ------------------------------------------------------------------------------------


def test_aio_client_metadata_binary_infer_and_an_error(v2):
    feeds = {f"in_{t.lower()}": sample(t, rows=5, seed=11) for t in DATATYPES}

    async def main() -> tuple[Any, ...]:
        async with aioclient.InferenceServerClient(v2.url) as triton:
            live = await triton.is_server_live()
            ready = await triton.is_model_ready("dtypes")
            server = await triton.get_server_metadata()
            metadata = await triton.get_model_metadata("dtypes")
            config = await triton.get_model_config("dtypes")
            inputs = []
            for t in DATATYPES:
                item = aioclient.InferInput(f"in_{t.lower()}", [5, 3], t)
                item.set_data_from_numpy(feeds[f"in_{t.lower()}"], binary_data=True)
                inputs.append(item)
            result = await triton.infer("dtypes", inputs, request_id="aio-1")
            bad = aioclient.InferInput("x", [1, 3], "FP32")
            bad.set_data_from_numpy(np.ones((1, 3), np.float32))
            try:
                await triton.infer("adder", [bad])
            except InferenceServerException as exc:
                error = exc
            return live, ready, server, metadata, config, result, error

    live, ready, server, metadata, config, result, error = asyncio.run(main())
    assert live and ready
    assert "binary_tensor_data" in server["extensions"]
    assert metadata["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == 32
    assert result.get_response()["id"] == "aio-1"
    for name, want in v2.expected("dtypes", feeds).items():
        assert_same(result.as_numpy(name), want)
    assert error.status() == "400"
    assert error.message() == "input 'x': expected shape [-1, 4], got [1, 3]"


def test_aio_client_many_concurrent_requests(v2):
    async def main() -> list[Any]:
        async with aioclient.InferenceServerClient(v2.url) as triton:

            async def one(i: int) -> Any:
                x = np.full((1 + i % 3, 4), i, np.float32)
                item = aioclient.InferInput("x", list(x.shape), "FP32")
                item.set_data_from_numpy(x)
                return x, await triton.infer("adder", [item], model_version="canary")

            return await asyncio.gather(*(one(i) for i in range(20)))

    for x, result in asyncio.run(main()):
        assert_same(result.as_numpy("y"), x + 2)
