"""NaN and Infinity: refused in JSON input, sent as strings ("NaN", "Infinity") in JSON output, exact in binary.

JSON has no NaN or Infinity; Python's encoder writes them as bare words that strict parsers reject.
The proto3 JSON mapping spells them as strings, which numpy (and so tritonclient's ``as_numpy``)
parses back.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import triton_to_np_dtype

from tests.support.onnx_compat import DATATYPES
from tests.support.v2server import V2Server

FLOATS = ["FP16", "FP32", "FP64"]


def non_finite(datatype: str) -> np.ndarray:
    dtype = np.dtype(triton_to_np_dtype(datatype))
    values = np.array([[np.nan, np.inf, -np.inf], [1.5, -0.0, 3.25]], dtype=dtype)
    if datatype == "FP32":  # a NaN with a payload, to see that binary output keeps every bit
        values[1, 0] = np.frombuffer(struct.pack("<I", 0x7FC0_1234), np.float32)[0]
    return values


def feeds() -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for datatype in DATATYPES:
        name = f"in_{datatype.lower()}"
        if datatype in FLOATS:
            out[name] = non_finite(datatype)
        elif datatype == "BYTES":
            out[name] = np.array([["a", "b", "c"], ["d", "e", "f"]], dtype=object)
        elif datatype == "BOOL":
            out[name] = np.array([[True, False, True], [False, True, False]])
        else:
            out[name] = np.arange(6, dtype=triton_to_np_dtype(datatype)).reshape(2, 3)
    return out


def inputs(values: dict[str, np.ndarray]) -> list[httpclient.InferInput]:
    items = []
    for datatype in DATATYPES:
        name = f"in_{datatype.lower()}"
        item = httpclient.InferInput(name, list(values[name].shape), datatype)
        item.set_data_from_numpy(values[name], binary_data=True)
        items.append(item)
    return items


@pytest.mark.parametrize("binary", [False, True], ids=["json-outputs", "binary-outputs"])
def test_non_finite_outputs_reach_tritonclient_intact(v2: V2Server, binary):
    values = feeds()
    expected = v2.expected("dtypes", values)
    outputs = [httpclient.InferRequestedOutput(f"out_{t.lower()}", binary_data=binary) for t in FLOATS]
    with httpclient.InferenceServerClient(v2.url) as triton:
        result = triton.infer("dtypes", inputs(values), outputs=outputs)
    for datatype in FLOATS:
        name = f"out_{datatype.lower()}"
        got, want = result.as_numpy(name), expected[name]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)  # NaN equals NaN here
        if binary:
            assert got.tobytes() == want.tobytes()  # every bit, NaN payloads included


def test_json_output_is_strict_json_with_named_non_finite_values(v2: V2Server):
    x = [float("nan"), float("inf"), float("-inf"), 1.5]
    head = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}}]}
    ).encode()
    body = head + np.array(x, np.float32).tobytes()
    response = v2.request("POST", "/v2/models/adder/infer", body, {"Inference-Header-Content-Length": str(len(head))})
    assert response.status == 200, response.body

    def refuse(word: str) -> None:
        raise AssertionError(f"bare {word} in the response")

    answer = json.loads(response.body, parse_constant=refuse)
    assert answer["outputs"][0]["data"] == ["NaN", "Infinity", "-Infinity", 2.5]


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_json_input_is_refused_by_name(v2: V2Server, token):
    body = (
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, ' + token.encode() + b", 3, 4]}]}"
    )
    response = v2.request("POST", "/v2/models/adder/infer", body)
    assert response.status == 400
    shown = {"NaN": "NaN", "-Infinity": "-Infinity"}.get(token, "Infinity")
    assert response.json() == {
        "error": f"input 'x': data[1] is {shown} as FP32; JSON input data must be finite numbers "
        "(send NaN and Infinity as binary tensor data)"
    }


def test_fp16_overflow_in_json_is_refused_by_name(v2: V2Server):
    body = json.dumps(
        {"inputs": [{"name": "in_fp16", "datatype": "FP16", "shape": [1, 3], "data": [1, 70000, 2]}]}
    ).encode()
    response = v2.request("POST", "/v2/models/dtypes/infer", body)
    assert response.status == 400
    assert response.json()["error"].startswith("input 'in_fp16': data[1] is Infinity as FP16;")
