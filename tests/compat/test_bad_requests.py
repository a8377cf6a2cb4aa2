"""Malformed requests over raw HTTP: each gets a 4xx with a JSON error that names the problem, never a 500."""

from __future__ import annotations

import gzip
import json
import random
import struct
import zlib
from typing import Any

import numpy as np
import pytest

from inference.dataplane import CUDA_SHARED_MEMORY, SHARED_MEMORY_OFF
from tests.support.v2server import V2Server

ADDER = "/v2/models/adder/infer"
MULTI = "/v2/models/multi/infer"


def header(*inputs: dict[str, Any], **extra: Any) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def x(shape: Any = (1, 4), datatype: Any = "FP32", **fields: Any) -> dict[str, Any]:
    return {"name": "x", "datatype": datatype, "shape": list(shape) if isinstance(shape, tuple) else shape, **fields}


def binary_request(head: bytes, blob: bytes) -> tuple[bytes, dict[str, str]]:
    return head + blob, {"Inference-Header-Content-Length": str(len(head))}


def bytes_elements(*values: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


FOUR_FLOATS = np.arange(4, dtype=np.float32).tobytes()
MULTI_AB = [
    {"name": "a", "datatype": "FP32", "shape": [1, 1], "data": [1.0]},
    {"name": "b", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]},
]

# (id, path, body, headers, status, exact error message or None for any)
CASES: list[tuple[str, str, bytes, dict[str, str], int, str | None]] = [
    (
        "json-data-shorter-than-shape",
        ADDER,
        header(x((2, 4), data=[1, 2, 3, 4])),
        {},
        400,
        "input 'x': shape needs 8 values, got 4",
    ),
    (
        "binary-size-does-not-match-shape",
        ADDER,
        *binary_request(header(x((2, 4), parameters={"binary_data_size": 16})), FOUR_FLOATS),
        400,
        "input 'x': shape [2, 4] of FP32 needs 32 bytes, got binary_data_size 16",
    ),
    (
        "unknown-datatype",
        ADDER,
        header(x(datatype="FP8", data=[1, 2, 3, 4])),
        {},
        400,
        "input 'x': unknown datatype 'FP8'",
    ),
    (
        "datatype-not-a-string",
        ADDER,
        header(x(datatype=["FP32"], data=[1, 2, 3, 4])),
        {},
        400,
        "input 'x': unknown datatype ['FP32']",
    ),
    (
        "binary-data-size-past-the-end",
        ADDER,
        *binary_request(header(x(parameters={"binary_data_size": 64})), FOUR_FLOATS),
        400,
        "input 'x': binary_data_size 64 runs past the end of the body (16 bytes left)",
    ),
    (
        "header-length-larger-than-body",
        ADDER,
        header(x(data=[1, 2, 3, 4])),
        {"Inference-Header-Content-Length": "100000"},
        400,
        f"Inference-Header-Content-Length is 100000 but the body has only {len(header(x(data=[1, 2, 3, 4])))} bytes",
    ),
    (
        "header-length-negative",
        ADDER,
        header(x(data=[1, 2, 3, 4])),
        {"Inference-Header-Content-Length": "-5"},
        400,
        "Inference-Header-Content-Length must not be negative, got -5",
    ),
    (
        "header-length-not-a-number",
        ADDER,
        header(x(data=[1, 2, 3, 4])),
        {"Inference-Header-Content-Length": "ten"},
        400,
        "Inference-Header-Content-Length must be an integer, got 'ten'",
    ),
    (
        "binary-bytes-nobody-claims",
        ADDER,
        *binary_request(header(x(parameters={"binary_data_size": 16})), FOUR_FLOATS + b"extra"),
        400,
        "the body has 5 bytes of binary data that no input claims",
    ),
    (
        "negative-shape",
        ADDER,
        header(x((-1, 4), data=[1, 2, 3, 4])),
        {},
        400,
        "input 'x': shape [-1, 4] has a negative dimension",
    ),
    (
        "huge-shape",
        ADDER,
        header(x((1 << 40, 4), data=[1, 2, 3, 4])),
        {},
        400,
        "invalid shape for input 'x': shape [1099511627776, 4] causes total element count to exceed maximum size "
        "of 2147483648",
    ),
    (
        "huge-dimension-beside-a-zero",
        ADDER,
        header(x((0, 1 << 62), data=[])),
        {},
        400,
        "input 'x': shape [0, 4611686018427387904] has a dimension larger than 2147483648",
    ),
    (
        "shape-not-integers",
        ADDER,
        header(x([1.5, 4], data=[1, 2, 3, 4])),
        {},
        400,
        "input 'x': shape must be a list of integers, got [1.5, 4]",
    ),
    (
        "shape-against-signature",
        ADDER,
        header(x((1, 3), data=[1, 2, 3])),
        {},
        400,
        "input 'x': expected shape [-1, 4], got [1, 3]",
    ),
    (
        "invalid-json",
        ADDER,
        b'{"inputs": [',
        {},
        400,
        "the request is not valid JSON: Expecting value: line 1 column 13 (char 12)",
    ),
    ("not-utf8", ADDER, b"\xff\xfe\x00{}", {}, 400, None),
    ("empty-body", ADDER, b"", {}, 400, "the request is not valid JSON: Expecting value: line 1 column 1 (char 0)"),
    ("json-array", ADDER, b"[1, 2]", {}, 400, "the request must be a JSON object"),
    ("json-string", ADDER, b'"infer"', {}, 400, "the request must be a JSON object"),
    ("no-inputs", ADDER, b"{}", {}, 400, "the request needs a non-empty 'inputs' list"),
    ("inputs-not-a-list", ADDER, b'{"inputs": {"name": "x"}}', {}, 400, "the request needs a non-empty 'inputs' list"),
    ("input-not-an-object", ADDER, b'{"inputs": [7]}', {}, 400, "each input needs a 'name', got 7"),
    (
        "input-parameters-not-an-object",
        ADDER,
        header(x(data=[1, 2, 3, 4], parameters="binary")),
        {},
        400,
        "input 'x': 'parameters' must be an object, got 'binary'",
    ),
    (
        "output-parameters-not-an-object",
        ADDER,
        header(x(data=[1, 2, 3, 4]), outputs=[{"name": "y", "parameters": [1]}]),
        {},
        400,
        "output 'y': 'parameters' must be an object, got [1]",
    ),
    (
        "duplicate-input",
        ADDER,
        header(x(data=[1, 2, 3, 4]), x(data=[1, 2, 3, 4])),
        {},
        400,
        "input 'x' already exists in request: each input may be sent once",
    ),
    ("no-data", ADDER, header(x()), {}, 400, "input 'x' has neither 'data' nor parameters.binary_data_size"),
    (
        "data-of-the-wrong-kind",
        ADDER,
        header(x(data=[1, 2, 3, "four"])),
        {},
        400,
        "input 'x': data does not fit FP32: could not convert string to float: 'four'",
    ),
    (
        "data-out-of-range",
        "/v2/models/dtypes/infer",
        header({"name": "in_uint8", "datatype": "UINT8", "shape": [1, 3], "data": [1, 2, 300]}),
        {},
        400,
        "input 'in_uint8': data does not fit UINT8: Python integer 300 out of bounds for uint8",
    ),
    (
        "binary-data-size-negative",
        ADDER,
        header(x(parameters={"binary_data_size": -16})),
        {},
        400,
        "input 'x': binary_data_size must be a non-negative integer",
    ),
    (
        "bytes-element-runs-past-its-data",
        MULTI,
        *binary_request(
            header(
                *MULTI_AB, {"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 7}}
            ),
            struct.pack("<I", 100) + b"abc",
        ),
        400,
        "input 'text': BYTES element 0 runs past the end of its data",
    ),
    (
        "bytes-length-cut-short",
        MULTI,
        *binary_request(
            header(
                *MULTI_AB, {"name": "text", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 6}}
            ),
            bytes_elements(b"a") + b"\x01",
        ),
        400,
        "input 'text': BYTES data ends inside an element's 4-byte length",
    ),
    (
        "bytes-count-against-shape",
        MULTI,
        *binary_request(
            header(
                *MULTI_AB, {"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 10}}
            ),
            bytes_elements(b"a", b"b"),
        ),
        400,
        "input 'text': shape needs 1 BYTES elements, got more",
    ),
    (
        "bytes-json-not-strings",
        MULTI,
        header(*MULTI_AB, {"name": "text", "datatype": "BYTES", "shape": [1], "data": [5]}),
        {},
        400,
        "input 'text': BYTES data must be strings, got int",
    ),
    (
        "corrupt-gzip",
        ADDER,
        b"\x1f\x8b\x08\x00garbage-not-gzip",
        {"Content-Encoding": "gzip"},
        400,
        "the gzip body is corrupt: Error -3 while decompressing data: invalid code lengths set",
    ),
    (
        "truncated-gzip",
        ADDER,
        gzip.compress(header(x(data=[1, 2, 3, 4])))[:20],
        {"Content-Encoding": "gzip"},
        400,
        None,
    ),
    ("corrupt-deflate", ADDER, b"definitely not deflate", {"Content-Encoding": "deflate"}, 400, None),
    (
        "unknown-content-encoding",
        ADDER,
        header(x(data=[1, 2, 3, 4])),
        {"Content-Encoding": "br"},
        415,
        "unsupported Content-Encoding 'br'; use gzip or deflate",
    ),
    (
        "unknown-output",
        ADDER,
        header(x(data=[1, 2, 3, 4]), outputs=[{"name": "z"}]),
        {},
        400,
        "unknown output 'z'; the model gives y",
    ),
    ("outputs-not-a-list", ADDER, header(x(data=[1, 2, 3, 4]), outputs="y"), {}, 400, "'outputs' must be a list"),
    (
        "parameters-not-an-object",
        ADDER,
        header(x(data=[1, 2, 3, 4]), parameters=[]),
        {},
        400,
        "'parameters' must be an object",
    ),
    (
        "negative-priority",
        ADDER,
        header(x(data=[1, 2, 3, 4]), parameters={"priority": -1}),
        {},
        400,
        "parameters.priority must be a non-negative integer, got -1",
    ),
    (
        "timeout-past-uint64",
        ADDER,
        header(x(data=[1, 2, 3, 4]), parameters={"timeout": 1 << 70}),
        {},
        400,
        f"parameters.timeout must be a non-negative integer (microseconds), got {1 << 70}",
    ),
    (
        "unknown-model",
        "/v2/models/nope/infer",
        header(x(data=[1, 2, 3, 4])),
        {},
        404,
        "Request for unknown model: 'nope' is not found",
    ),
    (
        "unknown-version",
        "/v2/models/adder/versions/3/infer",
        header(x(data=[1, 2, 3, 4])),
        {},
        404,
        "Request for unknown model: 'adder' version 3 is not found: model 'adder' has no served version or alias '3'",
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_request_gets_a_4xx_naming_the_problem(v2: V2Server, path, body, headers, status, message):
    response = v2.request("POST", path, body, headers)
    assert response.status == status, response.body
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    if message is not None:
        assert error == message
    else:
        assert error


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_bad_requests_are_judged_after_decompression(v2: V2Server, encoding):
    plain = header(x((2, 4), data=[1, 2, 3, 4]))
    body = gzip.compress(plain) if encoding == "gzip" else zlib.compress(plain)
    response = v2.request("POST", ADDER, body, {"Content-Encoding": encoding})
    assert response.status == 400
    assert response.json() == {"error": "input 'x': shape needs 8 values, got 4"}


def test_mangled_requests_never_get_a_500(v2: V2Server):
    """Truncations, bit flips and spliced bytes of valid binary and JSON requests: 200 or 4xx, nothing else."""
    rng = random.Random(1234)
    text = np.array(["one", "two"], dtype=object)
    head = header(
        {"name": "a", "datatype": "FP32", "shape": [2, 2], "parameters": {"binary_data_size": 16}},
        {"name": "b", "datatype": "INT64", "shape": [2, 2], "parameters": {"binary_data_size": 32}},
        {"name": "text", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 14}},
        outputs=[{"name": "text_out", "parameters": {"binary_data": True}}, {"name": "b_sum"}],
    )
    blob = np.ones((2, 2), np.float32).tobytes() + np.ones((2, 2), np.int64).tobytes()
    blob += bytes_elements(*(t.encode() for t in text))
    seeds = [
        binary_request(head, blob),
        (header(*MULTI_AB, {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["q"]}), {}),
    ]
    for body, headers in seeds:
        assert v2.request("POST", MULTI, body, headers).status == 200
    statuses: dict[int, int] = {}
    for _ in range(300):
        body, headers = rng.choice(seeds)
        mangled = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            kind = rng.random()
            position = rng.randrange(len(mangled))
            if kind < 0.4:
                mangled[position] ^= 1 << rng.randrange(8)
            elif kind < 0.6:
                del mangled[position:]
                if not mangled:
                    mangled = bytearray(b"{")
            elif kind < 0.8:
                mangled[position:position] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            else:
                mangled[position] = ord(rng.choice('{}[]":,-0123456789e'))
        response = v2.request("POST", MULTI, bytes(mangled), headers)
        statuses[response.status] = statuses.get(response.status, 0) + 1
        assert response.status == 200 or 400 <= response.status < 500, (bytes(mangled), response.body)
        if response.status != 200:
            assert response.json()["error"]
    assert sum(n for status, n in statuses.items() if status != 200) > 100  # most mangling is caught


@pytest.mark.parametrize(
    ("method", "path", "status", "message"),
    [
        ("GET", "/v2/systemsharedmemory/status", 501, SHARED_MEMORY_OFF),
        ("POST", "/v2/cudasharedmemory/region/gpu/register", 501, CUDA_SHARED_MEMORY),
        (
            "GET",
            "/v2/models/adder/versions/1/trace/setting",
            404,
            "no such endpoint: GET /v2/models/adder/versions/1/trace/setting",
        ),
        ("GET", "/v2/repository/index", 405, "GET is not allowed on /v2/repository/index"),
        ("GET", "/v2/models/adder/", 404, "no such endpoint: GET /v2/models/adder/"),
        ("POST", "/v2/models/adder/infer/", 404, "no such endpoint: POST /v2/models/adder/infer/"),
        ("GET", "/v2/models/adder/infer", 405, "GET is not allowed on /v2/models/adder/infer"),
        ("DELETE", "/v2/health/live", 405, "DELETE is not allowed on /v2/health/live"),
    ],
)
def test_unknown_endpoints_and_methods_answer_json_and_never_redirect(v2: V2Server, method, path, status, message):
    response = v2.request(method, path, header(x(data=[1, 2, 3, 4])) if method == "POST" else None)
    assert response.status == status
    assert response.json() == {"error": message}
    if status == 405:
        assert "allow" in response.headers
