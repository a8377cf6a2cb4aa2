"""The served path on the GPU against raw ONNX Runtime, in one run: what ``bench/gpu/run.sh`` runs on the H200.

    python bench/gpu/gpu_serve.py --model model.onnx [--device cuda|cpu] [--workers 1,4,8] [--clients 64,384]

1. Raw ONNX Runtime in this process on the device: sequential batch-1 and batch-128 at seq 32, the
   ceiling the served path is compared with.
2. ``modelyard serve --role all --workers N``, embedded: SQLite and an artifact folder in a temp
   directory, tasks in-process. On CUDA with ``MODELYARD_REQUIRE_GPU=true``, so a CUDA that does not
   load shows as a failed version with its reason instead of a quiet CPU run.
3. The model goes in as a user's would, through the REST API: create it, set dynamic batching
   (``max_batch_size``, ``max_queue_delay_us``), multipart upload, validation, a production request
   and its approval by a second person.
4. Wait until every worker of this server reports the version ``ready`` on the expected provider in
   ``GET /api/v1/fleet``, and check one ``/v2`` answer against raw ORT.
5. Closed-loop batch-1 clients with binary tensors (Triton's extension), from separate processes,
   at each concurrency; then the next N.

Everything measured goes to ``--out`` as JSON, also when a step fails (with the error and the server
log's tail), so one device call always brings back what happened.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MODEL = "minilm"
TARGETS = {"req_per_s": 10_000, "p99_ms": 100.0, "vs_raw_batch128": 0.5}


# --- inputs --------------------------------------------------------------------------------------------


def feeds(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids below 1000 (valid for every preset's vocabulary); values do not change the speed."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(100, 1000, size=(batch, seq), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones((batch, seq), dtype=np.int64)}


def binary_request(port: int, one: dict[str, np.ndarray]) -> bytes:
    """A whole HTTP/1.1 request: JSON header, then the raw little-endian tensors; binary outputs asked for."""
    inputs = [
        {"name": n, "datatype": "INT64", "shape": list(a.shape), "parameters": {"binary_data_size": a.nbytes}}
        for n, a in one.items()
    ]
    header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    body = header + b"".join(a.astype("<i8").tobytes() for a in one.values())
    head = (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


# --- raw ONNX Runtime ------------------------------------------------------------------------------------


def raw_session(model: Path, device: str) -> Any:
    import onnxruntime as ort

    providers: list[Any] = ["CPUExecutionProvider"]
    if device == "cuda":
        ort.preload_dlls()
        providers = [("CUDAExecutionProvider", {"device_id": "0"}), "CPUExecutionProvider"]
    return ort.InferenceSession(str(model), providers=providers)


def raw_ort(session: Any, seq: int, batch: int, seconds: float) -> dict[str, Any]:
    one, many = feeds(1, seq), feeds(batch, seq)
    for _ in range(10):
        session.run(None, one)
    latencies = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        session.run(None, one)
        latencies.append(time.perf_counter() - started)
    for _ in range(3):
        session.run(None, many)
    runs, spent = 0, 0.0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        session.run(None, many)
        spent += time.perf_counter() - started
        runs += 1
    ms = np.asarray(latencies) * 1000
    result: dict[str, Any] = {
        "providers": session.get_providers(),
        "batch1": {"seq_per_s": len(latencies) / sum(latencies), "p50_ms": float(np.percentile(ms, 50))},
    }
    # --raw-batch 1 (a model whose batch dimension is fixed at 1): one entry, with both measurements' figures
    many_figures = {"seq_per_s": runs * batch / spent, "ms_per_batch": spent / runs * 1000, "runs": runs}
    result[f"batch{batch}"] = {**result.get(f"batch{batch}", {}), **many_figures}
    return result


# --- the server and its REST API ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Api:
    """The REST API as a client sees it: JSON in, JSON out, a bearer token."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.token = token

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        return response.status, json.loads(data) if data else None

    def upload(self, model: str, path: Path) -> tuple[int, Any]:
        """A multipart upload streamed from disk, as ``curl -F file=@model.onnx`` sends it."""
        boundary = f"modelyard-bench-{secrets.token_hex(8)}"
        before = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{path.name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        after = (
            f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="description"\r\n\r\nbench/gpu\r\n'
            f"--{boundary}--\r\n"
        ).encode()

        def parts() -> Iterator[bytes]:
            yield before
            with path.open("rb") as fh:
                while chunk := fh.read(1 << 20):
                    yield chunk
            yield after

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Content-Type": f"multipart/form-data; boundary={boundary}",
            "Content-Length": str(len(before) + path.stat().st_size + len(after)),
        }
        try:
            conn.request("POST", f"/api/v1/models/{model}/versions", body=parts(), headers=headers)
            response = conn.getresponse()
            return response.status, json.loads(response.read())
        finally:
            conn.close()


def server_env(data_dir: Path, device: str) -> dict[str, str]:
    # MODELYARD_CUDA_* and MODELYARD_ORT_* pass through, so one run can be compared with another.
    passed = ("MODELYARD_CUDA_", "MODELYARD_ORT_", "MODELYARD_TRT_")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELYARD_") or k.startswith(passed)}
    env.update(
        DJANGO_SETTINGS_MODULE="modelyard.settings",
        MODELYARD_DATA_DIR=str(data_dir),
        MODELYARD_PROVIDERS="cuda,cpu" if device == "cuda" else "cpu",
        MODELYARD_REQUIRE_GPU="true" if device == "cuda" else "false",
        MODELYARD_INFERENCE_PUBLIC="true",  # raw ORT checks no token either
        MODELYARD_API_RATE_USER="off",
        MODELYARD_LOG_LEVEL="WARNING",
        MODELYARD_FLEET_HEARTBEAT_SECONDS="1",
        MODELYARD_RECONCILE_POLL_SECONDS="1",
        MODELYARD_BENCHMARKS="false",  # the version's own benchmark job would share the GPU with the load measured here
        PYTHONUNBUFFERED="1",
    )
    return env


def create_token(env: dict[str, str], username: str, role: str) -> str:
    command = [sys.executable, "-m", "modelyard.cli", "createtoken", username, "--create-user", "--role", role]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:  # the device call brings back only --out: say why, not just the status
        raise RuntimeError(f"createtoken exited with {done.returncode}: {(done.stdout + done.stderr)[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


class Server:
    """``modelyard serve --role all --workers N`` in its own process group, its output in a log file."""

    def __init__(self, env: dict[str, str], workers: int, log: Path) -> None:
        self.port = free_port()
        self.log = log
        self.started_at = datetime.now().astimezone()
        command = [
            sys.executable,
            "-m",
            "modelyard.cli",
            "serve",
            "--role",
            "all",
            "--port",
            str(self.port),
            "--workers",
            str(workers),
            "--grpc-port",
            str(free_port()),  # never 8001: CI runs this beside other servers; the run measures HTTP
            "--log-level",
            "warning",
        ]
        self.process = subprocess.Popen(
            command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
        )

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def wait_live(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"modelyard serve exited with {self.process.returncode}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/v2/health/live")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"modelyard serve was not live within {timeout} s")

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def register(owner: Api, approver: Api, model: Path, max_batch_size: int, max_delay_us: int) -> dict[str, Any]:
    """Create, configure, upload, validate and promote the model through the REST API; return what it took."""
    took: dict[str, Any] = {}
    status, body = owner.call("POST", "/api/v1/models", {"name": MODEL, "description": "bench/gpu"})
    if status not in (201, 409):
        raise RuntimeError(f"creating the model: {status} {body}")
    batching = {"max_batch_size": max_batch_size, "max_queue_delay_us": max_delay_us}
    status, body = owner.call("PATCH", f"/api/v1/models/{MODEL}", batching)
    if status != 200:
        raise RuntimeError(f"setting batching: {status} {body}")
    started = time.perf_counter()
    status, body = owner.upload(MODEL, model)
    if status != 201:
        raise RuntimeError(f"upload: {status} {body}")
    version = body["version"]
    took["upload_s"] = round(time.perf_counter() - started, 2)
    deadline = time.monotonic() + 600
    while body["status"] not in ("ready", "failed"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"version {version} still {body['status']} after 600 s")
        time.sleep(0.5)
        status, body = owner.call("GET", f"/api/v1/models/{MODEL}/versions/{version}")
    took["validated_s"] = round(time.perf_counter() - started, 2)
    if body["status"] != "ready":
        raise RuntimeError(f"version {version} failed validation: {body.get('errors')}")
    status, body = owner.call(
        "PUT", f"/api/v1/models/{MODEL}/aliases/production", {"version": version, "reason": "bench/gpu"}
    )
    if status == 202:
        status, body = approver.call("POST", f"/api/v1/promotions/{body['id']}/approve", {"reason": "bench/gpu"})
    if status != 200:
        raise RuntimeError(f"promoting version {version}: {status} {body}")
    took["version"] = version
    return took


def wait_for_fleet(api: Api, server: Server, workers: int, version: int, provider: str) -> list[dict[str, Any]]:
    """Every worker of this server serving ``version`` ready on ``provider``; a failed load stops the run."""
    deadline = time.monotonic() + 300
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        status, fleet = api.call("GET", "/api/v1/fleet?online=true")
        if status != 200:
            raise RuntimeError(f"GET /api/v1/fleet: {status} {fleet}")
        mine = [w for w in fleet if datetime.fromisoformat(w["started_at"]) >= server.started_at]
        rows = []
        for worker in mine:
            for row in worker["loaded"]:
                if row["model"] == MODEL and row["version"] == version:
                    if row["state"] == "failed" or (row["state"] == "loading" and row["error"]):
                        raise RuntimeError(f"{worker['worker_id']} could not load the model: {row['error']}")
                    rows.append({"worker": worker["worker_id"], "device": worker["device"], **row})
        ready = [r for r in rows if r["state"] == "ready"]
        if len(ready) >= workers:
            wrong = [r for r in ready if r["provider"] != provider]
            if wrong:
                raise RuntimeError(f"served on another provider than {provider}: {wrong}")
            return ready
        if server.process.poll() is not None:
            raise RuntimeError("modelyard serve exited while loading")
        time.sleep(0.5)
    raise RuntimeError(f"{workers} workers did not all serve version {version} within 300 s: {rows}")


def set_instances(api: Api, server: Server, workers: int, version: int, instances: int) -> None:
    """PATCH the model's ``instances`` and wait until every worker's fleet row runs that many batches at once."""
    status, body = api.call("PATCH", f"/api/v1/models/{MODEL}", {"instances": instances})
    if status != 200:
        raise RuntimeError(f"setting instances: {status} {body}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status, fleet = api.call("GET", "/api/v1/fleet?online=true")
        rows = [
            row
            for worker in fleet
            if datetime.fromisoformat(worker["started_at"]) >= server.started_at
            for row in worker["loaded"]
            if row["model"] == MODEL and row["version"] == version and row["state"] == "ready"
        ]
        if len(rows) >= workers and all(row.get("instances") == instances for row in rows):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the workers did not report instances {instances} within 120 s")


def check_answer(port: int, one: dict[str, np.ndarray], expected: np.ndarray) -> float:
    """One /v2 request; the largest difference from raw ORT's output (and an error when it is not small)."""
    request = binary_request(port, one)
    head, _, body = request.partition(b"\r\n\r\n")
    headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", f"/v2/models/{MODEL}/infer", body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"/v2 answered {response.status}: {data[:500]!r}")
        length = int(response.getheader("Inference-Header-Content-Length") or 0)
    finally:
        conn.close()
    (output,) = json.loads(data[:length])["outputs"]
    got = np.frombuffer(data[length:], dtype="<f4").reshape(output["shape"])
    difference = float(np.max(np.abs(got - expected)))
    if difference > 1e-3:
        raise RuntimeError(f"/v2 computes something else than raw ORT: max difference {difference}")
    return difference


# --- load: closed-loop batch-1 clients in separate processes ---------------------------------------------


async def _client(port: int, request: bytes, streams: Any, end: float, out: list[float]) -> int:
    errors = 0
    reader, writer = streams
    while time.monotonic() < end:
        began = time.perf_counter()
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            lowered = head.lower()
            at = lowered.find(b"\r\ncontent-length:")  # not Inference-Header-Content-Length
            if at < 0:
                raise ConnectionError("a response without Content-Length")
            await reader.readexactly(int(lowered[at + 17 : lowered.find(b"\r\n", at + 2)]))
            if head[9:12] != b"200":
                errors += 1
            out.append(time.perf_counter() - began)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            errors += 1
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.close()
    return errors


def _load_process(port: int, request: bytes, connections: int, seconds: float, barrier: Any, queue: Any) -> None:
    async def run() -> tuple[list[float], int]:
        streams = [await asyncio.open_connection("127.0.0.1", port) for _ in range(connections)]
        await asyncio.get_running_loop().run_in_executor(None, barrier.wait)  # every process connected: go
        end = time.monotonic() + seconds
        latencies: list[float] = []
        errors = await asyncio.gather(*(_client(port, request, pair, end, latencies) for pair in streams))
        return latencies, sum(errors)

    queue.put(asyncio.run(run()))


def load(port: int, request: bytes, clients: int, seconds: float, processes: int) -> dict[str, Any]:
    """``clients`` keep-alive connections spread over ``processes``, each sending the next request on an answer."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = max(1, min(processes, clients))
    barrier = context.Barrier(processes + 1)
    shares = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    workers = [
        context.Process(target=_load_process, args=(port, request, share, seconds, barrier, queue)) for share in shares
    ]
    for worker in workers:
        worker.start()
    barrier.wait(timeout=120)
    latencies: list[float] = []
    errors = 0
    for _ in workers:
        got, failed = queue.get(timeout=seconds + 120)
        latencies += got
        errors += failed
    for worker in workers:
        worker.join()
    ms = np.asarray(latencies or [0.0]) * 1000
    return {
        "clients": clients,
        "req_per_s": len(latencies) / seconds,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "requests": len(latencies),
        "errors": errors,
    }


# --- the run --------------------------------------------------------------------------------------------


def gpu_info() -> str:
    try:
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        return subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        return ""


def run(args: argparse.Namespace, work: Path, result: dict[str, Any]) -> None:
    import onnxruntime as ort

    provider = "CUDAExecutionProvider" if args.device == "cuda" else "CPUExecutionProvider"
    result["setup"] = {
        "device": args.device,
        "gpu": gpu_info(),
        "model": json.loads(args.model.with_suffix(".json").read_text())
        if args.model.with_suffix(".json").exists()
        else str(args.model),
        "seq": args.seq,
        "max_batch_size": args.max_batch_size,
        "max_queue_delay_us": args.max_queue_delay_us,
        "instances": args.instances,
        "onnxruntime": f"{ort.__version__} {ort.__file__}",
        "available_providers": ort.get_available_providers(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_processes": args.load_processes,
        "duration_s": args.duration,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print(f"raw ONNX Runtime on {args.device} ({result['setup']['gpu'] or platform.processor()}):", flush=True)
    session = raw_session(args.model, args.device)
    raw = result["raw_ort"] = raw_ort(session, args.seq, args.raw_batch, args.raw_seconds)
    ceiling = raw[f"batch{args.raw_batch}"]["seq_per_s"]
    print(f"  providers {raw['providers']}", flush=True)
    print(
        f"  batch-1 {raw['batch1']['seq_per_s']:.0f} seq/s (p50 {raw['batch1']['p50_ms']:.2f} ms);"
        f" batch-{args.raw_batch} {ceiling:.0f} seq/s",
        flush=True,
    )
    if raw["providers"][0] != provider:
        # Go on: the server's fleet row then says why (MODELYARD_REQUIRE_GPU turns it into the run's error).
        raw["error"] = f"raw ONNX Runtime runs on {raw['providers'][0]}, not {provider}"
        print(f"  {raw['error']}", flush=True)
    one = feeds(1, args.seq, seed=1)
    expected = session.run(None, one)[0]

    env = server_env(work / "data", args.device)
    owner = create_token(env, "bench-owner", "admin")
    approver = create_token(env, "bench-approver", "approver")
    result["served"] = []
    for workers in args.workers:
        print(f"modelyard serve --role all --workers {workers}:", flush=True)
        server = Server(env, workers, work / f"serve-{workers}.log")
        entry: dict[str, Any] = {"workers": workers}
        result["served"].append(entry)
        try:
            server.wait_live()
            api = Api(server.port, owner)
            if "registered" not in result:
                result["registered"] = register(
                    api, Api(server.port, approver), args.model, args.max_batch_size, args.max_queue_delay_us
                )
                print(f"  uploaded and promoted: {result['registered']}", flush=True)
            entry["fleet"] = wait_for_fleet(api, server, workers, result["registered"]["version"], provider)
            for row in entry["fleet"]:
                print(
                    f"  {row['worker']}: {row['device']} {row['provider']} loaded in {row['load_seconds']} s"
                    f"{' note: ' + row['note'] if row['note'] else ''}",
                    flush=True,
                )
            entry["max_difference_from_raw"] = check_answer(server.port, one, expected)
            request = binary_request(server.port, one)
            entry["runs"] = []
            for instances in args.instances:
                if instances:
                    set_instances(api, server, workers, result["registered"]["version"], instances)
                load(server.port, request, max(args.clients), args.warmup, args.load_processes)
                for clients in args.clients:
                    r = load(server.port, request, clients, args.duration, args.load_processes)
                    r["instances"] = instances or "by provider"
                    r["vs_raw_batch1"] = r["req_per_s"] / raw["batch1"]["seq_per_s"]
                    r[f"vs_raw_batch{args.raw_batch}"] = r["req_per_s"] / ceiling
                    entry["runs"].append(r)
                    print(
                        f"  instances {r['instances']}, {clients:4d} clients: {r['req_per_s']:9.0f} req/s"
                        f"  p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  errors {r['errors']}"
                        f"  {r[f'vs_raw_batch{args.raw_batch}']:.0%} of raw batch-{args.raw_batch}",
                        flush=True,
                    )
        except Exception:
            entry["log_tail"] = server.tail()
            raise
        finally:
            server.stop()
    runs = [r for e in result["served"] for r in e.get("runs", [])]
    best = max(runs, key=lambda r: r["req_per_s"])
    result["best"] = best
    result["targets"] = {
        "goals": TARGETS,
        "met": best["req_per_s"] >= TARGETS["req_per_s"]
        and best["p99_ms"] < TARGETS["p99_ms"]
        and best["errors"] == 0
        and best[f"vs_raw_batch{args.raw_batch}"] >= TARGETS["vs_raw_batch128"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the .onnx file (bench/gpu/export_model.py)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--workers", default="1,4,8", help="modelyard serve --workers values, comma-separated")
    parser.add_argument("--clients", default="64,384", help="concurrent batch-1 clients, comma-separated")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before measuring")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--raw-batch", type=int, default=128)
    parser.add_argument("--raw-seconds", type=float, default=3.0)
    parser.add_argument(
        "--instances", default="1,2", help="the model's instances to measure in turn, comma-separated; 0: by provider"
    )
    parser.add_argument("--max-batch-size", type=int, default=128)
    parser.add_argument("--max-queue-delay-us", type=int, default=2000)
    parser.add_argument("--load-processes", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu-serve.json")
    args = parser.parse_args()
    args.workers = [int(n) for n in args.workers.split(",")]
    args.clients = [int(n) for n in args.clients.split(",")]
    args.instances = [int(n) for n in args.instances.split(",")]
    result: dict[str, Any] = {}
    code = 0
    with tempfile.TemporaryDirectory(prefix="modelyard-gpu-bench-") as tmp:
        try:
            run(args, Path(tmp), result)
        except Exception as exc:  # noqa: BLE001 - the device run must bring back what happened
            result["error"] = f"{type(exc).__name__}: {exc}"
            result["traceback"] = traceback.format_exc()
            print(f"FAILED: {result['error']}", file=sys.stderr, flush=True)
            for entry in result.get("served", []):
                if entry.get("log_tail"):
                    print(
                        f"--- modelyard serve --workers {entry['workers']} log:\n{entry['log_tail']}", file=sys.stderr
                    )
            code = 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    if "targets" in result:
        best = result["best"]
        print(
            f"best: {best['req_per_s']:.0f} req/s at {best['clients']} clients, p99 {best['p99_ms']:.1f} ms,"
            f" {best['errors']} errors; targets {'MET' if result['targets']['met'] else 'MISSED'} {TARGETS}"
        )
    print(f"wrote {args.out}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
