"""/v2 request bodies: refused before they are read, bounded raw and inflated, and never a 500.

Over a real uvicorn server and raw sockets: chunked bodies that never end show that a refusal did
not wait for (or read) the rest of the body.
"""

from __future__ import annotations

import gzip
import json
import logging
import time
import tracemalloc
import zlib

import numpy as np
import pytest

from inference.app import OUT_OF_MEMORY
from inference.protocol import NESTED_TOO_DEEPLY
from tests.support.rawhttp import read_response, send_chunked, send_head
from tests.support.v2server import V2Server

ADDER = "/v2/models/adder/infer"
FOUR = [1.0, 2.0, 3.0, 4.0]


def request(rows: int = 1) -> bytes:
    data = [v + 4 * row for row in range(rows) for v in FOUR]
    return json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 4], "data": data}]}).encode()


def compress(data: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.compress(data)
    wbits = zlib.MAX_WBITS if encoding == "deflate-zlib" else -zlib.MAX_WBITS  # RFC 1950 or raw RFC 1951
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return packer.compress(data) + packer.flush()


def header_of(encoding: str) -> str:
    return encoding.split("-")[0]


# --- refused before the body is read ---------------------------------------------------------------------------


def test_unknown_model_answers_404_without_reading_a_huge_chunked_body(v2: V2Server):
    sock = send_chunked(v2.port, "/v2/models/nope/infer", {}, [b"x" * 65536] * 256, end=False)
    status, headers, body = read_response(sock)
    assert status == 404
    assert json.loads(body) == {"error": "Request for unknown model: 'nope' is not found"}
    assert headers["connection"] == "close"


def test_missing_token_answers_401_without_reading_the_body(v2: V2Server, settings):
    settings.INFERENCE_PUBLIC = False
    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        sock = send_chunked(v2.port, ADDER, headers, [b"x" * 65536] * 256, end=False)
        status, response_headers, body = read_response(sock)
        assert status == 401
        assert json.loads(body) == {"error": "a bearer token with the inference role is required"}
        assert response_headers["connection"] == "close"


def test_content_length_over_the_limit_is_refused_at_once(v2: V2Server, settings):
    settings.V2_MAX_BODY_BYTES = 65536
    status, _, body = read_response(send_head(v2.port, ADDER, {"Content-Length": str(1 << 40)}, b""))
    assert status == 413
    assert json.loads(body) == {
        "error": "the request body is larger than the limit of 65536 bytes (MODELYARD_V2_MAX_BODY_BYTES)"
    }


# --- bounded while it arrives ---------------------------------------------------------------------------------


def test_chunked_body_over_the_limit_is_refused_while_it_arrives(v2: V2Server, settings):
    settings.V2_MAX_BODY_BYTES = 65536
    status, headers, body = read_response(send_chunked(v2.port, ADDER, {}, [b" " * 16384] * 256, end=False))
    assert status == 413
    assert json.loads(body) == {
        "error": "the request body is larger than the limit of 65536 bytes (MODELYARD_V2_MAX_BODY_BYTES)"
    }
    assert headers["connection"] == "close"


@pytest.mark.parametrize("encoding", ["gzip", "deflate-zlib", "deflate-raw"])
def test_compressed_bodies_are_inflated(v2: V2Server, encoding):
    body = compress(request(rows=2), encoding)
    response = v2.request("POST", ADDER, body, {"Content-Encoding": header_of(encoding)})
    assert response.status == 200, response.body
    assert response.json()["outputs"][0]["data"] == [v + 1 for v in FOUR + [v + 4 for v in FOUR]]


@pytest.mark.parametrize("encoding", ["gzip", "deflate-zlib", "deflate-raw"])
def test_decompression_bomb_stops_at_the_limit_in_bounded_memory(v2: V2Server, settings, encoding):
    settings.V2_MAX_BODY_BYTES = 1 << 20
    bomb = compress(request() + b" " * (64 << 20), encoding)  # valid JSON once inflated: 64 MiB of spaces
    assert len(bomb) < (1 << 20)
    tracemalloc.start()
    try:
        response = v2.request("POST", ADDER, bomb, {"Content-Encoding": header_of(encoding)})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status == 413
    assert response.json() == {
        "error": "the decompressed request body is larger than the limit of 1048576 bytes (MODELYARD_V2_MAX_BODY_BYTES)"
    }
    assert peak < 16 << 20  # the server held about the limit, not the 64 MiB the bomb inflates to


def test_truncated_compressed_body_is_a_400(v2: V2Server):
    body = compress(request(), "deflate-raw")[:-3]
    response = v2.request("POST", ADDER, body, {"Content-Encoding": "deflate"})
    assert response.status == 400
    assert response.json() == {"error": "the deflate body is truncated"}


def test_fixed_shape_model_gets_a_limit_from_its_inputs(v2: V2Server):
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": FOUR * 2}]}).encode()
    response = v2.request("POST", "/v2/models/pinned/infer", body)
    assert response.status == 200, response.body
    assert response.json()["outputs"][0]["data"] == [v + 1 for v in FOUR * 2]
    # 64 KiB for the JSON around the data plus 64 bytes for each of the 8 elements.
    padded = body[:-1] + b" " * (66048 - len(body) + 1) + b"}"
    response = v2.request("POST", "/v2/models/pinned/infer", padded)
    assert response.status == 413
    assert response.json() == {
        "error": "the request body is larger than the limit of 66048 bytes "
        "(what the fixed-shape inputs of model 'pinned' can need)"
    }


def test_stalled_body_gets_408(v2: V2Server, settings):
    settings.BODY_IDLE_TIMEOUT_SECONDS = 0.3
    status, headers, body = read_response(send_head(v2.port, ADDER, {"Content-Length": "1000"}, b"{"))
    assert status == 408
    assert json.loads(body) == {
        "error": "no request body bytes arrived for 0.3 s (MODELYARD_BODY_IDLE_TIMEOUT_SECONDS)"
    }
    assert headers["connection"] == "close"


def test_client_that_disconnects_mid_body_is_one_info_line(v2: V2Server, caplog):
    caplog.set_level(logging.INFO)
    sock = send_head(v2.port, ADDER, {"Content-Length": "100000"}, request())
    time.sleep(0.2)  # let the server start reading; the assertions below do not depend on it
    sock.close()
    deadline = time.monotonic() + 10
    while not caplog.records and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("inference")] == [
        ("INFO", f"the client of {ADDER} disconnected before its request body was complete")
    ]
    assert not any(r.exc_info for r in caplog.records)


# --- bad input is a 4xx, never a 500 ------------------------------------------------------------------------


def test_bytes_elements_past_the_shape_stop_the_decoding(v2: V2Server):
    flood = (b"\x02\x00\x00\x00ab") * 500_000  # 3 MB of 2-byte elements for a shape of [1]
    head = json.dumps(
        {
            "inputs": [
                {"name": "a", "datatype": "FP32", "shape": [1, 1], "data": [1.0]},
                {"name": "b", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]},
                {"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(flood)}},
            ]
        }
    ).encode()
    headers = {"Inference-Header-Content-Length": str(len(head))}
    tracemalloc.start()
    try:
        response = v2.request("POST", "/v2/models/multi/infer", head + flood, headers)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status == 400
    assert response.json() == {"error": "input 'text': shape needs 1 BYTES elements, got more"}
    assert peak < 4 * len(flood)  # the body and its copies; half a million element objects would be far more


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"inputs": ' + b"[" * 1000 + b"]" * 1000 + b"}", NESTED_TOO_DEEPLY),
        (b'{"id": ' + b"[" * 500 + b"]" * 500 + b', "inputs": []}', "the request needs a non-empty 'inputs' list"),
        (
            b'{"id": '
            + b"[" * 500
            + b"]" * 500
            + b', "inputs": '
            + json.dumps([json.loads(request())["inputs"][0]]).encode()
            + b"}",
            "'id' must be a string, got list",
        ),
    ],
    ids=["inputs-1000-deep", "id-500-deep-no-inputs", "id-500-deep"],
)
def test_deeply_nested_json_is_a_400(v2: V2Server, body, message):
    response = v2.request("POST", ADDER, body)
    assert response.status == 400, response.body
    assert response.json() == {"error": message}


def test_out_of_memory_while_decoding_is_a_503(v2: V2Server, monkeypatch):
    def no_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr("inference.app.decode_request", no_memory)
    response = v2.request("POST", ADDER, request())
    assert response.status == 503
    assert response.json() == {"error": OUT_OF_MEMORY}
    assert response.headers["retry-after"] == "1"


def test_out_of_memory_in_the_run_is_a_503(v2: V2Server, monkeypatch):
    def no_memory(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise MemoryError

    monkeypatch.setattr(v2.loaded("adder"), "run", no_memory)
    response = v2.request("POST", ADDER, request())
    assert response.status == 503
    assert response.json() == {"error": OUT_OF_MEMORY}
