"""Priority classes benchmark: a high-class token's p99 on an idle server, then while normal-class clients saturate it.

    .venv/bin/python bench/priority.py [--duration 10] [--clients 32] [--rounds 3] [--database-url ...]
    .venv/bin/python bench/priority.py --duration 2 --rounds 1 --clients 4 --warmup 1     # a smoke run

One ``modelyard serve --role inference`` process serves MiniLM-L6 (``/work/shared/models/minilm-l6``),
promoted to ``production`` through the services, with ``/v2`` behind tokens. The register step makes
two ``inference`` tokens: ``bench-high`` of the ``high`` class and ``bench-normal`` of the ``normal``
class (the default). A probe (one keep-alive connection, one request after another, binary tensors)
measures latency with the high token, first on the idle server, then while ``--clients`` connections
with the normal token send as fast as they are answered (Python processes, as in ``bench/cache.py``).
For comparison, the same probe with the normal token under the same load shows what the class
gains (its p99 is the load's own queueing).

Each round measures idle, then loaded with the high probe, then loaded with the normal probe. The
figure, judged on the median of the rounds: the high probe's p99 loaded over its p99 idle, goal at
most 1.2x, with zero errors from the probe. A batch that is running when a high request arrives is
not preempted, so the ratio depends on how long one batch takes: ``--max-batch-size`` and
``--instances`` are the model's settings. It prints a table and writes bench/results/priority.json.
Everything talks to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from cache import body_of, tokens
from common import ClosedLoad, run_in_workdir, stop_process
from serve import BIN, MODEL_NAME, MODEL_PATH, ROOT, free_port, modelyard_env, percentile_ms, register_served

RESULTS = ROOT / "bench" / "results" / "priority.json"
GOAL = 1.2
PATH = f"/v2/models/{MODEL_NAME}/infer"


# --- setup ------------------------------------------------------------------------------------------


def register(settings_json: str) -> None:
    """Runs in a child process: MiniLM on production, and a high and a normal inference token (to a file)."""
    options = json.loads(settings_json)
    register_served(
        name=MODEL_NAME,
        description="MiniLM-L6 for bench/priority.py",
        files=[("model.onnx", MODEL_PATH)],
        model_settings=options["model"],
    )
    from registry.access import services
    from registry.models import Role

    made = {}
    for klass in ("high", "normal"):
        _, raw = services.token_create(
            username=f"bench-{klass}", create_user=True, roles=[Role.INFERENCE], name=f"bench {klass}", priority=klass
        )
        made[klass] = raw
    Path(options["tokens"]).write_text(json.dumps(made))


def start_server(work: Path, args: argparse.Namespace) -> tuple[Any, int, dict[str, str]]:
    env = modelyard_env(work / "data", args.database_url)
    env["MODELYARD_INFERENCE_PUBLIC"] = "0"  # the class comes with the token
    tokens_file = work / "tokens.json"
    model: dict[str, Any] = {"max_batch_size": args.max_batch_size}
    if args.instances:
        model["instances"] = args.instances
    options = json.dumps({"model": model, "tokens": str(tokens_file)})
    subprocess.run([sys.executable, __file__, "--register", options], env=env, check=True, cwd=ROOT)
    port = free_port()
    log = work / "modelyard.log"
    argv = [str(BIN / "modelyard"), "serve", "--role", "inference", "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(
        [*argv, "--grpc-port", "0", "--log-level", "warning"],
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        cwd=work,
    )
    made = json.loads(tokens_file.read_text())
    wait_served(port, made["high"], process, log)
    return process, port, made


def wait_served(port: int, token: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> None:
    """Until the model answers ready to a token (``/v2`` is not public here, so ``serve.wait_ready`` cannot ask)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited:\n{log.read_text()[-3000:]}")
        try:
            conn = _connect(port)
            conn.request("GET", f"/v2/models/{MODEL_NAME}/ready", headers={"Authorization": f"Bearer {token}"})
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the model was not served in {timeout}s:\n{log.read_text()[-3000:]}")


# --- load ---------------------------------------------------------------------------------------------


def _connect(port: int) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", port, timeout=60)


def authorised_request(token: str, rng: np.random.Generator, sent: int) -> tuple[bytes, dict[str, str]]:
    """A new request (binary tensors) with ``token``."""
    body, headers = body_of(tokens(rng))
    return body, {**headers, "Authorization": f"Bearer {token}"}


def load(port: int, token: str, clients: int, duration: float, seed: int) -> ClosedLoad:
    """``clients`` connections of the normal token over up to 4 processes, for ``duration`` seconds (started now)."""
    return ClosedLoad(
        port, PATH, clients=clients, duration=duration, seed=seed, make=functools.partial(authorised_request, token)
    )


def probe(port: int, token: str, duration: float, seed: int) -> dict[str, Any]:
    """One client, one request after another on one connection, for ``duration`` seconds: its latencies."""
    rng = np.random.default_rng(seed)
    conn = _connect(port)
    latencies: list[float] = []
    errors = 0
    end = time.monotonic() + duration
    try:
        while time.monotonic() < end:
            body, headers = body_of(tokens(rng))
            start = time.perf_counter()
            try:
                conn.request("POST", PATH, body=body, headers={**headers, "Authorization": f"Bearer {token}"})
                response = conn.getresponse()
                response.read()
                errors += response.status != 200
            except OSError:
                errors += 1
                conn.close()
                conn = _connect(port)
            latencies.append(time.perf_counter() - start)
    finally:
        conn.close()
    return {
        "requests": len(latencies),
        "p50_ms": round(percentile_ms(latencies, 50), 2) if latencies else None,
        "p99_ms": round(percentile_ms(latencies, 99), 2) if latencies else None,
        "errors": errors,
    }


def under_load(port: int, made: dict[str, str], probe_token: str, args: argparse.Namespace, seed: int) -> dict:
    """The probe with ``probe_token`` while the normal clients saturate the server (started a second before)."""
    running = load(port, made["normal"], args.clients, args.duration + 2, seed)
    time.sleep(1)  # the load's connections are open and its queue is full before the probe starts
    measured = probe(port, probe_token, args.duration, seed)
    measured["load"] = running.join()
    return measured


def run(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    process, port, made = start_server(work, args)
    try:
        probe(port, made["high"], args.warmup, seed=999)
        load(port, made["normal"], args.clients, args.warmup, seed=998).join()
        rounds: list[dict[str, Any]] = []
        for number in range(1, args.rounds + 1):
            idle = probe(port, made["high"], args.duration, seed=number)
            high = under_load(port, made, made["high"], args, seed=number)
            normal = under_load(port, made, made["normal"], args, seed=number + 1000)
            ratio = high["p99_ms"] / idle["p99_ms"] if idle["p99_ms"] else 0.0
            normal_ratio = normal["p99_ms"] / idle["p99_ms"] if idle["p99_ms"] else 0.0
            rounds.append(
                {
                    "round": number,
                    "idle_high": idle,
                    "loaded_high": high,
                    "loaded_normal": normal,
                    "ratio": round(ratio, 2),
                    "normal_ratio": round(normal_ratio, 2),
                }
            )
            print(
                f"round {number}: high p99 idle {idle['p99_ms']} ms, loaded {high['p99_ms']} ms ({ratio:.2f}x); "
                f"normal probe loaded {normal['p99_ms']} ms ({normal_ratio:.2f}x); "
                f"load {high['load']['req_per_s']} req/s",
                flush=True,
            )
    finally:
        stop_process(process)
    median = statistics.median(r["ratio"] for r in rounds)
    errors = sum(r["idle_high"]["errors"] + r["loaded_high"]["errors"] for r in rounds)
    return {
        "benchmark": "priority",
        "model": "all-MiniLM-L6-v2, sequence length 32, batch-1 requests, binary tensors",
        "command": " ".join([".venv/bin/python", "bench/priority.py", *sys.argv[1:]]),
        "clients": args.clients,
        "duration_s": args.duration,
        "max_batch_size": args.max_batch_size,
        "instances": args.instances,
        "rounds": rounds,
        "median_ratio": median,
        "median_normal_ratio": statistics.median(r["normal_ratio"] for r in rounds),
        "errors": errors,
        "goal": f"high-class p99 under normal-class saturation <= {GOAL}x its p99 idle, zero probe errors",
        "met": median <= GOAL and errors == 0,
    }


def report(result: dict[str, Any]) -> None:
    print("| round | high p99 idle ms | high p99 loaded ms | ratio | normal p99 loaded ms | ratio | load req/s |")
    print("|---|---|---|---|---|---|---|")
    for r in result["rounds"]:
        print(
            f"| {r['round']} | {r['idle_high']['p99_ms']} | {r['loaded_high']['p99_ms']} | {r['ratio']:.2f}x | "
            f"{r['loaded_normal']['p99_ms']} | {r['normal_ratio']:.2f}x | {r['loaded_high']['load']['req_per_s']} |"
        )
    verdict = "met" if result["met"] else "missed"
    print(
        f"median ratio {result['median_ratio']:.2f}x (goal <= {GOAL}x, zero probe errors; a normal-class probe: "
        f"{result['median_normal_ratio']:.2f}x): {verdict}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description="Priority classes benchmark: a high token's p99, idle and saturated")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of warm-up")
    parser.add_argument("--clients", type=int, default=32, help="concurrent normal-class connections")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-batch-size", type=int, default=8, help="the model's max_batch_size")
    parser.add_argument("--instances", type=int, default=None, help="the model's instances (default: the provider's)")
    parser.add_argument("--database-url", default=None, help="PostgreSQL (default: SQLite in a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--register", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.register is not None:
        register(args.register)
        return 0
    return run_in_workdir(
        prefix="modelyard-bench-priority-",
        run=lambda work: run(work, args),
        report=report,
        output=RESULTS,
        keep=args.keep,
        passed=lambda result: bool(result["met"]),
    )


if __name__ == "__main__":
    raise SystemExit(main())
