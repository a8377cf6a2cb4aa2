"""Where one client's request goes: Modelyard against the floor server, by thread and by step, with py-spy.

    .venv/bin/python bench/single_profile.py [--requests 800] [--rounds 3] [--seconds 20] [--rate 200]

The single-client goal of ``bench/serve.py`` (a p50 within 0.5 ms of raw batch-1 ``run()``) is judged
beside ``bench/floor_server.py``, the least an asyncio server does for the same request. This script
says where the time of each goes, with MiniLM (seq 32, JSON tensors) on one keep-alive connection:

1. **CPU per request, by thread** (``/proc/<pid>/task/*/stat``), ``--rounds`` times, Modelyard and the
   floor in turn, ``--requests`` each: the event loop's, the run thread's (which calls ``run()``) and
   the other threads' (ONNX Runtime's pool, which spins between runs, and the server's own), with each
   side's p50 latency;
2. **the event loop's busy time, by step**: py-spy (``--native``, so the C frames of uvloop, the kernel
   calls and ONNX Runtime show) samples each server's event loop for ``--seconds`` at ``--rate`` Hz while
   the client sends; the samples outside ``epoll_wait`` (the loop waiting) are sorted into the steps of
   :data:`STEPS`, first match wins. py-spy stops the process for each sample, so the shares are what
   counts, not the absolute time.

It writes bench/results/single_profile.json. Modelyard is started as ``bench/serve.py`` starts it
(``modelyard serve --role inference``, the model registered and promoted through the services, two
instances, ``max_batch_size`` 16).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import serve
from common import stop_process

RESULTS = serve.ROOT / "bench" / "results" / "single_profile.json"

# (step, frames that mark it): a busy sample of the event loop belongs to the first step one of whose
# markers appears in its stack (a marker is a substring of a frame, function and file).
STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "the answer written to the socket (the kernel delivers it over loopback and wakes the client)",
        ("UVStream_write", "UVStream__try_write"),
    ),
    ("the request read from the socket and parsed (uvloop, httptools)", ("uv__read", "feed_data", "data_received")),
    (
        "the hand-over to the run thread (a queue and a wake-up)",
        ("_RunThreads.submit", "ThreadPoolExecutor.submit", "run_in_executor", "sem_post", "futex"),
    ),
    (
        "the run's outputs back on the loop (the future set, the task woken)",
        ("_batch_done", "_set_state", "_chain_future", "call_soon_threadsafe"),
    ),
    (
        "the request decoded: JSON into arrays (and, in Modelyard, checked against the signature)",
        ("decode_request", "decode_json"),
    ),
    ("the answer encoded as JSON", ("encode_response", "encode_json")),
    (
        "the response handed to uvicorn (Starlette's response object, uvicorn's send)",
        ("Response.__call__", "Response.__init__", "RequestResponseCycle.send", "respond (floor_server"),
    ),
    (
        "admission, routing, body read, batcher, statistics and metrics (Modelyard only)",
        ("inference/", "prometheus_client/"),
    ),
)
OTHER = "the ASGI task, asyncio's and uvloop's scheduling, and the rest"


def by_thread(pid: int, client: serve.KeepAliveClient, requests: int) -> dict[str, Any]:
    """``requests`` requests one at a time: p50, and CPU per request of the loop, the run thread and the rest."""
    before = serve.thread_cpu(pid)
    latencies = []
    for _ in range(requests):
        started = time.perf_counter()
        status, _ = client.post()
        latencies.append(time.perf_counter() - started)
        if status != 200:
            raise RuntimeError(f"the server answered {status}")
    after = serve.thread_cpu(pid)
    spent = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    loop = spent.pop(pid, 0.0)  # the main thread runs the event loop
    # The run thread starts with the first request, after ONNX Runtime's pool threads: the newest busy thread.
    busy = sorted(tid for tid, seconds in spent.items() if seconds > 0)
    run = spent.pop(busy[-1], 0.0) if busy else 0.0
    per = 1000 / requests
    return {
        "p50_ms": serve.percentile_ms(latencies, 50),
        "loop_ms": loop * per,
        "run_thread_ms": run * per,
        "other_threads_ms": sum(spent.values()) * per,
    }


def profile(pid: int, port: int, body: bytes, seconds: float, rate: int, out: Path) -> dict[str, Any]:
    """py-spy on the event loop while one client sends; its busy samples by step.

    The client connects afresh: the one the rounds used has been idle past uvicorn's keep-alive meanwhile.
    """
    client = serve.KeepAliveClient(port, serve.INFER_PATH, body, serve.http_headers(None))
    for _ in range(50):
        client.post()
    spy = subprocess.Popen(
        [
            str(serve.BIN / "py-spy"),
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            "--duration",
            str(int(seconds)),
            "--native",
            "--threads",
            "--format",
            "raw",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    sent = 0
    while spy.poll() is None:
        client.post()
        sent += 1
    client.close()
    if spy.returncode != 0:
        raise RuntimeError(f"py-spy failed: {spy.stderr.read().decode() if spy.stderr else ''}")
    return steps(out.read_text()) | {"requests": sent}


def steps(raw: str) -> dict[str, Any]:
    """The event loop's samples in py-spy's raw output: how many wait in ``epoll_wait``, and the rest by step.

    Both servers run their event loop on the main thread (uvicorn's), which py-spy names ``MainThread``.
    """
    counts: Counter[str] = Counter()
    waiting = 0
    for line in raw.splitlines():
        stack, _, number = line.rpartition(" ")
        frames = stack.split(";")
        if not frames[0].endswith("MainThread"):
            continue
        count = int(number)
        if any("epoll_wait" in frame or "epoll_pwait" in frame for frame in frames):
            waiting += count
            continue
        counts[step_of(frames[1:])] += count
    busy = sum(counts.values())
    return {
        "samples_waiting": waiting,
        "samples_busy": busy,
        "busy_by_step": {name: round(count / busy, 3) for name, count in counts.most_common()} if busy else {},
    }


def step_of(frames: list[str]) -> str:
    for name, markers in STEPS:
        if any(marker in frame for frame in frames for marker in markers):
            return name
    return OTHER


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=800, help="requests per server per round (CPU by thread)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the CPU measurement")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of py-spy per server (0: none)")
    parser.add_argument("--rate", type=int, default=200, help="py-spy's samples per second")
    args = parser.parse_args()
    body = serve.json_body(serve.feeds(1))
    processes = []
    report: dict[str, Any] = {"model": "all-MiniLM-L6-v2, seq 32, batch-1, JSON tensors", "rounds": [], "profile": {}}
    with tempfile.TemporaryDirectory(prefix="modelyard-profile-") as tmp:
        work = Path(tmp)
        try:
            modelyard, port, _, _ = serve.start_modelyard(work, None, {"instances": 2, "max_batch_size": 16})
            processes.append(modelyard)
            floor, floor_port = serve.start_baseline(work, "floor_server.py")
            processes.append(floor)
            headers = serve.http_headers(None)
            servers = {
                "modelyard": (modelyard.pid, port, serve.KeepAliveClient(port, serve.INFER_PATH, body, headers)),
                "floor": (floor.pid, floor_port, serve.KeepAliveClient(floor_port, serve.INFER_PATH, body, headers)),
            }
            for _, _, client in servers.values():
                for _ in range(200):  # warm: the run thread started, the allocator's pools filled
                    client.post()
            for number in range(1, args.rounds + 1):
                measured = {name: by_thread(pid, client, args.requests) for name, (pid, _, client) in servers.items()}
                report["rounds"].append(measured)
                for name, figures in measured.items():
                    print(
                        f"round {number} {name:<9} p50 {figures['p50_ms']:.3f} ms   CPU per request: event loop "
                        f"{figures['loop_ms']:.3f} ms, run thread {figures['run_thread_ms']:.3f} ms, "
                        f"the other threads (ONNX Runtime's pool, spinning) {figures['other_threads_ms']:.3f} ms",
                        flush=True,
                    )
            if args.seconds > 0:
                for name, (pid, server_port, _) in servers.items():
                    found = profile(pid, server_port, body, args.seconds, args.rate, work / f"{name}.txt")
                    report["profile"][name] = found
                    busy = found["samples_busy"] / max(1, found["samples_busy"] + found["samples_waiting"])
                    print(f"\n{name}: the event loop busy in {busy:.0%} of its samples; of that busy time:")
                    for step, share in found["busy_by_step"].items():
                        print(f"  {share:6.1%}  {step}")
        finally:
            for process in processes:
                stop_process(process, signal.SIGINT)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {RESULTS.relative_to(serve.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
