"""Swap benchmark: hot swaps of a real model under constant load, across two inference processes.

    .venv/bin/python bench/swap.py [--swaps 20] [--clients 2] [--steady-seconds 8]
        [--load-nice 0] [--load-nice-seconds 1] [--optimized-cache-bytes 0] [--shared-cache]

What it does, all on 127.0.0.1 and cleaned up afterwards:

1. creates the PostgreSQL database ``modelyard_bench`` (postgres@127.0.0.1:5432; dropped at the end);
2. builds v2 of all-MiniLM-L6-v2 (``../shared/models/minilm-l6/model.onnx``) by appending a ``Neg`` to
   its output, so v2's embedding is exactly minus v1's: every response says which version computed it;
3. starts the registry (``modelyard serve --role web --migrate``), creates two tokens with
   ``modelyard createtoken`` (a maintainer who asks, an approver who approves), uploads both versions
   and points ``production`` at v1;
4. starts two ``modelyard serve --role inference`` processes (CPU, one ORT thread each; the reconcile
   loop wakes on PostgreSQL NOTIFY and polls every ``--poll-seconds``); loads run ``--load-nice`` lower
   (for at most ``--load-nice-seconds``) and save ONNX Runtime's optimised graph when
   ``--optimized-cache-bytes`` is above 0 (both off by default, as in the product); ``--shared-cache``
   gives both one artifact cache, as processes of one host);
5. sends /v2 infer requests (batch 1, sequence length 32) without pause from ``--clients`` keep-alive
   clients per process, first for ``--steady-seconds`` of steady state, then through ``--swaps``
   promotions of ``production`` that alternate v2 and v1 (request, then approval).

For each swap it measures the time from the approval's response (and from its request) until every
process answered with the new version, and until the fleet API showed both processes serving it with
the old version released. It counts failed or wrong responses, and compares the p99 latency during
swaps with the steady state. It prints a table and writes bench/results/swap.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import run_in_workdir

from modelyard.processes import kill_group

ROOT = Path(__file__).resolve().parent.parent
MODEL_PATH = ROOT.parent / "shared" / "models" / "minilm-l6" / "model.onnx"
REFERENCE = MODEL_PATH.parent / "reference.json"
DB_NAME = "modelyard_bench"
ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
DATABASE_URL = f"postgres://postgres@127.0.0.1:5432/{DB_NAME}"
MODEL = "minilm"
SEQ_LEN = 32
MIB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


# --- the model and its input ---------------------------------------------------------------------


def write_negated(source: Path, target: Path) -> None:
    """v2: the same graph with ``Neg`` on ``sentence_embedding`` (same signature, outputs exactly negated)."""
    import onnx
    from onnx import helper

    model = onnx.load(str(source))
    output = model.graph.output[0].name
    for node in model.graph.node:
        for index, name in enumerate(node.output):
            if name == output:
                node.output[index] = f"{output}_v1"
    model.graph.node.append(helper.make_node("Neg", [f"{output}_v1"], [output], name="bench_negate"))
    model.producer_version = "bench-v2"
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(target))


def bench_input() -> dict[str, list[int]]:
    """The first reference text's token ids, padded to SEQ_LEN, with its attention mask."""
    reference = json.loads(REFERENCE.read_text())
    ids, mask = reference["input_ids"][0], reference["attention_mask"][0]
    pad = SEQ_LEN - len(ids)
    return {"input_ids": ids + [0] * pad, "attention_mask": mask + [0] * pad}


def infer_body(tokens: dict[str, list[int]]) -> bytes:
    inputs = [
        {"name": name, "datatype": "INT64", "shape": [1, SEQ_LEN], "data": values} for name, values in tokens.items()
    ]
    return json.dumps({"inputs": inputs}).encode()


def reference_embedding(path: Path, tokens: dict[str, list[int]]) -> list[float]:
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {name: np.asarray([values], dtype=np.int64) for name, values in tokens.items()}
    return [float(v) for v in session.run(None, feeds)[0][0]]


# --- processes -----------------------------------------------------------------------------------


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODELYARD_", "DJANGO_"))}
    env.update(DJANGO_SETTINGS_MODULE="modelyard.settings", PYTHONUNBUFFERED="1", MODELYARD_DATABASE_URL=DATABASE_URL)
    env.update(MODELYARD_BENCHMARKS="false")  # each promoted version's benchmark job would share the CPU under load
    env.update(extra)
    return env


class Server:
    def __init__(self, name: str, role: str, env: dict[str, str], work: Path, *args: str) -> None:
        self.name = name
        self.port = free_port()
        self.log_path = work / f"{name}.log"
        argv = [sys.executable, "-m", "modelyard.cli", "serve", "--role", role, "--port", str(self.port)]
        argv += ["--grpc-port", "0", "--log-level", "warning", *args]  # this benchmark measures HTTP
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait(self, path: str, statuses: set[int], timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log_path.read_text(errors='replace')}")
            try:
                if request(self.port, "GET", path)[0] in statuses:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout} s:\n{self.log_path.read_text(errors='replace')}")

    def kill(self) -> None:
        kill_group(self.process)


def request(port: int, method: str, path: str, token: str = "", body: Any = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    payload = None
    if body is not None:
        payload = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(data)
    except ValueError:
        return response.status, data.decode(errors="replace")


def upload(port: int, token: str, path: Path) -> int:
    """Stream one .onnx file as a multipart upload; returns the new version number."""
    boundary = uuid.uuid4().hex
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="model.onnx"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.putrequest("POST", f"/api/v1/models/{MODEL}/versions")
    conn.putheader("Authorization", f"Bearer {token}")
    conn.putheader("Content-Type", f"multipart/form-data; boundary={boundary}")
    conn.putheader("Content-Length", str(len(head) + path.stat().st_size + len(tail)))
    conn.endheaders()
    conn.send(head)
    with path.open("rb") as source:
        while chunk := source.read(MIB):
            conn.send(chunk)
    conn.send(tail)
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    if response.status != 201:
        raise RuntimeError(f"upload of {path} failed: {response.status} {body}")
    return int(body["version"])


def createtoken(env: dict[str, str], username: str, role: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "modelyard.cli", "createtoken", username, "--create-user", "--role", role]
    return subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def token_of(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate(timeout=120)
    if process.returncode != 0:
        raise RuntimeError(f"createtoken failed: {err}")
    return out.strip().splitlines()[-1]


# --- load ----------------------------------------------------------------------------------------


@dataclass
class Answer:
    process: int
    sent: float
    received: float
    status: int
    version: str
    correct: bool
    error: str = ""


class Load:
    """Keep-alive clients sending the same infer request back to back to each inference process."""

    def __init__(self, ports: list[int], clients: int, body: bytes, expected: dict[str, list[float]]) -> None:
        self.ports = ports
        self.body = body
        self.expected = expected
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(index,), daemon=True)
            for index in range(len(ports))
            for _ in range(clients)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def snapshot(self) -> list[Answer]:
        with self._lock:
            return list(self.answers)

    def since(self, index: int) -> tuple[list[Answer], int]:
        """The answers recorded from ``index`` on, and the index to ask from next time."""
        with self._lock:
            return self.answers[index:], len(self.answers)

    def _check(self, body: dict[str, Any]) -> bool:
        expected = self.expected.get(body.get("model_version", ""))
        if expected is None:
            return False
        [output] = body["outputs"]
        return len(output["data"]) == len(expected) and all(
            abs(a - b) <= 1e-4 for a, b in zip(output["data"], expected, strict=True)
        )

    def _run(self, index: int) -> None:
        port = self.ports[index]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        headers = {"Content-Type": "application/json"}
        path = f"/v2/models/{MODEL}/infer"
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                conn.request("POST", path, self.body, headers)
                response = conn.getresponse()
                raw = response.read()
                received = time.monotonic()
                if response.status == 200:
                    body = json.loads(raw)
                    answer = Answer(index, sent, received, 200, body["model_version"], self._check(body))
                else:
                    text = raw.decode(errors="replace")[:200]
                    answer = Answer(index, sent, received, response.status, "", False, text)
            except Exception as exc:  # noqa: BLE001 - a failed request is a result, not a crash
                answer = Answer(index, sent, time.monotonic(), 0, "", False, f"{type(exc).__name__}: {exc}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            with self._lock:
                self.answers.append(answer)
        conn.close()


# --- the run -------------------------------------------------------------------------------------


def create_database() -> None:
    import psycopg

    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')


def drop_database() -> None:
    import psycopg

    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


def fleet_converged(web: Server, token: str, workers: list[str], version: int) -> bool:
    status, body = request(web.port, "GET", "/api/v1/fleet", token)
    if status != 200:
        return False
    rows = {w["worker_id"]: w["loaded"] for w in body if w["online"]}
    wanted = [(version, ["production"], "ready")]
    return all([(r["version"], r["aliases"], r["state"]) for r in rows.get(w, [])] == wanted for w in workers)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    servers: list[Server] = []
    create_database()
    try:
        return _run(args, work, servers)
    finally:
        for server in servers:
            server.kill()
        drop_database()


def _run(args: argparse.Namespace, work: Path, servers: list[Server]) -> dict[str, Any]:
    v2_path = work / "v2" / "model.onnx"
    write_negated(MODEL_PATH, v2_path)
    tokens = bench_input()
    e1 = reference_embedding(MODEL_PATH, tokens)
    expected = {"1": e1, "2": [-v for v in e1]}
    storage = (work / "artifacts").as_uri()

    web_env = base_env(MODELYARD_DATA_DIR=str(work / "web"), MODELYARD_STORAGE_URL=storage)
    web = Server("web", "web", web_env, work, "--migrate")
    servers.append(web)
    web.wait("/api/v1/fleet", {401, 403})
    pending = [createtoken(web_env, "alice", "maintainer"), createtoken(web_env, "bob", "approver")]
    alice, bob = (token_of(p) for p in pending)

    assert request(web.port, "POST", "/api/v1/models", alice, {"name": MODEL})[0] == 201
    numbers = [upload(web.port, alice, MODEL_PATH), upload(web.port, alice, v2_path)]
    for number in numbers:
        deadline = time.monotonic() + 300
        while request(web.port, "GET", f"/api/v1/models/{MODEL}/versions/{number}", alice)[1]["status"] != "ready":
            if time.monotonic() > deadline:
                raise RuntimeError(f"version {number} did not validate")
            time.sleep(0.2)

    def promote(version: int) -> tuple[float, float]:
        """Request and approve; returns (approval sent, approval answered) on the monotonic clock."""
        status, body = request(
            web.port, "PUT", f"/api/v1/models/{MODEL}/aliases/production", alice, {"version": version}
        )
        assert status == 202, body
        sent = time.monotonic()
        status, decided = request(web.port, "POST", f"/api/v1/promotions/{body['id']}/approve", bob, {})
        assert status == 200, decided
        return sent, time.monotonic()

    promote(1)
    workers = ["inf-1", "inf-2"]
    host_secret = uuid.uuid4().hex + uuid.uuid4().hex
    inference = []
    for worker in workers:
        env = base_env(
            MODELYARD_DATA_DIR=str(work / worker),
            MODELYARD_STORAGE_URL=storage,
            MODELYARD_WORKER_ID=worker,
            MODELYARD_PROVIDERS="cpu",
            MODELYARD_INFERENCE_PUBLIC="true",
            # The registry's signing key (made by the web process on its first start): loads verify with it.
            MODELYARD_SIGNING_KEY=str(work / "web" / "signing-key.pem"),
            MODELYARD_ORT_INTRA_OP_THREADS="1",
            MODELYARD_RECONCILE_POLL_SECONDS=str(args.poll_seconds),
            MODELYARD_FLEET_HEARTBEAT_SECONDS="1",
            MODELYARD_LOAD_NICE=str(args.load_nice),
            MODELYARD_LOAD_NICE_SECONDS=str(args.load_nice_seconds),
            MODELYARD_ORT_OPTIMIZED_CACHE_MAX_BYTES=str(args.optimized_cache_bytes),
            MODELYARD_GC_TUNING=args.gc_tuning,
        )
        if args.shared_cache:  # the processes of one host: one artifact cache, one saved optimised graph per version
            env["MODELYARD_CACHE_DIR"] = str(work / "cache")
            env["MODELYARD_SECRET_KEY"] = host_secret  # what checks the saved graphs: one per host, as with --workers
        server = Server(worker, "inference", env, work)
        servers.append(server)
        inference.append(server)
    for server in inference:
        server.wait("/v2/health/ready", {200})  # ready = v1 loaded

    load = Load([s.port for s in inference], args.clients, infer_body(tokens), expected)
    load.start()
    started = time.monotonic()
    time.sleep(args.steady_seconds)
    steady_end = time.monotonic()

    swaps = []
    for index in range(args.swaps):
        version = 2 if index % 2 == 0 else 1
        _, cursor = load.since(0)
        sent, acked = promote(version)
        seen: dict[int, float] = {}
        fleet_at = None
        next_fleet_check = 0.0
        deadline = acked + 120
        while (len(seen) < len(inference) or fleet_at is None) and time.monotonic() < deadline:
            fresh, cursor = load.since(cursor)
            for answer in fresh:
                if answer.received > sent and answer.version == str(version):
                    seen[answer.process] = min(seen.get(answer.process, answer.received), answer.received)
            if fleet_at is None and time.monotonic() >= next_fleet_check:
                next_fleet_check = time.monotonic() + 0.1
                if fleet_converged(web, alice, workers, version):
                    fleet_at = time.monotonic()
            time.sleep(0.02)
        if len(seen) < len(inference) or fleet_at is None:
            raise RuntimeError(f"swap {index + 1} to v{version} did not converge: {seen}, fleet {fleet_at}")
        all_serving = max(seen.values())
        swaps.append(
            {
                "to": version,
                "approval_sent": sent - started,
                "approval_answered": acked - started,
                "every_process_serving_s": max(0.0, all_serving - acked),
                "every_process_serving_from_request_s": all_serving - sent,
                "fleet_reports_s": fleet_at - acked,
                "settled": fleet_at - started,
            }
        )
        time.sleep(args.settle_seconds)
    swap_end = time.monotonic()
    load.stop()

    answers = load.snapshot()
    warm = started + 1.0

    def window(lo: float, hi: float) -> list[Answer]:
        return [a for a in answers if lo <= a.sent < hi]

    steady = window(warm, steady_end)
    during = window(steady_end, swap_end)
    in_swap = [a for a in during if any(s["approval_sent"] <= a.sent - started <= s["settled"] for s in swaps)]

    def latencies(chosen: list[Answer]) -> list[float]:
        return [(a.received - a.sent) * 1000 for a in chosen if a.status == 200]

    failed = [a for a in answers if a.status != 200]
    wrong = [a for a in answers if a.status == 200 and not a.correct]
    steady_p99 = percentile(latencies(steady), 99)
    return {
        "model": "all-MiniLM-L6-v2 (90 MB), batch 1, sequence length 32; v2 = v1 with Neg on the output",
        "processes": len(inference),
        "clients_per_process": args.clients,
        "reconcile_poll_seconds": args.poll_seconds,
        "load_nice": args.load_nice,
        "load_nice_seconds": args.load_nice_seconds,
        "optimized_cache_bytes": args.optimized_cache_bytes,
        "shared_cache": args.shared_cache,
        "swaps": len(swaps),
        "swap_median_s": statistics.median(s["every_process_serving_s"] for s in swaps),
        "swap_max_s": max(s["every_process_serving_s"] for s in swaps),
        "swap_median_from_request_s": statistics.median(s["every_process_serving_from_request_s"] for s in swaps),
        "fleet_report_median_s": statistics.median(s["fleet_reports_s"] for s in swaps),
        "requests": len(answers),
        "requests_during_swaps": len(during),
        "failed_requests": len(failed),
        "failed_during_swaps": len([a for a in during if a.status != 200]),
        "wrong_outputs": len(wrong),
        "failures": [{"status": a.status, "error": a.error} for a in failed[:10]],
        "steady_rps": len(steady) / max(1e-9, steady_end - warm),
        "swap_phase_rps": len(during) / max(1e-9, swap_end - steady_end),
        "steady_p50_ms": percentile(latencies(steady), 50),
        "steady_p99_ms": steady_p99,
        "swap_windows_p50_ms": percentile(latencies(in_swap), 50),
        "swap_windows_p99_ms": percentile(latencies(in_swap), 99),
        "swap_phase_p99_ms": percentile(latencies(during), 99),
        "p99_ratio_swap_windows_vs_steady": percentile(latencies(in_swap), 99) / steady_p99,
        "p99_ratio_swap_phase_vs_steady": percentile(latencies(during), 99) / steady_p99,
        "per_swap": swaps,
    }


def report(result: dict[str, Any]) -> None:
    rows = [
        ("model", result["model"]),
        ("inference processes x clients each", f"{result['processes']} x {result['clients_per_process']}"),
        ("swaps (alternating v2/v1 on production)", result["swaps"]),
        ("alias move -> every process serving, median", f"{result['swap_median_s'] * 1000:.0f} ms"),
        ("alias move -> every process serving, max", f"{result['swap_max_s'] * 1000:.0f} ms"),
        ("approval request -> every process serving, median", f"{result['swap_median_from_request_s'] * 1000:.0f} ms"),
        ("alias move -> fleet API shows it, median", f"{result['fleet_report_median_s'] * 1000:.0f} ms"),
        ("requests (during swaps)", f"{result['requests']} ({result['requests_during_swaps']})"),
        ("failed requests (during swaps)", f"{result['failed_requests']} ({result['failed_during_swaps']})"),
        ("responses with wrong outputs", result["wrong_outputs"]),
        ("throughput steady / swap phase", f"{result['steady_rps']:.0f} / {result['swap_phase_rps']:.0f} req/s"),
        ("p50 steady / swap windows", f"{result['steady_p50_ms']:.1f} / {result['swap_windows_p50_ms']:.1f} ms"),
        ("p99 steady", f"{result['steady_p99_ms']:.1f} ms"),
        (
            "p99 swap windows (ratio)",
            f"{result['swap_windows_p99_ms']:.1f} ms ({result['p99_ratio_swap_windows_vs_steady']:.2f}x)",
        ),
        (
            "p99 whole swap phase (ratio)",
            f"{result['swap_phase_p99_ms']:.1f} ms ({result['p99_ratio_swap_phase_vs_steady']:.2f}x)",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--swaps", type=int, default=20)
    parser.add_argument("--clients", type=int, default=2, help="client threads per inference process")
    parser.add_argument("--steady-seconds", type=float, default=8.0)
    parser.add_argument("--settle-seconds", type=float, default=1.0, help="pause after each swap converged")
    parser.add_argument("--poll-seconds", type=float, default=5.0, help="MODELYARD_RECONCILE_POLL_SECONDS")
    parser.add_argument(
        "--load-nice", type=int, default=0, help="MODELYARD_LOAD_NICE (0, the default: loads at serving priority)"
    )
    parser.add_argument(
        "--load-nice-seconds", type=float, default=1.0, help="MODELYARD_LOAD_NICE_SECONDS (0: the whole load)"
    )
    parser.add_argument(
        "--optimized-cache-bytes",
        type=int,
        default=0,
        help="MODELYARD_ORT_OPTIMIZED_CACHE_MAX_BYTES (0, the default: no saved optimised graphs)",
    )
    parser.add_argument(
        "--gc-tuning", choices=("true", "false"), default="true", help="MODELYARD_GC_TUNING (true, the default)"
    )
    parser.add_argument(
        "--shared-cache", action="store_true", help="one MODELYARD_CACHE_DIR for both processes, as on one host"
    )
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "swap.json")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, models)")
    args = parser.parse_args(argv)
    if not MODEL_PATH.exists():
        print(f"{MODEL_PATH} is missing", file=sys.stderr)
        return 2

    return run_in_workdir(
        prefix="modelyard-bench-swap-",
        run=lambda work: run(args, work),
        report=report,
        output=args.output,
        keep=args.keep,
        passed=lambda result: result["failed_requests"] == 0 and result["wrong_outputs"] == 0,
    )


if __name__ == "__main__":
    sys.exit(main())
