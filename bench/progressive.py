"""Progressive delivery benchmark: what a shadow costs the primary, and where a canary's requests land.

    .venv/bin/python bench/progressive.py [--rounds 5] [--phase-seconds 8] [--clients 1,4] [--sample 0.1]
        [--canary-requests 10000] [--canary-percent 10]

What it does, all on 127.0.0.1 and cleaned up afterwards (the database and processes of
``bench/swap.py``, whose helpers it uses):

1. builds v2 of all-MiniLM-L6-v2 (``../shared/models/minilm-l6/model.onnx``) by adding 0.001 to its
   embedding, so the shadow's report must say: max absolute difference 0.001, cosine just under 1;
2. starts the registry and one ``modelyard serve --role inference`` process (CPU, ORT's default
   threads: every core), uploads both versions, points ``production`` and a served ``staging``
   alias at v1, and starts a standing shadow of v2 on ``staging``, which gets no requests: so v2 is
   loaded, idle, in every phase, as a shadow's candidate only (with sleeping threads, as any
   shadow's candidate that serves nothing itself), and what differs between the phases is
   production's shadow alone, not a load or an unload;
3. for each client count, and for each round, measures production's throughput (batch-1 requests,
   sequence length 32, keep-alive clients without pause) for ``--phase-seconds`` without a shadow,
   then with v2 shadowing at ``--sample``, then without again: the ratio of the shadowed phase to
   the mean of the two around it is the cost, every number from the same run. Each phase also
   records where the machine's CPU went (the inference process, the registry, the load clients,
   the rest), since on a shared machine the phases' rates move with everything else it runs;
4. reads the shadow report back (compared, dropped by reason, max abs diff, cosine p1);
5. starts a rollout of v2 at ``--canary-percent`` (one step held for the run, limits that cannot
   trip) and sends ``--canary-requests`` requests without a routing key, then as many with a key
   each, counting which version answered; the design asks for 8-12 % at 10 %.

Every v1 answer is checked against ONNX Runtime run directly on v1 (and every v2 answer against v1
plus the offset): a shadow must never change what the client gets. It prints a table and writes
bench/results/progressive.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common import CpuMeter, run_in_workdir
from swap import (
    MODEL,
    MODEL_PATH,
    Load,
    Server,
    base_env,
    bench_input,
    create_database,
    createtoken,
    drop_database,
    infer_body,
    reference_embedding,
    request,
    token_of,
    upload,
)

ROOT = Path(__file__).resolve().parent.parent
OFFSET = 0.001
SHADOW = f"/api/v1/models/{MODEL}/aliases/production/shadow"
STAGING = f"/api/v1/models/{MODEL}/aliases/staging"


def write_offset(source: Path, target: Path, offset: float = OFFSET) -> None:
    """v2: the same graph with ``+ offset`` on its first output (same signature, outputs moved by exactly that)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    output = model.graph.output[0].name
    inner = f"{output}_before_offset"
    for node in model.graph.node:
        node.output[:] = [inner if name == output else name for name in node.output]
    model.graph.initializer.append(numpy_helper.from_array(np.array(offset, dtype=np.float32), "bench_offset"))
    model.graph.node.append(helper.make_node("Add", [inner, "bench_offset"], [output], name="bench_offset_add"))
    model.producer_version = "bench-offset"
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(target))


def phase(
    load_ports: list[int],
    clients: int,
    body: bytes,
    expected: dict[str, list[float]],
    seconds: float,
    meter: CpuMeter,
) -> dict:
    load = Load(load_ports, clients, body, expected)
    load.start()
    time.sleep(1.0)  # connections opened, the first requests past
    start_index = len(load.snapshot())
    started = time.monotonic()
    meter.start()
    time.sleep(seconds)
    answers = load.snapshot()[start_index:]
    cpu = meter.stop()
    elapsed = time.monotonic() - started
    load.stop()
    ok = [a for a in answers if a.status == 200 and a.correct]
    latencies = sorted((a.received - a.sent) * 1000 for a in ok)
    return {
        "requests": len(answers),
        "failed": len([a for a in answers if a.status != 200]),
        "wrong": len([a for a in answers if a.status == 200 and not a.correct]),
        "rate": len(ok) / elapsed,
        "p50_ms": latencies[len(latencies) // 2] if latencies else None,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else None,
        "cpu_seconds": cpu,  # where the machine's CPU went during the phase (bench: the load clients)
    }


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
    write_offset(MODEL_PATH, v2_path)
    tokens = bench_input()
    expected = {"1": reference_embedding(MODEL_PATH, tokens)}
    storage = (work / "artifacts").as_uri()

    web_env = base_env(MODELYARD_DATA_DIR=str(work / "web"), MODELYARD_STORAGE_URL=storage)
    web = Server("web", "web", web_env, work, "--migrate")
    servers.append(web)
    web.wait("/api/v1/fleet", {401, 403})
    pending = [
        createtoken(web_env, "alice", "maintainer"),
        createtoken(web_env, "bob", "approver"),
        createtoken(web_env, "root", "admin"),
    ]
    alice, bob, admin = (token_of(p) for p in pending)
    assert request(web.port, "POST", "/api/v1/models", alice, {"name": MODEL})[0] == 201
    for number in (upload(web.port, alice, MODEL_PATH), upload(web.port, alice, v2_path)):
        deadline = time.monotonic() + 300
        while request(web.port, "GET", f"/api/v1/models/{MODEL}/versions/{number}", alice)[1]["status"] != "ready":
            if time.monotonic() > deadline:
                raise RuntimeError(f"version {number} did not validate")
            time.sleep(0.2)
    status, asked = request(web.port, "PUT", f"/api/v1/models/{MODEL}/aliases/production", alice, {"version": 1})
    assert status == 202, asked
    status, body = request(web.port, "POST", f"/api/v1/promotions/{asked['id']}/approve", bob, {})
    assert status == 200, body

    env = base_env(
        MODELYARD_DATA_DIR=str(work / "inf"),
        MODELYARD_STORAGE_URL=storage,
        MODELYARD_WORKER_ID="inf-1",
        MODELYARD_PROVIDERS="cpu",
        MODELYARD_INFERENCE_PUBLIC="true",
        # The registry's signing key (made by the web process on its first start): loads verify with it.
        MODELYARD_SIGNING_KEY=str(work / "web" / "signing-key.pem"),
        MODELYARD_RECONCILE_POLL_SECONDS="1",
        MODELYARD_FLEET_HEARTBEAT_SECONDS="1",
        MODELYARD_ORT_SPINNING=args.ort_spinning,
        **({"MODELYARD_SHADOW_MAX_COST": str(args.shadow_max_cost)} if args.shadow_max_cost is not None else {}),
    )
    inference = Server("inf-1", "inference", env, work)
    servers.append(inference)
    inference.wait("/v2/health/ready", {200})
    body_bytes = infer_body(tokens)
    meter = CpuMeter({"inference": inference.process.pid, "web": web.process.pid})  # each its own session
    status, staged = request(web.port, "PUT", STAGING, alice, {"version": 1})
    assert status in (200, 201), staged
    status, staged = request(web.port, "PATCH", STAGING, admin, {"served": True})  # an admin's flag
    assert status == 200, staged
    status, standing = request(web.port, "PUT", f"{STAGING}/shadow", alice, {"version": 2, "sample": args.sample})
    assert status == 201, standing

    def v2_row(fleet: Any) -> dict[str, Any] | None:
        rows = [r for w in fleet for r in w["loaded"] if r["version"] == 2 and r["state"] == "ready"]
        return rows[0] if rows else None

    def wait_fleet(what: str, done: Any) -> None:
        deadline = time.monotonic() + 120
        while True:  # the inference process reports what it serves with each heartbeat
            status, fleet = request(web.port, "GET", "/api/v1/fleet", alice)
            if status == 200 and done(v2_row(fleet)):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} never showed in the fleet report")
            time.sleep(0.2)

    wait_fleet("v2 loaded as staging's shadow", lambda row: row is not None and "staging" in row["shadows"])

    def shadow_on() -> None:
        status, started = request(web.port, "PUT", SHADOW, alice, {"version": 2, "sample": args.sample})
        assert status == 201, started
        wait_fleet("the shadow", lambda row: row is not None and "production" in row["shadows"])

    def shadow_off() -> dict[str, Any]:
        status, ended = request(web.port, "DELETE", SHADOW, alice)
        assert status == 200, ended
        wait_fleet("the shadow's end", lambda row: row is not None and "production" not in row["shadows"])
        time.sleep(1.5)  # the heartbeat after the end carries the last counts
        return request(web.port, "GET", SHADOW, alice)[1]

    series: dict[str, list[dict[str, Any]]] = {}
    reports: list[dict[str, Any]] = []
    for clients in args.clients:
        rounds = []
        for _ in range(args.rounds):
            before = phase([inference.port], clients, body_bytes, expected, args.phase_seconds, meter)
            if args.control:  # the same three phases with no shadow at all: the noise floor of the ratio
                shadowed = phase([inference.port], clients, body_bytes, expected, args.phase_seconds, meter)
                reports.append({"report": {"compared": 0, "dropped_by_reason": {}, "outputs": {}}})
            else:
                shadow_on()
                shadowed = phase([inference.port], clients, body_bytes, expected, args.phase_seconds, meter)
                reports.append(shadow_off())
            after = phase([inference.port], clients, body_bytes, expected, args.phase_seconds, meter)
            baseline = (before["rate"] + after["rate"]) / 2
            rounds.append(
                {
                    "before": before,
                    "shadowed": shadowed,
                    "after": after,
                    "ratio": shadowed["rate"] / baseline if baseline else None,
                    "report": reports[-1]["report"],
                }
            )
        series[str(clients)] = rounds

    canary = measure_canary(args, web.port, inference.port, alice, bob, body_bytes, expected)
    return {
        "sample": args.sample,
        "control": args.control,
        "ort_spinning": args.ort_spinning,
        "shadow_max_cost": args.shadow_max_cost,
        "offset": OFFSET,
        "phase_seconds": args.phase_seconds,
        "series": series,
        "canary": canary,
    }


def measure_canary(
    args: argparse.Namespace, web: int, port: int, alice: str, bob: str, body: bytes, expected: dict[str, list[float]]
) -> dict[str, Any]:
    """Where ``--canary-requests`` requests land while a rollout holds v2 at ``--canary-percent``."""
    rollout = {
        "version": 2,
        "steps": [args.canary_percent, 100],
        "step_seconds": 7 * 24 * 3600,
        "max_error_rate": 1,
        "max_p99_ratio": 1000,
    }
    status, asked = request(web, "PUT", f"/api/v1/models/{MODEL}/aliases/production/rollout", alice, rollout)
    assert status == 202, asked
    status, decided = request(web, "POST", f"/api/v1/promotions/{asked['promotion']}/approve", bob, {})
    assert status == 200, decided
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    candidate_expected = [v + OFFSET for v in expected["1"]]

    def send(key: str) -> str:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Modelyard-Routing-Key"] = key
        conn.request("POST", f"/v2/models/{MODEL}/infer", body, headers)
        response = conn.getresponse()
        answer = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"canary request failed: {response.status} {answer}")
        version = answer["model_version"]
        want = expected["1"] if version == "1" else candidate_expected
        if any(abs(a - b) > 1e-4 for a, b in zip(answer["outputs"][0]["data"], want, strict=True)):
            raise RuntimeError(f"version {version} answered something else than ONNX Runtime")
        return str(version)

    deadline = time.monotonic() + 120
    while send(f"probe-{time.monotonic()}") != "2" and time.monotonic() < deadline:
        pass  # the split is in place once the candidate answers
    started = time.monotonic()
    random_side = [send("") for _ in range(args.canary_requests)]
    random_seconds = time.monotonic() - started
    keyed = [send(f"user-{index}") for index in range(args.canary_requests)]
    again = [send(f"user-{index}") for index in range(0, args.canary_requests, 10)]
    conn.close()
    status, aborted = request(web, "POST", f"/api/v1/models/{MODEL}/aliases/production/rollout/abort", alice, {})
    assert status == 200, aborted
    return {
        "percent": args.canary_percent,
        "requests": args.canary_requests,
        "random_share": random_side.count("2") / len(random_side),
        "random_rate": len(random_side) / random_seconds,
        "keyed_share": keyed.count("2") / len(keyed),
        "keys_stable": all(keyed[index * 10] == version for index, version in enumerate(again)),
    }


def cpu_per_request(phase: dict[str, Any]) -> float:
    """Milliseconds of the inference process's CPU per request answered in the phase."""
    return 1000 * phase["cpu_seconds"]["inference"] / max(1, phase["requests"])


def report(result: dict[str, Any]) -> None:
    print(f"shadow at sample {result['sample']} (v2 = v1 + {result['offset']}), {result['phase_seconds']} s phases")
    print(
        "| clients | round | without req/s | shadowed req/s | ratio | inference CPU ms/req | mirrored | dropped "
        "| max abs diff | cosine p1 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for clients, rounds in result["series"].items():
        for index, r in enumerate(rounds, 1):
            without = (r["before"]["rate"] + r["after"]["rate"]) / 2
            out: dict[str, Any] = next(iter(r["report"]["outputs"].values()), {})
            dropped = ", ".join(f"{k} {v}" for k, v in r["report"]["dropped_by_reason"].items()) or "0"
            cpu = " / ".join(f"{cpu_per_request(r[p]):.2f}" for p in ("before", "shadowed", "after"))
            print(
                f"| {clients} | {index} | {without:.1f} | {r['shadowed']['rate']:.1f} | {r['ratio']:.3f} | {cpu} "
                f"| {r['report']['compared']} | {dropped} | {out.get('max_abs_diff')} | {out.get('cosine_p1')} |"
            )
        ratios = [r["ratio"] for r in rounds]
        print(f"clients {clients}: median ratio {statistics.median(ratios):.3f}")
    failed = sum(
        p["failed"] + p["wrong"]
        for rounds in result["series"].values()
        for r in rounds
        for p in (r["before"], r["shadowed"], r["after"])
    )
    print(f"failed or wrong answers: {failed}")
    canary = result["canary"]
    print(
        f"canary at {canary['percent']}%: {canary['random_share']:.2%} of {canary['requests']} requests without a key "
        f"({canary['random_rate']:.1f} req/s, one client), {canary['keyed_share']:.2%} of as many keys; "
        f"keys stable on a second pass: {canary['keys_stable']}"
    )


def passed(result: dict[str, Any]) -> bool:
    phases = [
        p for rounds in result["series"].values() for r in rounds for p in (r["before"], r["shadowed"], r["after"])
    ]
    canary = result["canary"]
    share = canary["percent"] / 100
    return (
        all(p["failed"] == 0 and p["wrong"] == 0 for p in phases)
        and abs(canary["random_share"] - share) <= 0.2 * share
        and canary["keys_stable"]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--phase-seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=lambda text: [int(c) for c in text.split(",")], default=[1, 4])
    parser.add_argument("--sample", type=float, default=0.1)
    parser.add_argument(
        "--ort-spinning",
        choices=["true", "false"],
        default="true",
        help="the inference process's MODELYARD_ORT_SPINNING (its default: true)",
    )
    parser.add_argument(
        "--shadow-max-cost",
        type=float,
        default=None,
        help="the inference process's MODELYARD_SHADOW_MAX_COST (default: its own default)",
    )
    parser.add_argument("--control", action="store_true", help="no shadow in the middle phase (an A/A run)")
    parser.add_argument("--canary-requests", type=int, default=10_000)
    parser.add_argument("--canary-percent", type=int, default=10)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "progressive.json")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, models)")
    args = parser.parse_args(argv)
    if not MODEL_PATH.exists():
        print(f"{MODEL_PATH} is missing", file=sys.stderr)
        return 2
    return run_in_workdir(
        prefix="modelyard-bench-progressive-",
        run=lambda work: run(args, work),
        report=report,
        output=args.output,
        keep=args.keep,
        passed=passed,
    )


if __name__ == "__main__":
    sys.exit(main())
