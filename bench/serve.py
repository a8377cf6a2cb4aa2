"""Serving benchmark: MiniLM-L6 (seq 32, batch-1 requests) through Modelyard against three baselines, in one run.

    .venv/bin/python bench/serve.py [--duration 10] [--clients 1,16,64] [--tensors json|binary] [--rounds N]
                                    [--instances N] [--database-url postgres://...]

What it measures, all on 127.0.0.1:

1. raw ONNX Runtime in this process: sequential batch-1 ``run()`` (seq/s, p50/p99 latency),
   batch-32 (seq/s, the ceiling of one session), and the no-server ceiling (:func:`raw_ceiling`:
   the model's instances side by side at its ``max_batch_size``, as Modelyard's lanes run it, with
   nothing parsed or answered; no server of this model passes it on this machine);
2. Modelyard: a real ``modelyard serve --role inference`` process on SQLite (or ``--database-url``),
   with the model registered, validated and promoted to ``production`` through the services, and
   requests with binary tensors (and, for comparison, JSON tensors), then the same requests over gRPC
   (``ModelInfer`` with ``raw_input_contents``, as tritonclient.grpc sends them) to the same process;
3. the naive server (``bench/naive_server.py``: FastAPI, sync endpoint, one ORT run per request)
   with JSON tensors.

Load comes from a separate process: ``wrk`` with a Lua script that posts a prepared body (install
it with ``apt-get install -y wrk``); without wrk, a multi-process Python load generator. gRPC load
comes from ``h2load`` posting the prepared gRPC message on HTTP/2 (``apt-get install -y
nghttp2-client``), one connection per client, each with one call at a time; since h2load sees only
HTTP statuses, the server's own statistics (``ModelStatistics``) count the calls that succeeded.
Without h2load, Python processes run grpc.aio clients. Every server gets a short warm-up first, and
its answer is checked against ONNX Runtime before load.
The inference endpoint is public (``MODELYARD_INFERENCE_PUBLIC=1``) so that no side pays for a
token the other does not check.

It prints a table and writes bench/results/serve.json. Targets (the serving goals, 2-core CPU machine), judged
on Modelyard with JSON tensors (``--tensors binary`` judges binary tensors instead): at the most
clients (64), at least 0.80x raw ORT batch-32, 1.5x the naive server and 0.90 of the no-server
ceiling, with zero errors; with one client, a p50 latency within 0.5 ms of raw batch-1 ``run()``;
gRPC at least as many requests per second as HTTP with binary tensors, with zero errors. Each round
also says what share of the ceiling 1.5x the naive server would be: above 100%, that goal is out of
reach on this machine (it is still judged, and missed). With JSON tensors, the single-client blocks
also measure ``bench/floor_server.py`` (the least any asyncio server does for the same request) and
its transport alone, so the overhead over raw ``run()`` splits into the floor and what Modelyard adds.

The servers start once and stay up (idle while another is measured). ``--rounds N`` measures raw
ORT and then every series N times in turn, the series' order reversed every other round, so that
a change in the machine's load (this machine is shared) does not fall on one of them alone; each
round prints its ratios, and the goals are judged on each ratio's median over the rounds. The
single-client overhead is judged on paired blocks (:func:`paired_single_client`): raw ``run()`` and
requests in turn, a few dozen of each per block, ten blocks a round:

    .venv/bin/python bench/serve.py --clients 1,64 --rounds 3 --instances 2 --max-batch-size 16
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from common import stat_cpu_seconds, stop_process

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MODEL_PATH = ROOT.parent / "shared" / "models" / "minilm-l6" / "model.onnx"
MODEL_NAME = "minilm"
SEQ = 32
RESULTS = ROOT / "bench" / "results" / "serve.json"

WRK_SCRIPT = r"""
local f = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
local header_length = os.getenv("BENCH_HEADER_LENGTH")
if header_length and header_length ~= "" then
  wrk.headers["Inference-Header-Content-Length"] = header_length
else
  wrk.headers["Content-Type"] = "application/json"
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.1f,"max_us":%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max))
end
"""


# --- inputs and bodies ------------------------------------------------------------------------------


def feeds(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids as a tokenizer would give them: [CLS] ... [SEP], no padding; values do not change the speed."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30000, size=(batch, SEQ), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return {"input_ids": ids, "attention_mask": np.ones((batch, SEQ), dtype=np.int64)}


def json_body(one: dict[str, np.ndarray]) -> bytes:
    inputs = [
        {"name": name, "datatype": "INT64", "shape": list(array.shape), "data": array.ravel().tolist()}
        for name, array in one.items()
    ]
    return json.dumps({"inputs": inputs}).encode()


def binary_body(one: dict[str, np.ndarray]) -> tuple[bytes, int]:
    """Triton's binary tensor extension: JSON header, then the raw little-endian bytes; binary outputs too."""
    inputs = [
        {
            "name": name,
            "datatype": "INT64",
            "shape": list(array.shape),
            "parameters": {"binary_data_size": array.nbytes},
        }
        for name, array in one.items()
    ]
    header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    return header + b"".join(array.astype("<i8").tobytes() for array in one.values()), len(header)


def decode_embedding(status: int, headers: dict[str, str], body: bytes) -> np.ndarray:
    assert status == 200, body[:500]
    length = headers.get("inference-header-content-length")
    if length is None:
        (output,) = json.loads(body)["outputs"]
        return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    header = json.loads(body[: int(length)])
    (output,) = header["outputs"]
    return np.frombuffer(body[int(length) :], dtype="<f4").reshape(output["shape"])


# --- raw ONNX Runtime ------------------------------------------------------------------------------


def percentile_ms(latencies: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(latencies) * 1000, q))


def raw_session() -> Any:
    """ONNX Runtime as a user would open it: every default, the CPU."""
    import onnxruntime as ort

    return ort.InferenceSession(str(MODEL_PATH), providers=["CPUExecutionProvider"])


def raw_ort(session: Any, duration: float) -> dict[str, Any]:
    one, batch = feeds(1), feeds(32)
    for _ in range(20):
        session.run(None, one)
    latencies: list[float] = []
    end = time.perf_counter() + duration
    while time.perf_counter() < end:
        start = time.perf_counter()
        session.run(None, one)
        latencies.append(time.perf_counter() - start)
    batch1 = {
        "seq_per_s": len(latencies) / sum(latencies),
        "p50_ms": percentile_ms(latencies, 50),
        "p99_ms": percentile_ms(latencies, 99),
        "runs": len(latencies),
    }
    for _ in range(3):
        session.run(None, batch)
    runs, spent = 0, 0.0
    end = time.perf_counter() + duration
    while time.perf_counter() < end:
        start = time.perf_counter()
        session.run(None, batch)
        spent += time.perf_counter() - start
        runs += 1
    batch32 = {"seq_per_s": runs * 32 / spent, "ms_per_batch": spent / runs * 1000, "runs": runs}
    return {"batch1": batch1, "batch32": batch32, "providers": session.get_providers()}


def raw_ceiling(model_path: Path, instances: int, batch: int, duration: float) -> dict[str, Any]:
    """The most this CPU runs the model with no server at all, in the shape Modelyard serves it.

    ``instances`` sessions side by side, each with its share of the cores (one thread each on two
    cores with two instances, as Modelyard's CPU lanes), each run back to back in its own thread on
    ``batch`` sequences at a time. No request is parsed, queued or answered, so no server of this
    model on this machine can pass it: a goal above it cannot be met here.
    """
    import onnxruntime as ort

    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // instances)
    sessions = []
    for _ in range(instances):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        sessions.append(ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"]))
    inputs = feeds(batch)
    for session in sessions:
        for _ in range(3):
            session.run(None, inputs)
    runs = [0] * instances
    start_line = threading.Barrier(instances + 1)
    end = 0.0

    def lane(index: int) -> None:
        start_line.wait()
        while time.perf_counter() < end:
            sessions[index].run(None, inputs)
            runs[index] += 1

    workers = [threading.Thread(target=lane, args=(index,)) for index in range(instances)]
    for worker in workers:
        worker.start()
    started = time.perf_counter()
    end = started + duration
    start_line.wait()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    return {
        "seq_per_s": sum(runs) * batch / elapsed,
        "instances": instances,
        "threads_per_session": threads,
        "batch": batch,
        "runs_per_session": runs,
    }


class KeepAliveClient:
    """One keep-alive HTTP/1.1 connection that posts a prepared request and reads the answer, as wrk does.

    ``http.client`` parses every header through the email package: about a quarter of a millisecond
    a request here, which would count against the server. This client sends bytes prepared once and
    reads the status line and ``content-length`` alone; every answer must have both.
    """

    def __init__(self, port: int, path: str, body: bytes, headers: dict[str, str]) -> None:
        lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self.request = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray(1 << 20)

    def post(self) -> tuple[int, bytes]:
        """Send the request; the answer's status and body."""
        self.sock.sendall(self.request)
        view = memoryview(self.buffer)
        received, head_end, total = 0, -1, -1
        while total < 0 or received < total:
            if received == len(self.buffer):
                raise RuntimeError(f"an answer larger than {len(self.buffer)} bytes")
            count = self.sock.recv_into(view[received:])
            if not count:
                raise ConnectionError("the server closed the connection")
            received += count
            if head_end < 0:
                head_end = self.buffer.find(b"\r\n\r\n", 0, received)
                if head_end >= 0:
                    head = bytes(self.buffer[:head_end]).lower()
                    start = head.find(b"\r\ncontent-length:")
                    if start < 0:
                        raise RuntimeError("an answer without content-length")
                    start += len(b"\r\ncontent-length:")
                    end = head.find(b"\r\n", start)
                    total = head_end + 4 + int(head[start : end if end >= 0 else len(head)])
        return int(self.buffer[9:12]), bytes(self.buffer[head_end + 4 : total])

    def close(self) -> None:
        self.sock.close()


def paired_single_client(
    session: Any,
    port: int,
    body: bytes,
    header_length: int | None,
    *,
    blocks: int,
    per_block: int,
    floor_port: int | None = None,
) -> dict[str, Any]:
    """One client's latency against raw ``run()``, measured in alternating blocks a second or so apart.

    ``blocks`` times: ``per_block`` batch-1 ``run()`` calls on the raw session, then ``per_block``
    requests, one at a time on one keep-alive connection (:class:`KeepAliveClient`, whose own time
    counts against the server). Every block's first call is left out (the other side's idle threads
    wake up then), and the medians come from the same minutes, so a change in the machine's load
    falls on all of them.

    With ``floor_port`` (``bench/floor_server.py``, JSON tensors only), each block also sends the same
    requests to the floor server's ``infer`` (the least an asyncio server does: HTTP, JSON in and out,
    the hand-over to a run thread) and ``echo`` (the loopback round trip and HTTP alone, no run), so
    the overhead splits into the transport, what any Python server adds, and what Modelyard adds.
    """
    one = feeds(1)
    clients = {"served": KeepAliveClient(port, INFER_PATH, body, http_headers(header_length))}
    if floor_port is not None:
        clients["floor"] = KeepAliveClient(floor_port, INFER_PATH, body, http_headers(None))
        clients["transport"] = KeepAliveClient(floor_port, ECHO_PATH, body, http_headers(None))
    times: dict[str, list[float]] = {"raw": [], **{name: [] for name in clients}}
    try:
        for _ in range(blocks):
            for index in range(per_block):
                start = time.perf_counter()
                session.run(None, one)
                if index:
                    times["raw"].append(time.perf_counter() - start)
            for name, client in clients.items():
                for index in range(per_block):
                    start = time.perf_counter()
                    status, _ = client.post()
                    if index:
                        times[name].append(time.perf_counter() - start)
                    if status != 200:
                        raise RuntimeError(f"the {name} server answered {status}")
    finally:
        for client in clients.values():
            client.close()
    p50 = {name: percentile_ms(values, 50) for name, values in times.items()}
    paired = {
        "raw_p50_ms": p50["raw"],
        "served_p50_ms": p50["served"],
        "overhead_ms": p50["served"] - p50["raw"],
        "samples": len(times["served"]),
    }
    if floor_port is not None:
        paired |= {
            "floor_p50_ms": p50["floor"],
            "floor_overhead_ms": p50["floor"] - p50["raw"],
            "transport_p50_ms": p50["transport"],
        }
    return paired


# --- servers ------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def post(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def wait_ready(port: int, path: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited:\n{log.read_text()[-3000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server was not ready in {timeout}s:\n{log.read_text()[-3000:]}")


def modelyard_env(data_dir: Path, database_url: str | None) -> dict[str, str]:
    # MODELYARD_ORT_* session settings, MODELYARD_GC_TUNING and MODELYARD_MALLOC_ARENA_MAX pass through, so they can
    # be compared run against run.
    passed = ("MODELYARD_ORT_", "MODELYARD_GC_TUNING", "MODELYARD_MALLOC_ARENA_MAX")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELYARD_") or k.startswith(passed)}
    env |= {
        "DJANGO_SETTINGS_MODULE": "modelyard.settings",
        "MODELYARD_DATA_DIR": str(data_dir),
        "MODELYARD_INFERENCE_PUBLIC": "1",
        "MODELYARD_LOG_LEVEL": "WARNING",
        "MODELYARD_PROVIDERS": "cpu",
        # The version's own benchmark job (registry benchmarks) would share the CPU with the load measured here.
        "MODELYARD_BENCHMARKS": "false",
    }
    if database_url:
        env["MODELYARD_DATABASE_URL"] = database_url
    return env


def register_served(
    *, name: str, description: str, files: list[tuple[str, Path]], model_settings: dict[str, Any]
) -> Any:
    """In a child process with Django: register ``files`` as version 1 of ``name``, validated, and put it on
    production with a second person's approval. Returns the version, or None when the model exists already."""
    import logging

    import django

    django.setup()
    logging.getLogger("kombu").setLevel(logging.ERROR)
    from django.core.management import call_command

    from registry import promotions, services
    from registry.access import services as access
    from registry.audit.chain import Actor
    from registry.models import PRODUCTION, RegisteredModel, Role, VersionStatus
    from registry.uploads import LocalUpload, version_upload

    call_command("migrate", interactive=False, verbosity=0)
    if RegisteredModel.objects.filter(name=name).exists():
        return None
    owner_token, _ = access.token_create(username="bench-owner", create_user=True, roles=[Role.ADMIN])
    approver_token, _ = access.token_create(username="bench-approver", create_user=True, roles=[Role.APPROVER])
    owner, approver = Actor(user=owner_token.user), Actor(user=approver_token.user)
    model = services.model_create(name=name, description=description, actor=owner)
    if model_settings:
        model = services.model_update(model=model, actor=owner, **model_settings)
    version = version_upload(model=model, source=LocalUpload(files), actor=owner)
    version.refresh_from_db()
    assert version.status == VersionStatus.READY, version.errors
    outcome = promotions.alias_set(model=model, alias_name=PRODUCTION, version_number=version.version, actor=owner)
    assert outcome.promotion is not None
    promotions.promotion_approve(promotion_id=outcome.promotion.pk, actor=approver)
    return version


def register(settings_json: str) -> None:
    """Runs in a child process: register MiniLM, validate it, promote it to production (four eyes)."""
    register_served(
        name=MODEL_NAME,
        description="MiniLM-L6 for bench/serve.py",
        files=[("model.onnx", MODEL_PATH)],
        model_settings=json.loads(settings_json),
    )


def start_modelyard(work: Path, database_url: str | None, model_settings: dict[str, Any]) -> tuple[Any, int, int, Path]:
    env = modelyard_env(work / "data", database_url)
    subprocess.run([sys.executable, __file__, "--register", json.dumps(model_settings)], env=env, check=True, cwd=ROOT)
    port, grpc_port = free_port(), free_port()
    log = work / "modelyard.log"
    argv = [str(BIN / "modelyard"), "serve", "--role", "inference", "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(
        [*argv, "--grpc-port", str(grpc_port)], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=work
    )
    wait_ready(port, f"/v2/models/{MODEL_NAME}/ready", process, log)
    return process, port, grpc_port, log


def start_baseline(work: Path, script: str) -> tuple[Any, int]:
    """``bench/<script>`` (the naive server or the floor server) serving MiniLM on a free port, once ready."""
    port = free_port()
    log = work / f"{Path(script).stem}.log"
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / script), "--model", str(MODEL_PATH), "--port", str(port)],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    wait_ready(port, "/v2/health/ready", process, log)
    return process, port


# --- load --------------------------------------------------------------------------------------------


def wrk_load(
    port: int, path: str, body_file: Path, header_length: int | None, clients: int, duration: float, script: Path
) -> dict[str, Any]:
    env = dict(
        os.environ, BENCH_BODY=str(body_file), BENCH_HEADER_LENGTH="" if header_length is None else str(header_length)
    )
    seconds = f"{max(1, round(duration))}s"
    url = f"http://127.0.0.1:{port}{path}"
    command = ["wrk", "-t", "1", "-c", str(clients), "-d", seconds, "--timeout", "30s", "-s", str(script), url]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    line = next(line for line in done.stdout.splitlines() if line.startswith("WRKJSON "))
    raw = json.loads(line[len("WRKJSON ") :])
    errors = raw["connect"] + raw["read"] + raw["write"] + raw["status"] + raw["timeout"]
    return {
        "req_per_s": raw["requests"] / (raw["duration_us"] / 1e6),
        "p50_ms": raw["p50_us"] / 1000,
        "p90_ms": raw["p90_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
        "requests": raw["requests"],
        "errors": errors,
        "error_kinds": {k: raw[k] for k in ("connect", "read", "write", "status", "timeout") if raw[k]},
    }


def _python_worker(args: tuple[int, str, bytes, dict[str, str], int, float], out: Any) -> None:
    port, path, body, headers, connections, duration = args
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    end = time.monotonic() + duration

    def one_connection() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine: list[float] = []
        failed = 0
        while time.monotonic() < end:
            start = time.perf_counter()
            try:
                conn.request("POST", path, body=body, headers=headers)
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    failed += 1
            except OSError:
                failed += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            mine.append(time.perf_counter() - start)
        with lock:
            latencies.extend(mine)
            errors[0] += failed

    threads = [threading.Thread(target=one_connection) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put((latencies, errors[0]))


def _fan_out(target: Callable[..., None], args: tuple[Any, ...], clients: int, duration: float) -> dict[str, Any]:
    """Split ``clients`` over up to 4 processes, each running ``target((*args, share, duration), out)``; merge."""
    processes = min(clients, 4)
    out: Any = multiprocessing.Queue()
    workers = []
    for index in range(processes):
        share = clients // processes + (1 if index < clients % processes else 0)
        worker = multiprocessing.Process(target=target, args=((*args, share, duration), out))
        worker.start()
        workers.append(worker)
    latencies: list[float] = []
    errors = 0
    for _ in workers:
        got, failed = out.get()
        latencies += got
        errors += failed
    for worker in workers:
        worker.join()
    return {
        "req_per_s": len(latencies) / duration,
        "p50_ms": percentile_ms(latencies, 50),
        "p90_ms": percentile_ms(latencies, 90),
        "p99_ms": percentile_ms(latencies, 99),
        "requests": len(latencies),
        "errors": errors,
    }


def python_load(
    port: int, path: str, body: bytes, headers: dict[str, str], clients: int, duration: float
) -> dict[str, Any]:
    """The fallback without wrk: several processes, each with threads holding one keep-alive connection."""
    return _fan_out(_python_worker, (port, path, body, headers), clients, duration)


class Load:
    """Posts one prepared request at a server from a separate process, at several concurrencies."""

    def __init__(self, work: Path, duration: float, warmup: float) -> None:
        self.work = work
        self.duration = duration
        self.warmup = warmup
        self.wrk = shutil.which("wrk")
        self.script = work / "body.lua"
        self.script.write_text(WRK_SCRIPT)

    @property
    def generator(self) -> str:
        return "wrk" if self.wrk else "python (multi-process)"

    def run(
        self, port: int, path: str, body: bytes, header_length: int | None, clients: int, *, warm: bool
    ) -> dict[str, Any]:
        duration = self.warmup if warm else self.duration
        if self.wrk:
            body_file = self.work / f"body-{port}-{header_length}.bin"
            body_file.write_bytes(body)
            return wrk_load(port, path, body_file, header_length, clients, duration, self.script)
        headers = (
            {"Inference-Header-Content-Length": str(header_length)}
            if header_length is not None
            else {"Content-Type": "application/json"}
        )
        return python_load(port, path, body, headers, clients, duration)


# --- gRPC load --------------------------------------------------------------------------------------------

GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"


def grpc_message(one: dict[str, np.ndarray]) -> bytes:
    """A serialized ModelInferRequest with raw_input_contents, as tritonclient.grpc sends it."""
    from inference.grpc import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name=MODEL_NAME)
    for name, array in one.items():
        request.inputs.add(name=name, datatype="INT64", shape=list(array.shape))
        request.raw_input_contents.append(array.astype("<i8").tobytes())
    return request.SerializeToString()


def grpc_call(port: int, message: bytes) -> np.ndarray:
    """One ModelInfer call; the embedding it answers."""
    import grpc

    from inference.grpc import grpc_service_pb2 as pb

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(GRPC_INFER)  # no serializers: bytes in, bytes out
        response = pb.ModelInferResponse.FromString(call(message, timeout=60))
    (output,) = response.outputs
    return np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(list(output.shape))


def grpc_successes(port: int) -> int:
    """The requests the model answered so far, by the server's own count (the statistics extension)."""
    import grpc

    from inference.grpc import grpc_service_pb2 as pb

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelStatistics")
        raw = call(pb.ModelStatisticsRequest(name=MODEL_NAME).SerializeToString(), timeout=30)
    return sum(s.inference_stats.success.count for s in pb.ModelStatisticsResponse.FromString(raw).model_stats)


def h2load_grpc(port: int, message: bytes, clients: int, duration: float, work: Path) -> dict[str, Any]:
    """h2load posting one gRPC message (5-byte frame header + the message) from ``clients`` connections."""
    body = work / "grpc-body.bin"
    body.write_bytes(b"\x00" + len(message).to_bytes(4, "big") + message)
    log = work / f"h2load-{clients}.tsv"
    log.unlink(missing_ok=True)
    before = grpc_successes(port)
    command = ["h2load", "-c", str(clients), "-m", "1", "-t", "1", "-D", str(max(1, round(duration)))]
    command += ["--log-file", str(log), "-d", str(body), "-H", "content-type: application/grpc", "-H", "te: trailers"]
    done = subprocess.run([*command, f"http://127.0.0.1:{port}{GRPC_INFER}"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"h2load failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    succeeded = grpc_successes(port) - before
    rows = [line.split("\t") for line in log.read_text().splitlines() if line.strip()]
    latencies = [int(row[2]) / 1e6 for row in rows]
    finished = [row for row in rows if row[1] == "200"]
    # h2load reads only HTTP statuses; a gRPC error is a 200 with a status in its trailers. The model's
    # own count of answered requests tells them apart (no other client talks to this server now).
    errors = len(rows) - len(finished) + max(0, len(finished) - succeeded)
    return {
        "req_per_s": len(rows) / duration,
        "p50_ms": percentile_ms(latencies, 50),
        "p90_ms": percentile_ms(latencies, 90),
        "p99_ms": percentile_ms(latencies, 99),
        "requests": len(rows),
        "errors": errors,
        "server_counted": succeeded,
    }


def _grpc_worker(args: tuple[int, bytes, int, float], out: Any) -> None:
    port, message, connections, duration = args
    import asyncio

    import grpc

    async def main() -> tuple[list[float], int]:
        latencies: list[float] = []
        errors = 0
        end = time.monotonic() + duration

        async def one() -> None:
            nonlocal errors
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary(GRPC_INFER)
                while time.monotonic() < end:
                    start = time.perf_counter()
                    try:
                        await call(message, timeout=30)
                    except grpc.aio.AioRpcError:
                        errors += 1
                    latencies.append(time.perf_counter() - start)

        await asyncio.gather(*(one() for _ in range(connections)))
        return latencies, errors

    out.put(asyncio.run(main()))


def python_grpc_load(port: int, message: bytes, clients: int, duration: float) -> dict[str, Any]:
    """The fallback without h2load: processes of grpc.aio clients, one channel per client."""
    return _fan_out(_grpc_worker, (port, message), clients, duration)


class GrpcLoad:
    """Calls ModelInfer with one prepared message from a separate process, at several concurrencies."""

    def __init__(self, work: Path, duration: float, warmup: float) -> None:
        self.work = work
        self.duration = duration
        self.warmup = warmup
        self.h2load = shutil.which("h2load")

    @property
    def generator(self) -> str:
        return "h2load" if self.h2load else "python grpc.aio (multi-process)"

    def run(self, port: int, message: bytes, clients: int, *, warm: bool) -> dict[str, Any]:
        duration = self.warmup if warm else self.duration
        if self.h2load:
            return h2load_grpc(port, message, clients, duration, self.work)
        return python_grpc_load(port, message, clients, duration)


# --- the run -------------------------------------------------------------------------------------------


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of every thread of a process, by thread id."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = stat_cpu_seconds(task / "stat")
        except OSError:
            continue  # the thread ended
    return out


def where_the_time_goes(
    pid: int, before: dict[int, float], wrk_cpu: float, seconds: float, requests: int
) -> dict[str, Any]:
    """Split the machine's CPU during one run: the event loop (the main thread), the other threads, the load."""
    after = thread_cpu(pid)
    spent = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    event_loop = spent.get(pid, 0.0)
    others = sum(v for tid, v in spent.items() if tid != pid)
    capacity = (os.cpu_count() or 1) * seconds
    return {
        "event_loop_cpu_s": round(event_loop, 2),
        "other_threads_cpu_s": round(others, 2),  # ONNX Runtime's threads, nearly all of it
        "load_generator_cpu_s": round(wrk_cpu, 2),
        "machine_cpu_s": round(capacity, 1),
        "event_loop_ms_per_request": round(event_loop / max(requests, 1) * 1000, 3),
        "other_threads_share": round(others / capacity, 3),
    }


INFER_PATH = f"/v2/models/{MODEL_NAME}/infer"
ECHO_PATH = f"/v2/models/{MODEL_NAME}/echo"  # bench/floor_server.py's transport alone


def http_headers(header_length: int | None) -> dict[str, str]:
    if header_length is not None:
        return {"Inference-Header-Content-Length": str(header_length)}
    return {"Content-Type": "application/json"}


def measured(pid: int, duration: float, load: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one measured load and add where the machine's CPU went meanwhile (server threads, load generator)."""
    before, children = thread_cpu(pid), resource.getrusage(resource.RUSAGE_CHILDREN)
    r = load()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_cpu = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
    r["cpu"] = where_the_time_goes(pid, before, load_cpu, duration, r["requests"])
    return r


@dataclass
class Series:
    """One way of serving measured at each concurrency: a server and the request it is sent."""

    name: str  # the key in the report: modelyard, modelyard-grpc, modelyard-json, naive
    label: str  # what the printed line says
    check: Callable[[], np.ndarray]  # one request: the embedding it answers
    warm: Callable[[int], Any]  # warm-up load at this many clients
    measure: Callable[[int], dict[str, Any]]  # measured load at this many clients


def http_series(
    name: str, label: str, port: int, pid: int, body: bytes, header_length: int | None, load: Load
) -> Series:
    return Series(
        name=name,
        label=label,
        check=lambda: decode_embedding(*post(port, INFER_PATH, body, http_headers(header_length))),
        warm=lambda count: load.run(port, INFER_PATH, body, header_length, count, warm=True),
        measure=lambda count: measured(
            pid, load.duration, lambda: load.run(port, INFER_PATH, body, header_length, count, warm=False)
        ),
    )


def grpc_series(port: int, pid: int, message: bytes, load: GrpcLoad) -> Series:
    return Series(
        name="modelyard-grpc",
        label="gRPC",
        check=lambda: grpc_call(port, message),
        warm=lambda count: load.run(port, message, count, warm=True),
        measure=lambda count: measured(pid, load.duration, lambda: load.run(port, message, count, warm=False)),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description="MiniLM serving benchmark: Modelyard vs raw ORT vs a naive server")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of warm-up load per server")
    parser.add_argument("--clients", default="1,16,64", help="concurrent clients, comma-separated")
    parser.add_argument("--database-url", default=None, help="PostgreSQL for Modelyard (default: SQLite in a temp dir)")
    parser.add_argument("--max-batch-size", type=int, default=None, help="the model's max_batch_size")
    parser.add_argument("--max-queue-delay-us", type=int, default=None, help="the model's max_queue_delay_us")
    parser.add_argument("--instances", type=int, default=None, help="the model's instances (default: by provider)")
    parser.add_argument(
        "--tensors",
        choices=("json", "binary"),
        default="json",
        help="which Modelyard series the targets judge: JSON tensors (the serving goals) or binary tensors",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="measure raw ORT and the servers this many times in turn, each judged"
    )
    parser.add_argument("--skip-json", action="store_true", help="measure Modelyard with binary tensors only")
    parser.add_argument("--skip-naive", action="store_true", help="leave out the naive FastAPI baseline")
    parser.add_argument("--skip-grpc", action="store_true", help="measure Modelyard over HTTP only")
    parser.add_argument(
        "--skip-floor", action="store_true", help="leave out bench/floor_server.py from the single-client blocks"
    )
    parser.add_argument("--register", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.register is not None:
        register(args.register)
        return 0
    if not MODEL_PATH.exists():
        sys.exit(f"{MODEL_PATH} is missing")
    if args.skip_json and args.tensors == "json":
        sys.exit("--skip-json leaves nothing to judge with --tensors json: add --tensors binary")
    if not args.skip_naive:
        try:
            import fastapi  # noqa: F401
        except ImportError:
            sys.exit(
                "the naive baseline needs FastAPI (not a Modelyard dependency): make bench-install "
                "(.venv/bin/pip install -e '.[bench]'), or --skip-naive"
            )
    clients = [int(c) for c in args.clients.split(",")]
    model_settings = {
        k: v
        for k, v in (
            ("max_batch_size", args.max_batch_size),
            ("max_queue_delay_us", args.max_queue_delay_us),
            ("instances", args.instances),
        )
        if v is not None
    }
    reports = run_rounds(args, clients, model_settings)
    final: dict[str, Any] = dict(reports[-1])
    final["rounds"] = [r["targets"] for r in reports]
    final["median"] = median_targets(reports)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(final, indent=2) + "\n")
    print()
    for number, report in enumerate(reports, 1):
        print(f"round {number}: {ratios_line(report['targets'])}")
        if line := ceiling_line(report["targets"]):
            print(f"         {line}")
    if len(reports) > 1:
        print(f"median of {len(reports)} rounds: {ratios_line(final['median'])}")
        if line := ceiling_line(final["median"]):
            print(f"         {line}")
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0 if final["median"]["met"] else 1


def run_rounds(args: argparse.Namespace, clients: list[int], model_settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Start the servers once, then measure raw ORT and every series in turn, ``--rounds`` times.

    The servers stay up between rounds (idle while another is measured), so each round's ratios come
    from measurements minutes apart at most; the order of the series is reversed every other round, so
    a drift in the machine's load does not always fall on the same one.
    """
    one = feeds(1)
    binary, header_length = binary_body(one)
    as_json = json_body(one)
    message = grpc_message(one)
    session = raw_session()
    reference = session.run(None, one)[0]
    processes: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="modelyard-bench-") as tmp:
        work = Path(tmp)
        load = Load(work, args.duration, args.warmup)
        grpc_load = GrpcLoad(work, args.duration, args.warmup)
        generators = load.generator + ("" if args.skip_grpc else f" (HTTP), {grpc_load.generator} (gRPC)")
        try:
            process, port, grpc_port, _ = start_modelyard(work, args.database_url, model_settings)
            processes.append(process)
            stack = server_stack(process.pid)
            series = [http_series("modelyard", "binary tensors", port, process.pid, binary, header_length, load)]
            if not args.skip_grpc:
                series.append(grpc_series(grpc_port, process.pid, message, grpc_load))
            if not args.skip_json:
                series.append(http_series("modelyard-json", "JSON tensors", port, process.pid, as_json, None, load))
            if not args.skip_naive:
                naive, naive_port = start_baseline(work, "naive_server.py")
                processes.append(naive)
                series.append(http_series("naive", "naive JSON", naive_port, naive.pid, as_json, None, load))
            floor_port = None
            if args.tensors == "json" and not args.skip_floor and 1 in clients:
                floor, floor_port = start_baseline(work, "floor_server.py")
                processes.append(floor)
                np.testing.assert_allclose(
                    decode_embedding(*post(floor_port, INFER_PATH, as_json, http_headers(None))),
                    reference,
                    rtol=1e-4,
                    atol=1e-5,
                    err_msg="the floor server computes something else",
                )
            for each in series:
                np.testing.assert_allclose(
                    each.check(), reference, rtol=1e-4, atol=1e-5, err_msg=f"{each.name} computes something else"
                )
                each.warm(max(clients))
            reports = []
            for number in range(1, args.rounds + 1):
                if args.rounds > 1:
                    print(f"\n=== round {number} of {args.rounds} ===", flush=True)
                print(f"MiniLM-L6, seq {SEQ}, batch-1 requests; load from {generators}; {os.cpu_count()} CPUs")
                raw = raw_ort(session, args.duration)
                raw["ceiling"] = ceiling = raw_ceiling(
                    MODEL_PATH,
                    model_settings.get("instances", 1),
                    model_settings.get("max_batch_size", 32),
                    args.duration,
                )
                b1, b32 = raw["batch1"], raw["batch32"]
                print("raw ONNX Runtime, in-process:")
                print(
                    f"  batch-1 sequential: {b1['seq_per_s']:.1f} seq/s, p50 {b1['p50_ms']:.2f} ms, "
                    f"p99 {b1['p99_ms']:.2f} ms"
                )
                print(f"  batch-32:           {b32['seq_per_s']:.1f} seq/s ({b32['ms_per_batch']:.1f} ms per batch)")
                print(f"  no-server ceiling:  {ceiling['seq_per_s']:.1f} seq/s ({ceiling_shape(ceiling)})")
                print("servers (Modelyard: modelyard serve --role inference; naive: FastAPI, no batching):", flush=True)
                servers: dict[str, dict[int, dict[str, Any]]] = {each.name: {} for each in series}
                for count in clients:
                    for each in series if number % 2 else series[::-1]:
                        servers[each.name][count] = r = each.measure(count)
                        print(
                            f"  {each.label:<16} {count:>3} clients: {r['req_per_s']:8.1f} req/s  "
                            f"p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  errors {r['errors']}",
                            flush=True,
                        )
                paired = None
                if 1 in clients:
                    judged = as_json if args.tensors == "json" else binary
                    paired = paired_single_client(
                        session,
                        port,
                        judged,
                        None if args.tensors == "json" else header_length,
                        blocks=PAIRED_BLOCKS,
                        per_block=max(5, int(args.duration * 2)),
                        floor_port=floor_port,
                    )
                report = summarise(raw, servers, clients, tensors=args.tensors, paired=paired)
                report["setup"] = setup(args, load, grpc_load, model_settings, raw, stack)
                print_table(report, clients)
                reports.append(report)
        finally:
            for process in processes:
                stop_process(process, signal.SIGINT)
    return reports


def setup(
    args: argparse.Namespace,
    load: Load,
    grpc_load: GrpcLoad,
    model_settings: dict[str, Any],
    raw: dict[str, Any],
    stack: dict[str, bool],
) -> dict[str, Any]:
    return {
        "model": "all-MiniLM-L6-v2 (../shared/models/minilm-l6/model.onnx)",
        "seq": SEQ,
        "duration_s": args.duration,
        "load_generator": load.generator,
        "grpc_load_generator": None if args.skip_grpc else grpc_load.generator,
        "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "database": "postgresql" if args.database_url else "sqlite",
        "model_settings": model_settings or "defaults (max_batch_size 32, max_queue_delay_us 0, instances by provider)",
        "ort_providers": raw["providers"],
        "server_stack": stack,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def server_stack(pid: int) -> dict[str, bool]:
    """Which of uvloop, httptools and orjson the Modelyard process has loaded (its native modules' mappings)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return {}
    return {name: f"/{name}/" in maps for name in ("uvloop", "httptools", "orjson")}


# The serving goals, at the most clients measured, on the series ``--tensors`` picks.
TARGET_VS_RAW_BATCH32 = 0.80
TARGET_VS_NAIVE = 1.5
TARGET_P50_OVERHEAD_MS = 0.5
TARGET_VS_CEILING = 0.90
PAIRED_BLOCKS = 10  # single-client latency: blocks of raw run() and of requests, in turn


def summarise(
    raw: dict[str, Any],
    servers: dict[str, dict[int, dict[str, Any]]],
    clients: list[int],
    *,
    tensors: str = "json",
    paired: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every series' ratios, and the goals' ratios; the single-client overhead from ``paired`` when given."""
    b1, b32 = raw["batch1"]["seq_per_s"], raw["batch32"]["seq_per_s"]
    ceiling = raw["ceiling"]["seq_per_s"] if "ceiling" in raw else None
    table: dict[str, Any] = {}
    for name, runs in servers.items():
        table[name] = {}
        for count, r in runs.items():
            row = dict(r)
            row["vs_raw_batch1"] = r["req_per_s"] / b1
            row["vs_raw_batch32"] = r["req_per_s"] / b32
            if ceiling:
                row["vs_ceiling"] = r["req_per_s"] / ceiling
            if name != "naive" and "naive" in servers:
                row["vs_naive"] = r["req_per_s"] / servers["naive"][count]["req_per_s"]
            if name == "modelyard-grpc":
                row["vs_http_binary"] = r["req_per_s"] / servers["modelyard"][count]["req_per_s"]
            table[name][count] = row
    top = max(clients)
    judged = "modelyard-json" if tensors == "json" else "modelyard"
    ours = table[judged][top]
    single = table[judged].get(1)
    targets: dict[str, Any] = {
        "series": judged,
        "clients": top,
        "vs_raw_batch32": ours["vs_raw_batch32"],
        "vs_naive": ours.get("vs_naive"),
        "errors": sum(r["errors"] for runs in table.values() for r in runs.values()),
    }
    if ceiling:
        targets["vs_ceiling"] = ours["vs_ceiling"]
        if "naive" in table:
            targets["naive_goal_vs_ceiling"] = TARGET_VS_NAIVE * table["naive"][top]["req_per_s"] / ceiling
    if paired is not None:
        targets["p50_overhead_ms"] = paired["overhead_ms"]
    elif single is not None:
        targets["p50_overhead_ms"] = single["p50_ms"] - raw["batch1"]["p50_ms"]
    if "modelyard-grpc" in table:
        grpc = table["modelyard-grpc"][top]
        targets["grpc_vs_http_binary"] = grpc["vs_http_binary"]
        targets["grpc_errors"] = grpc["errors"]
    targets["met"] = judge(targets)
    report: dict[str, Any] = {
        "raw_ort": {k: raw[k] for k in ("batch1", "batch32", "ceiling") if k in raw},
        "servers": table,
        "targets": targets,
    }
    if single is not None:
        report["single_client"] = {
            "series": judged,
            "modelyard_p50_ms": single["p50_ms"],
            "modelyard_p99_ms": single["p99_ms"],
            "raw_p50_ms": raw["batch1"]["p50_ms"],
            "raw_p99_ms": raw["batch1"]["p99_ms"],
            "p50_overhead_ms": single["p50_ms"] - raw["batch1"]["p50_ms"],
            "p99_overhead_ms": single["p99_ms"] - raw["batch1"]["p99_ms"],
            "paired": paired,
        }
    return report


def judge(t: dict[str, Any]) -> bool:
    """Whether the ratios meet the goals; a ratio not measured (no naive server, no 1-client run) is not judged."""
    met = t["vs_raw_batch32"] >= TARGET_VS_RAW_BATCH32 and t["errors"] == 0
    if t.get("vs_naive") is not None:
        met = met and t["vs_naive"] >= TARGET_VS_NAIVE
    if "p50_overhead_ms" in t:
        met = met and t["p50_overhead_ms"] <= TARGET_P50_OVERHEAD_MS
    if "vs_ceiling" in t:
        met = met and t["vs_ceiling"] >= TARGET_VS_CEILING
    if "grpc_vs_http_binary" in t:
        met = met and t["grpc_vs_http_binary"] >= 1.0 and t["grpc_errors"] == 0
    return bool(met)


def median_targets(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Each ratio's median over the rounds, errors summed, judged like one round."""
    rounds = [r["targets"] for r in reports]
    t: dict[str, Any] = {"series": rounds[0]["series"], "clients": rounds[0]["clients"]}
    for key in (
        "vs_raw_batch32",
        "vs_naive",
        "p50_overhead_ms",
        "grpc_vs_http_binary",
        "vs_ceiling",
        "naive_goal_vs_ceiling",
    ):
        values = [r[key] for r in rounds if r.get(key) is not None]
        if values:
            t[key] = float(np.median(values))
    for key in ("errors", "grpc_errors"):
        if key in rounds[0]:
            t[key] = sum(r[key] for r in rounds)
    t["met"] = judge(t)
    return t


def ratios_line(t: dict[str, Any]) -> str:
    """The goals' ratios in one line: served/raw batch-32, served/naive, errors, single-client p50 overhead."""
    naive = f"{t['vs_naive']:.2f}x" if t.get("vs_naive") is not None else "n/a"
    p50 = f"{t['p50_overhead_ms']:+.2f} ms" if "p50_overhead_ms" in t else "n/a (no 1-client run)"
    return (
        f"{t['series']} at {t['clients']} clients: {t['vs_raw_batch32']:.2f}x raw batch-32 (>= "
        f"{TARGET_VS_RAW_BATCH32:.2f}), {naive} the naive server (>= {TARGET_VS_NAIVE}), {t['errors']} errors (0), "
        f"single-client p50 {p50} over raw batch-1 (<= {TARGET_P50_OVERHEAD_MS:g} ms): "
        f"{'MET' if t['met'] else 'MISSED'}"
    )


def ceiling_shape(ceiling: dict[str, Any]) -> str:
    sessions = "session" if ceiling["instances"] == 1 else "sessions"
    threads = "thread" if ceiling["threads_per_session"] == 1 else "threads"
    return (
        f"{ceiling['instances']} {sessions} x {ceiling['threads_per_session']} {threads}, "
        f"batch {ceiling['batch']}, in-process"
    )


def ceiling_line(t: dict[str, Any]) -> str | None:
    """How the judged series and the naive goal compare with the no-server ceiling; None when not measured.

    The naive goal is a multiple of another server's throughput, so it asks more of a machine on
    which that server does well. Above the ceiling (1.00x), no server can meet it on this machine.
    """
    if "vs_ceiling" not in t:
        return None
    line = f"{t['series']} served {t['vs_ceiling']:.0%} of the no-server ceiling (>= {TARGET_VS_CEILING:.0%})"
    if t.get("naive_goal_vs_ceiling") is not None:
        share = t["naive_goal_vs_ceiling"]
        line += f"; {TARGET_VS_NAIVE}x the naive server would be {share:.0%} of it"
        if share > 1:
            line += ", out of reach on this machine"
    return line


def print_table(report: dict[str, Any], clients: list[int]) -> None:
    raw = report["raw_ort"]
    print("\n| what | clients | req/s | p50 ms | p99 ms | vs raw b1 | vs raw b32 | vs naive | errors |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(
        f"| raw ORT batch-1 (in-process) | 1 | {raw['batch1']['seq_per_s']:.1f} | {raw['batch1']['p50_ms']:.2f} | "
        f"{raw['batch1']['p99_ms']:.2f} | 1.00 | {raw['batch1']['seq_per_s'] / raw['batch32']['seq_per_s']:.2f} | | |"
    )
    print(f"| raw ORT batch-32 (in-process) | | {raw['batch32']['seq_per_s']:.1f} | | | | 1.00 | | |")
    if "ceiling" in raw:
        c = raw["ceiling"]["seq_per_s"]
        print(
            f"| no-server ceiling ({ceiling_shape(raw['ceiling'])}) | | {c:.1f} | | | "
            f"{c / raw['batch1']['seq_per_s']:.2f} | {c / raw['batch32']['seq_per_s']:.2f} | | |"
        )
    for name, runs in report["servers"].items():
        for count in clients:
            r = runs[count]
            naive = f"{r['vs_naive']:.2f}x" if "vs_naive" in r else ""
            print(
                f"| {name} | {count} | {r['req_per_s']:.1f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                f"{r['vs_raw_batch1']:.2f} | {r['vs_raw_batch32']:.2f} | {naive} | {r['errors']} |"
            )
    single = report.get("single_client")
    if single:
        ours = f"p50 {single['modelyard_p50_ms']:.2f} ms / p99 {single['modelyard_p99_ms']:.2f} ms"
        print(
            f"\nsingle client: Modelyard {ours}"
            f" vs raw ORT run() p50 {single['raw_p50_ms']:.2f} ms / p99 {single['raw_p99_ms']:.2f} ms"
            f" (p50 overhead {single['p50_overhead_ms']:+.2f} ms)"
        )
        paired = single.get("paired")
        if paired:
            print(
                f"single client, paired blocks ({paired['samples']} requests): Modelyard p50 "
                f"{paired['served_p50_ms']:.2f} ms vs raw ORT run() p50 {paired['raw_p50_ms']:.2f} ms "
                f"(p50 overhead {paired['overhead_ms']:+.2f} ms; the goal judges this one)"
            )
            if "floor_p50_ms" in paired:
                print(
                    f"the floor in the same blocks (bench/floor_server.py): p50 {paired['floor_p50_ms']:.2f} ms "
                    f"(overhead {paired['floor_overhead_ms']:+.2f} ms), of which the transport alone (echo, no run) "
                    f"{paired['transport_p50_ms']:.2f} ms"
                )
    top = max(clients)
    machine = report["servers"]["modelyard"][top]["cpu"]["machine_cpu_s"]
    stack = report.get("setup", {}).get("server_stack")
    if stack:
        loaded = ", ".join(f"{name} {'yes' if present else 'NO'}" for name, present in stack.items())
        print(f"\nModelyard's server loaded: {loaded}")
    print(f"\nwhere the CPU went at {top} clients (the machine had {machine} CPU-s):")
    for name, runs in report["servers"].items():
        cpu = runs[top]["cpu"]
        loop = f"{cpu['event_loop_cpu_s']:5.2f} s ({cpu['event_loop_ms_per_request']:.3f} ms/request)"
        ort = f"{cpu['other_threads_cpu_s']:5.2f} s ({cpu['other_threads_share']:.0%} of the machine)"
        print(f"  {name:<15} event loop {loop}, other threads (ORT) {ort}, load {cpu['load_generator_cpu_s']:.2f} s")
    t = report["targets"]
    print(f"target: {ratios_line(t)}")
    if line := ceiling_line(t):
        print(f"ceiling: {line}")
    if "grpc_vs_http_binary" in t:
        grpc = report["servers"]["modelyard-grpc"]
        http = report["servers"]["modelyard"]
        pairs = ", ".join(
            f"{count} clients {grpc[count]['req_per_s']:.1f} vs {http[count]['req_per_s']:.1f} req/s "
            f"({grpc[count]['vs_http_binary']:.2f}x)"
            for count in clients
        )
        print(f"gRPC vs HTTP binary: {pairs}; target at {t['clients']}: >= 1.00x with 0 errors ({t['grpc_errors']})")


if __name__ == "__main__":
    sys.exit(main())
