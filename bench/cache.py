"""Response cache benchmark: MiniLM-L6 with half the requests repeated, the cache off against on, in one run.

    .venv/bin/python bench/cache.py [--duration 10] [--clients 16] [--rounds 3] [--hot 64] [--database-url ...]
    .venv/bin/python bench/cache.py --duration 2 --rounds 1 --clients 4 --warmup 1     # a smoke run

One ``modelyard serve --role inference`` process serves the same MiniLM file twice, as two models
promoted to ``production`` through the services: ``minilm`` with no cache, ``minilm-cached`` whose
production alias has a response cache (``--max-bytes``, ``--ttl``; in process memory, or in Redis
with ``--redis-url``). Load comes from Python processes (threads, each holding one keep-alive
connection, binary tensors), and every client sends the same stream to either model: every other
request is one of ``--hot`` fixed inputs (repeated), the rest are fresh random token ids never sent
before. So half the requests repeat, and the cache can answer at most about half of them.

Before load, the cached model's first answer and its cached repeat are checked against ONNX Runtime
run directly (and the repeat must carry ``"cached": true``). Each round measures off then on, the
order reversed every other round (the machine is shared); the goal, judged on the median of the
rounds' ratios: with the cache on, at least 1.8x the requests per second of the cache off, zero
errors. It prints a table and writes bench/results/cache.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import ClosedLoad, run_in_workdir, stop_process
from serve import (
    BIN,
    MODEL_PATH,
    ROOT,
    SEQ,
    decode_embedding,
    free_port,
    modelyard_env,
    post,
    raw_session,
    register_served,
    wait_ready,
)

RESULTS = ROOT / "bench" / "results" / "cache.json"
OFF, ON = "minilm", "minilm-cached"
GOAL = 1.8


def tokens(rng: np.random.Generator) -> dict[str, np.ndarray]:
    ids = rng.integers(1000, 30000, size=(1, SEQ), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return {"input_ids": ids, "attention_mask": np.ones((1, SEQ), dtype=np.int64)}


def body_of(one: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """Binary tensors in and out (Triton's extension)."""
    inputs = [
        {"name": n, "datatype": "INT64", "shape": list(a.shape), "parameters": {"binary_data_size": a.nbytes}}
        for n, a in one.items()
    ]
    header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    body = header + b"".join(a.astype("<i8").tobytes() for a in one.values())
    return body, {"Inference-Header-Content-Length": str(len(header))}


def hot_bodies(count: int) -> list[tuple[bytes, dict[str, str]]]:
    rng = np.random.default_rng(12345)
    return [body_of(tokens(rng)) for _ in range(count)]


# --- setup ------------------------------------------------------------------------------------------


def register(settings_json: str) -> None:
    """Runs in a child process: both models on production, the second with its response cache."""
    options = json.loads(settings_json)
    for name in (OFF, ON):
        register_served(
            name=name, description="MiniLM-L6 for bench/cache.py", files=[("model.onnx", MODEL_PATH)], model_settings={}
        )
    from django.contrib.auth import get_user_model

    from registry import promotions
    from registry.audit.chain import Actor
    from registry.models import PRODUCTION, RegisteredModel

    admin = Actor(user=get_user_model().objects.get(username="bench-owner"))
    promotions.alias_set_cache(
        model=RegisteredModel.objects.get(name=ON),
        alias_name=PRODUCTION,
        actor=admin,
        max_bytes=options["max_bytes"],
        ttl_seconds=options["ttl"],
    )


def start_server(work: Path, args: argparse.Namespace) -> tuple[Any, int, Path]:
    env = modelyard_env(work / "data", args.database_url)
    if args.redis_url:
        env["MODELYARD_RESPONSE_CACHE_REDIS_URL"] = args.redis_url
    options = json.dumps({"max_bytes": args.max_bytes, "ttl": args.ttl})
    subprocess.run([sys.executable, __file__, "--register", options], env=env, check=True, cwd=ROOT)
    port = free_port()
    log = work / "modelyard.log"
    argv = [str(BIN / "modelyard"), "serve", "--role", "inference", "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(argv, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=work)
    for name in (OFF, ON):
        wait_ready(port, f"/v2/models/{name}/ready", process, log)
    return process, port, log


def check_answers(port: int) -> dict[str, Any]:
    """The cached model answers as ONNX Runtime does, the first time and from its cache."""
    one = tokens(np.random.default_rng(7))
    expected = raw_session().run(None, dict(one))[0]
    body, headers = body_of(one)
    flags = []
    worst = 0.0
    deadline = time.monotonic() + 30
    while True:  # the cache setting arrives with the process's first reconcile pass
        status, got_headers, raw = post(port, f"/v2/models/{ON}/infer", body, headers)
        header = json.loads(raw[: int(got_headers["inference-header-content-length"])])
        if header.get("parameters", {}).get("cached") is not None or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for _ in range(2):
        status, got_headers, raw = post(port, f"/v2/models/{ON}/infer", body, headers)
        header = json.loads(raw[: int(got_headers["inference-header-content-length"])])
        flags.append(header.get("parameters", {}).get("cached"))
        got = decode_embedding(status, got_headers, raw)
        worst = max(worst, float(np.abs(got - expected.reshape(got.shape)).max()))
    assert flags == [True, True], f"the repeats were not answered from the cache: {flags}"
    assert worst < 1e-4, f"cached answer differs from ONNX Runtime by {worst}"
    return {"cached_flags": flags, "max_abs_diff_vs_ort": worst}


# --- load ---------------------------------------------------------------------------------------------


class HalfRepeated:
    """The stream of a connection: every other request repeats one of ``hot`` inputs; the others are new."""

    def __init__(self, hot: int) -> None:
        self.hot = hot
        self._bodies: list[tuple[bytes, dict[str, str]]] = []

    def __call__(self, rng: np.random.Generator, sent: int) -> tuple[bytes, dict[str, str]]:
        if not self._bodies:  # in the client process
            self._bodies = hot_bodies(self.hot)
        if sent % 2 == 0:
            return self._bodies[int(rng.integers(len(self._bodies)))]
        return body_of(tokens(rng))


def answered_from_cache(response: Any, raw: bytes) -> bool:
    """Whether the answer's JSON header says ``"cached": true`` (the binary outputs after it are not searched)."""
    length = int(response.getheader("inference-header-content-length") or len(raw))
    return b'"cached":true' in raw[:length]


def load(port: int, model: str, hot: int, clients: int, duration: float, seed: int) -> dict[str, Any]:
    """``clients`` connections over up to 4 processes, each sending the half-repeated stream to ``model``."""
    path = f"/v2/models/{model}/infer"
    result = ClosedLoad(
        port, path, clients=clients, duration=duration, seed=seed, make=HalfRepeated(hot), flag=answered_from_cache
    ).join()
    result["hit_share"] = result.pop("flagged_share")
    return result


def run(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    process, port, _log = start_server(work, args)
    try:
        check = check_answers(port)
        for model in (OFF, ON):
            for body, headers in hot_bodies(args.hot):  # every hot input once: the repeats are repeats from the start
                post(port, f"/v2/models/{model}/infer", body, headers)
            load(port, model, args.hot, args.clients, args.warmup, seed=999)
        rounds: list[dict[str, Any]] = []
        for number in range(1, args.rounds + 1):
            order = (OFF, ON) if number % 2 else (ON, OFF)
            # The same seeds for both: the same stream of fresh inputs, so neither side gets an easier one.
            measured = {model: load(port, model, args.hot, args.clients, args.duration, seed=number) for model in order}
            off, on = measured[OFF], measured[ON]
            ratio = on["req_per_s"] / off["req_per_s"] if off["req_per_s"] else 0.0
            rounds.append({"round": number, "order": list(order), "off": off, "on": on, "ratio": round(ratio, 2)})
            print(
                f"round {number}: off {off['req_per_s']} req/s, on {on['req_per_s']} req/s "
                f"(hits {on['hit_share']:.0%}), {ratio:.2f}x",
                flush=True,
            )
    finally:
        stop_process(process)
    median = statistics.median(r["ratio"] for r in rounds)
    errors = sum(r["off"]["errors"] + r["on"]["errors"] for r in rounds)
    return {
        "benchmark": "cache",
        "model": "all-MiniLM-L6-v2, sequence length 32, batch-1 requests, binary tensors",
        "command": " ".join([".venv/bin/python", "bench/cache.py", *sys.argv[1:]]),
        "clients": args.clients,
        "duration_s": args.duration,
        "hot_inputs": args.hot,
        "store": "redis" if args.redis_url else "memory",
        "max_bytes": args.max_bytes,
        "check": check,
        "rounds": rounds,
        "median_ratio": median,
        "errors": errors,
        "goal": f"cache on >= {GOAL}x cache off with half the requests repeated, zero errors",
        "met": median >= GOAL and errors == 0,
    }


def report(result: dict[str, Any]) -> None:
    print("| round | cache off req/s | cache on req/s | answered from the cache | ratio | errors |")
    print("|---|---|---|---|---|---|")
    for r in result["rounds"]:
        errors = r["off"]["errors"] + r["on"]["errors"]
        print(
            f"| {r['round']} | {r['off']['req_per_s']} | {r['on']['req_per_s']} | {r['on']['hit_share']:.0%} | "
            f"{r['ratio']:.2f}x | {errors} |"
        )
    verdict = "met" if result["met"] else "missed"
    print(f"median ratio {result['median_ratio']:.2f}x (goal {GOAL}x, zero errors): {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description="Response cache benchmark: MiniLM, half the requests repeated")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of warm-up load per model")
    parser.add_argument("--clients", type=int, default=16, help="concurrent connections")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hot", type=int, default=64, help="distinct inputs the repeated half is drawn from")
    parser.add_argument("--max-bytes", type=int, default=64 * 1024 * 1024, help="the alias's cache bound")
    parser.add_argument("--ttl", type=int, default=600, help="the alias's cache TTL in seconds")
    parser.add_argument("--redis-url", default=None, help="keep the cache in this Redis instead of process memory")
    parser.add_argument("--database-url", default=None, help="PostgreSQL (default: SQLite in a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--register", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.register is not None:
        register(args.register)
        return 0
    return run_in_workdir(
        prefix="modelyard-bench-cache-",
        run=lambda work: run(work, args),
        report=report,
        output=RESULTS,
        keep=args.keep,
        passed=lambda result: bool(result["met"]),
    )


if __name__ == "__main__":
    raise SystemExit(main())
