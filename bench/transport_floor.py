"""The floor under "gRPC at least as fast as HTTP": the two transports alone, with the loads bench/serve.py uses.

    .venv/bin/python bench/transport_floor.py [--clients 64] [--duration 10] [--rounds 3]

``bench/serve.py`` compares Modelyard's gRPC (``ModelInfer`` with ``raw_input_contents``, loaded by
``h2load``) with its HTTP and binary tensors (loaded by ``wrk``) at 64 clients. Both go to the same data
plane, batcher and sessions, so what can differ is the transport: the server's HTTP/2 and gRPC framing
(grpc.aio's C core) against uvicorn's HTTP/1.1 (httptools), and the load generator's own CPU, which
shares the machine's cores with the server.

This script measures that difference with no model and no Modelyard: two echo servers, each in a
process of its own on uvloop as Modelyard's is, answer every call with the same prepared answer
(MiniLM's 384-float embedding, as Modelyard encodes it) without decoding anything:

- HTTP: a bare ASGI callable under uvicorn with httptools, which reads the body and sends the answer
  with the binary extension's headers;
- gRPC: a grpc.aio server (as Modelyard's) with the service's ``ModelInfer`` as a bytes-in, bytes-out
  handler (no protobuf parsing), and ``ModelStatistics`` answering how many calls it took (h2load sees
  only HTTP statuses, so ``bench/serve.py`` counts the successful calls that way);
- gRPC, synchronous: the same handlers on grpcio's thread-pool server (8 threads), the other server
  the Python gRPC library offers.

Each round measures the three at the same concurrency, in an order that turns each round, with ``wrk`` and ``h2load``
exactly as ``bench/serve.py`` runs them (``apt-get install -y wrk nghttp2-client``). For each it
reports requests per second and where the CPU went per request: the server's event loop, its other
threads, and the load generator. On a machine where the model saturates the cores, each request's
transport CPU (server and load generator together) comes out of the model's, so the difference
between the two transports' CPU per request bounds the gRPC/HTTP ratio Modelyard can reach.
Prints a table and writes bench/results/transport_floor.json.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from common import run_in_workdir, stop_process
from serve import (
    MODEL_NAME,
    GrpcLoad,
    Load,
    binary_body,
    feeds,
    free_port,
    grpc_message,
    grpc_successes,
    measured,
    post,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "transport_floor.json"
SERVICE = "inference.GRPCInferenceService"
EMBEDDING = 384  # MiniLM's output: one FP32 vector per sequence
KINDS = ("http", "grpc", "grpc-sync")


# --- the answers -----------------------------------------------------------------------------------


def answers(embedding: np.ndarray) -> tuple[bytes, int, bytes]:
    """The same answer in both encodings, by Modelyard's own encoders (binary outputs, as the benchmark's
    requests ask): (HTTP body, its JSON header's length, serialized ModelInferResponse)."""
    from inference.grpc.codec import encode_infer_response
    from inference.protocol import InferRequest, InferResult, encode_response

    name = "sentence_embedding"
    request = InferRequest(id=None, inputs={}, outputs=[name], binary_outputs={name}, signature={})
    values = {name: embedding}
    body, headers = encode_response(model=MODEL_NAME, version="1", request=request, values=values)
    message = encode_infer_response(InferResult(MODEL_NAME, "1", values), request).SerializeToString()
    return body, int(headers["inference-header-content-length"]), message


# --- the three echo servers --------------------------------------------------------------------------


def http_app(answer: bytes, header_length: int) -> Any:
    """A bare ASGI callable: to any request, reads its body to its end and sends ``answer``."""
    headers = [
        (b"content-type", b"application/octet-stream"),
        (b"inference-header-content-length", str(header_length).encode()),
        (b"content-length", str(len(answer)).encode()),
    ]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body", False):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    return app


def grpc_server(port: int, answer: bytes, *, aio: bool = True) -> tuple[Any, int]:
    """A gRPC server (not started) whose ModelInfer answers ``answer`` to any bytes, counting its calls,
    and the port it listens on (the one the system chose for port 0).

    ``aio``: grpc.aio's server, whose handlers run on the event loop; else grpcio's thread-pool server.
    """
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    from inference.grpc import grpc_service_pb2 as pb

    calls = [0]
    counting = threading.Lock()  # the thread-pool server's handlers run side by side

    def infer(request: bytes, context: Any) -> bytes:
        with counting:
            calls[0] += 1
        return answer

    def model_statistics(request: bytes, context: Any) -> bytes:
        response = pb.ModelStatisticsResponse()
        response.model_stats.add(name=MODEL_NAME, version="1").inference_stats.success.count = calls[0]
        return response.SerializeToString()

    async def infer_async(request: bytes, context: Any) -> bytes:
        return infer(request, context)

    async def model_statistics_async(request: bytes, context: Any) -> bytes:
        return model_statistics(request, context)

    handlers = {  # no (de)serializers: bytes in, bytes out
        "ModelInfer": grpc.unary_unary_rpc_method_handler(infer_async if aio else infer),
        "ModelStatistics": grpc.unary_unary_rpc_method_handler(model_statistics_async if aio else model_statistics),
    }
    # Modelyard's options (inference/grpc/server.py)
    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024), ("grpc.max_send_message_length", -1)]
    server = grpc.aio.server(options=options) if aio else grpc.server(ThreadPoolExecutor(8), options=options)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    return server, server.add_insecure_port(f"127.0.0.1:{port}")


def serve(kind: str, port: int, answer_file: Path, header_length: int) -> None:
    """The server process: ``kind`` is http, grpc or grpc-sync; runs until it is stopped."""
    import uvloop

    answer = answer_file.read_bytes()
    if kind == "http":
        import uvicorn

        uvicorn.run(
            http_app(answer, header_length),
            host="127.0.0.1",
            port=port,
            loop="uvloop",
            http="httptools",
            access_log=False,
            log_level="warning",
        )
        return
    if kind == "grpc-sync":
        server, _ = grpc_server(port, answer, aio=False)
        server.start()
        server.wait_for_termination()
        return

    async def main() -> None:
        server, _ = grpc_server(port, answer)
        await server.start()
        await server.wait_for_termination()

    uvloop.run(main())


def start(kind: str, work: Path, answer: bytes, header_length: int) -> tuple[subprocess.Popen[bytes], int]:
    """Start one echo server in a process of its own; returns once it answers."""
    import grpc

    port = free_port()
    answer_file = work / f"answer-{kind}.bin"
    answer_file.write_bytes(answer)
    log = (work / f"{kind}.log").open("w")
    argv = [sys.executable, __file__, "--serve", kind, "--port", str(port), "--answer", str(answer_file)]
    argv += ["--header-length", str(header_length)]
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + 60
    while True:
        try:
            if kind.startswith("grpc"):
                grpc_successes(port)
            else:
                post(port, "/ready", b"", {})
            return process, port
        except (OSError, grpc.RpcError) as exc:  # not listening yet
            if process.poll() is not None or time.monotonic() > deadline:
                stop_process(process)
                log_text = (work / f"{kind}.log").read_text()
                raise RuntimeError(f"the {kind} echo server did not start: {log_text}") from exc
            time.sleep(0.2)


# --- the run -------------------------------------------------------------------------------------------


def per_request(r: dict[str, Any]) -> dict[str, Any]:
    """The CPU of one run in milliseconds per request: the server's (event loop, other threads), the load's."""
    cpu, n = r["cpu"], max(r["requests"], 1)
    figures = ("event_loop_cpu_s", "other_threads_cpu_s", "load_generator_cpu_s")
    loop, others, load = (cpu[figure] * 1000 / n for figure in figures)
    return {
        "req_per_s": round(r["req_per_s"], 1),
        "errors": r["errors"],
        "event_loop_ms": round(loop, 4),
        "other_threads_ms": round(others, 4),
        "server_ms": round(loop + others, 4),
        "load_generator_ms": round(load, 4),
        "total_ms": round(loop + others + load, 4),
    }


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    one = feeds(1)
    request_body, request_header_length = binary_body(one)
    message = grpc_message(one)
    embedding = np.random.default_rng(1).standard_normal((1, EMBEDDING)).astype(np.float32)
    http_answer, answer_header_length, grpc_answer = answers(embedding)
    http_load, grpc_load = Load(work, args.duration, args.warmup), GrpcLoad(work, args.duration, args.warmup)
    if not (http_load.wrk and grpc_load.h2load):
        raise SystemExit("this floor is measured with wrk and h2load: apt-get install -y wrk nghttp2-client")
    http_process, http_port = start("http", work, http_answer, answer_header_length)
    grpc_process, grpc_port = start("grpc", work, grpc_answer, 0)
    sync_process, sync_port = start("grpc-sync", work, grpc_answer, 0)
    path = f"/v2/models/{MODEL_NAME}/infer"
    try:
        status, _, body = post(
            http_port, path, request_body, {"Inference-Header-Content-Length": str(request_header_length)}
        )
        assert (status, body) == (200, http_answer), "the HTTP echo server must answer the prepared answer"
        measure: dict[str, Callable[[bool], dict[str, Any]]] = {
            "http": lambda warm: http_load.run(
                http_port, path, request_body, request_header_length, args.clients, warm=warm
            ),
            "grpc": lambda warm: grpc_load.run(grpc_port, message, args.clients, warm=warm),
            "grpc-sync": lambda warm: grpc_load.run(sync_port, message, args.clients, warm=warm),
        }
        pids = {"http": http_process.pid, "grpc": grpc_process.pid, "grpc-sync": sync_process.pid}
        for kind in measure:
            measure[kind](True)
        rounds = []
        for index in range(args.rounds):
            kinds = list(KINDS)
            order = kinds[index % 3 :] + kinds[: index % 3]
            row: dict[str, Any] = {}
            for kind in order:
                load = functools.partial(measure[kind], False)
                row[kind] = per_request(measured(pids[kind], args.duration, load))
            for kind in ("grpc", "grpc-sync"):
                row[f"{kind}_vs_http"] = round(row[kind]["req_per_s"] / row["http"]["req_per_s"], 3)
                row[f"{kind}_extra_ms"] = round(row[kind]["total_ms"] - row["http"]["total_ms"], 4)
            rounds.append(row)
            report_round(index + 1, row)
    finally:
        stop_process(http_process)
        stop_process(grpc_process)
        stop_process(sync_process)
    return {
        "clients": args.clients,
        "duration_s": args.duration,
        "generators": {"http": "wrk -t 1", "grpc": "h2load -t 1 -m 1", "grpc-sync": "h2load -t 1 -m 1"},
        "request_bytes": {"http": len(request_body), "grpc": len(message)},
        "answer_bytes": {"http": len(http_answer), "grpc": len(grpc_answer)},
        "rounds": rounds,
        **{
            f"median_{kind}_{figure}": statistics.median(r[f"{kind}_{figure}"] for r in rounds)
            for kind in ("grpc", "grpc-sync")
            for figure in ("vs_http", "extra_ms")
        },
    }


def report_round(index: int, row: dict[str, Any]) -> None:
    for kind in KINDS:
        r = row[kind]
        print(
            f"round {index} {kind:9}: {r['req_per_s']:8.1f} req/s, errors {r['errors']}; CPU per request: server "
            f"{r['server_ms']:.3f} ms (event loop {r['event_loop_ms']:.3f}), load {r['load_generator_ms']:.3f} ms, "
            f"total {r['total_ms']:.3f} ms",
            flush=True,
        )
    for kind in ("grpc", "grpc-sync"):
        print(
            f"round {index}: {kind} / HTTP {row[f'{kind}_vs_http']:.2f}x, "
            f"{row[f'{kind}_extra_ms']:+.3f} ms CPU per request against HTTP"
        )


def report(result: dict[str, Any]) -> None:
    print(f"\n{result['clients']} clients, {len(result['rounds'])} rounds, medians:")
    for kind in ("grpc", "grpc-sync"):
        print(
            f"{kind} / HTTP {result[f'median_{kind}_vs_http']:.2f}x; its transport costs "
            f"{result[f'median_{kind}_extra_ms']:+.3f} ms more CPU per request than HTTP's (server and load together)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="gRPC against HTTP with binary tensors: the transports alone")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up load per server")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--serve", choices=KINDS, help=argparse.SUPPRESS)  # a server process
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--answer", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--header-length", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port, args.answer, args.header_length)
        return 0
    return run_in_workdir(
        prefix="modelyard-transport-floor-",
        run=lambda work: run(args, work),
        report=report,
        output=args.output,
        keep=args.keep,
        passed=lambda result: True,  # a measurement: nothing to pass
    )


if __name__ == "__main__":
    sys.exit(main())
