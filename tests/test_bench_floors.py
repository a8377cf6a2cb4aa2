"""The floors the benchmarks measure Modelyard against: ``bench/floor_server.py``, ``bench/relay_floor.py``,
``bench/swap_floor.py`` and ``bench/transport_floor.py``.

A floor is only a floor if it does the same work: the floor server's answer must be ONNX Runtime's,
the relay floor must store every byte it is sent, with the sha256 of those bytes, the swap floor's
processes must switch to each version they are told to load and answer what it computes, and the
transport floor's echo servers must answer the same embedding over HTTP and gRPC, and count the gRPC
calls as the benchmark's load generator expects.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from tests.support.onnx_models import token_sum_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
floor_server = importlib.import_module("floor_server")
relay_floor = importlib.import_module("relay_floor")
swap_floor = importlib.import_module("swap_floor")
transport_floor = importlib.import_module("transport_floor")
upload = importlib.import_module("upload")

MIB = 1024 * 1024


@pytest.fixture
def token_model(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.onnx"
    path.write_bytes(token_sum_model().SerializeToString())
    return path


def call(app: Any, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []
    chunks = [body[: len(body) // 2], body[len(body) // 2 :]]  # the body in two messages, as a socket gives it

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app({"type": "http", "method": method, "path": path}, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = dict(start["headers"])
    answer = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert int(headers[b"content-length"]) == len(answer)
    return start["status"], answer


def test_the_floor_server_answers_what_onnx_runtime_computes_and_echoes_it(token_model):
    app = floor_server.build(str(token_model), threads=1)
    ids = np.array([[101, 7, 9, 102], [101, 3, 102, 0]], dtype=np.int64)
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=np.int64)
    request = {
        "inputs": [
            {"name": name, "datatype": "INT64", "shape": list(array.shape), "data": array.ravel().tolist()}
            for name, array in (("input_ids", ids), ("attention_mask", mask))
        ]
    }
    expected = ort.InferenceSession(str(token_model)).run(None, {"input_ids": ids, "attention_mask": mask})[0]

    assert call(app, "GET", "/v2/health/ready") == (200, b'{"ready":true}')
    status, body = call(app, "POST", "/v2/models/m/infer", json.dumps(request).encode())
    assert status == 200
    (output,) = json.loads(body)["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("total", "INT64", [2])
    np.testing.assert_array_equal(np.asarray(output["data"], dtype=np.int64), expected)
    assert expected.tolist() == [219, 206]
    # The transport alone: the same bytes again, nothing decoded (an empty body would not parse).
    assert call(app, "POST", "/v2/models/m/echo") == (200, body)


@pytest.fixture
def relay_port() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(store: Any) -> int:
        server = ThreadingHTTPServer(("127.0.0.1", 0), relay_floor.build_handler(store))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return int(server.server_address[1])

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def payload(tmp_path: Path, size: int) -> tuple[Path, str]:
    data = np.random.default_rng(5).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / "weights.bin"
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def test_the_relay_floor_writes_every_byte_to_a_folder_with_its_sha256(tmp_path, relay_port):
    port = relay_port(relay_floor.folder_store(tmp_path / "store"))
    path, digest = payload(tmp_path, 3 * MIB + 17)  # pieces of 1 MiB and a short last one

    assert upload.post_raw(port, path) == (200, {"sha256": digest, "size": 3 * MIB + 17})
    assert (tmp_path / "store" / "weights.bin").read_bytes() == path.read_bytes()


def test_the_relay_floor_passes_a_multipart_upload_on_to_s3(tmp_path, relay_port, s3_endpoint, s3_client, s3_bucket):
    port = relay_port(relay_floor.s3_store(s3_endpoint, s3_bucket))
    path, digest = payload(tmp_path, 17 * MIB + 5)  # three parts of 8 MiB at most

    assert upload.post_raw(port, path) == (200, {"sha256": digest, "size": 17 * MIB + 5})
    stored = s3_client.get_object(Bucket=s3_bucket, Key="relay/weights.bin")["Body"].read()
    assert hashlib.sha256(stored).hexdigest() == digest
    assert s3_client.head_object(Bucket=s3_bucket, Key="relay/weights.bin", PartNumber=1)["PartsCount"] == 3


@pytest.mark.parametrize("runs", [[], ["--concurrent"]], ids=["one-at-a-time", "side-by-side"])
def test_the_swap_floor_switches_every_process_to_each_version_it_loads(tmp_path, token_model, runs):
    output = tmp_path / "swap_floor.json"
    argv = ["--model", str(token_model), "--swaps", "3", "--processes", "2", "--clients", "2", *runs]
    argv += ["--steady-seconds", "1.5", "--settle-seconds", "0.1", "--report-seconds", "0.1", "--output", str(output)]

    assert swap_floor.main(argv) == 0
    result = json.loads(output.read_text())
    # Every run's answer was its version's (ids 1 to 32 sum to 528; v2 answers -528), and all three swaps
    # reached both processes.
    assert (result["swaps"], result["wrong_outputs"], len(result["per_swap_s"])) == (3, 0, 3)
    assert result["concurrent_runs"] is bool(runs)
    assert result["runs"] > 0 and result["steady_p99_ms"] > 0 and result["swap_windows_p99_ms"] > 0


GRPC_SERVICE = "/inference.GRPCInferenceService"


def test_the_transport_floor_answers_one_embedding_in_both_encodings_over_http():
    from inference.grpc import grpc_service_pb2 as pb

    embedding = (np.arange(384, dtype=np.float32) / 7).reshape(1, 384)
    body, header_length, message = transport_floor.answers(embedding)

    app = transport_floor.http_app(body, header_length)
    # Read to its end (the body in two messages), then the answer with the binary extension's headers.
    assert call(app, "POST", "/v2/models/minilm/infer", b"x" * 99) == (200, body)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app({"type": "http", "method": "POST", "path": "/"}, receive, send))
    assert dict(sent[0]["headers"])[b"inference-header-content-length"] == str(header_length).encode()
    (output,) = json.loads(body[:header_length])["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("sentence_embedding", "FP32", [1, 384])
    np.testing.assert_array_equal(np.frombuffer(body[header_length:], "<f4").reshape(1, 384), embedding)
    response = pb.ModelInferResponse.FromString(message)
    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("sentence_embedding", "FP32", [1, 384])
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], "<f4").reshape(1, 384), embedding)


def successes(raw: bytes) -> int:
    from inference.grpc import grpc_service_pb2 as pb

    return sum(s.inference_stats.success.count for s in pb.ModelStatisticsResponse.FromString(raw).model_stats)


def test_the_transport_floors_grpc_aio_server_answers_model_infer_and_counts_the_calls():
    import grpc

    from inference.grpc import grpc_service_pb2 as pb

    statistics_request = pb.ModelStatisticsRequest(name="minilm").SerializeToString()

    async def exercise() -> tuple[list[bytes], int]:
        server, port = transport_floor.grpc_server(0, b"the prepared answer")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                infer = channel.unary_unary(f"{GRPC_SERVICE}/ModelInfer")
                replies = [await infer(request) for request in (b"", b"any bytes", b"\x00" * 1000)]
                counted = await channel.unary_unary(f"{GRPC_SERVICE}/ModelStatistics")(statistics_request)
        finally:
            await server.stop(None)
        return replies, successes(counted)

    assert asyncio.run(exercise()) == ([b"the prepared answer"] * 3, 3)


def test_the_transport_floors_thread_pool_grpc_server_answers_model_infer_and_counts_the_calls():
    import grpc

    from inference.grpc import grpc_service_pb2 as pb

    server, port = transport_floor.grpc_server(0, b"the prepared answer", aio=False)
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            infer = channel.unary_unary(f"{GRPC_SERVICE}/ModelInfer")
            # Calls side by side, as h2load's 64 connections make them: every one is counted.
            with ThreadPoolExecutor(8) as pool:
                replies = list(pool.map(lambda i: infer(b"call %d" % i, timeout=30), range(200)))
            counted = channel.unary_unary(f"{GRPC_SERVICE}/ModelStatistics")(
                pb.ModelStatisticsRequest(name="minilm").SerializeToString(), timeout=30
            )
    finally:
        server.stop(None)
    assert (replies, successes(counted)) == ([b"the prepared answer"] * 200, 200)


def test_the_upload_benchmark_counts_the_cpu_a_server_spends_while_it_stores(tmp_path):
    # A "server" that spends half a CPU-second in its main thread, says so, and waits to be let go.
    burn = "import sys, time\nwhile time.process_time() < 0.5: pass\nprint('done', flush=True)\nsys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        with upload.CpuSpent(server=child.pid, store=None) as spent:
            assert child.stdout.readline() == "done\n"
    finally:
        child.communicate("")
    assert set(spent.seconds) == {"server", "server_main_thread", "client"}
    assert 0.4 <= spent.seconds["server_main_thread"] <= spent.seconds["server"]
    assert spent.seconds["client"] < 0.4  # this process only waited


def test_the_upload_benchmark_puts_each_way_first_in_turn_and_takes_ratios_within_rounds():
    assert [upload.round_order(index) for index in range(4)] == [
        ("modelyard", "floor", "direct"),
        ("floor", "direct", "modelyard"),
        ("direct", "modelyard", "floor"),
        ("modelyard", "floor", "direct"),
    ]

    def way(seconds: float) -> dict[str, Any]:
        return {"seconds": seconds, "cpu_seconds": {"store": seconds * 2, "client": 1.0}}

    # Round 2 is slow for every way (a busy machine): its ratios still count as the others do.
    rounds = [
        {"modelyard": way(10.0), "floor": way(8.0), "direct": way(8.0)},
        {"modelyard": way(40.0), "floor": way(40.0), "direct": way(38.0)},
        {"modelyard": way(12.0), "floor": way(12.0), "direct": way(12.0)},
    ]
    summary = upload.summarise(rounds)
    assert summary["modelyard_seconds"] == 12.0
    assert summary["ratios_modelyard_to_direct"] == [0.8, 0.95, 1.0]
    assert summary["ratio_modelyard_to_direct"] == 0.95
    assert summary["ratios_modelyard_to_floor"] == [0.8, 1.0, 1.0]
    assert summary["ratio_floor_to_direct"] == 1.0
    assert summary["cpu_seconds"]["floor"] == {"store": 24.0, "client": 1.0}
