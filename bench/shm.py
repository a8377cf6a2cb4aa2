"""A 4 MiB image tensor through system shared memory against binary HTTP, one client, with raw ONNX Runtime beside.

    .venv/bin/python bench/shm.py [--blocks 8] [--per-block 40] [--keep]
    .venv/bin/python bench/shm.py --blocks 2 --per-block 10     # a smoke run

One ``modelyard serve --role inference`` process on SQLite, with ``MODELYARD_SHARED_MEMORY=true``, serves a
model built here: ``image`` FP32 [1, 1024, 1024] (4 MiB) in, its mean out (ReduceMean, cheap), so the
time measured is the tensor's way in. One client, tritonclient.http on one keep-alive connection:

- raw ONNX Runtime ``run()`` in this process, on the same model;
- binary HTTP: the image as a binary tensor in the request body (``binary_data=True``);
- shared memory: the image written into a region registered once (``tritonclient.utils.shared_memory``),
  then a request that names it; the client's write is part of each call, as a client's would be.

Each answer is checked against raw ONNX Runtime first. Series are measured in turn in blocks of
``--per-block`` calls (the first of each left out), the order reversed every other block, so a change in
this shared machine's load falls on all of them. It prints requests/s and p50 latency of each, and writes
bench/results/shm.json. There is no goal to meet; it records what shared memory saves.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from common import run_in_workdir, stop_process
from serve import BIN, ROOT, free_port, modelyard_env, percentile_ms, register_served, wait_ready

RESULTS = ROOT / "bench" / "results" / "shm.json"
MODEL_NAME = "image-mean"
SHAPE = [1, 1024, 1024]  # FP32: 4 MiB
KEY = f"/modelyard_bench_{os.getpid()}"


def build_model(path: Path) -> None:
    """``mean`` [1] = ReduceMean of ``image`` FP32 [1, 1024, 1024] over its last two axes."""
    import onnx
    from onnx import TensorProto, helper

    image = helper.make_tensor_value_info("image", TensorProto.FLOAT, SHAPE)
    mean = helper.make_tensor_value_info("mean", TensorProto.FLOAT, [1])
    node = helper.make_node("ReduceMean", ["image"], ["mean"], axes=[1, 2], keepdims=0)
    graph = helper.make_graph([node], MODEL_NAME, [image], [mean])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)


def register(options: str) -> None:
    """Runs in a child process: the model as version 1, validated, on production (four eyes)."""
    register_served(
        name=MODEL_NAME,
        description="a 4 MiB image's mean, for bench/shm.py",
        files=[("model.onnx", Path(json.loads(options)["model"]))],
        model_settings={},
    )


def start_server(work: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    model = work / "model.onnx"
    build_model(model)
    env = modelyard_env(work / "data", None)
    env["MODELYARD_SHARED_MEMORY"] = "true"
    subprocess.run(
        [sys.executable, __file__, "--register", json.dumps({"model": str(model)})], env=env, check=True, cwd=ROOT
    )
    port = free_port()
    log = work / "modelyard.log"
    argv = [str(BIN / "modelyard"), "serve", "--role", "inference", "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(
        [*argv, "--grpc-port", "0"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=work
    )
    wait_ready(port, f"/v2/models/{MODEL_NAME}/ready", process, log)
    return process, port, log


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import onnxruntime as ort
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    process, port, _log = start_server(work)
    handle = None
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        image = np.random.default_rng(0).random(SHAPE, dtype=np.float32)
        session = ort.InferenceSession(str(work / "model.onnx"), providers=["CPUExecutionProvider"])
        expected = session.run(None, {"image": image})[0]

        binary_input = httpclient.InferInput("image", SHAPE, "FP32")
        binary_input.set_data_from_numpy(image, binary_data=True)
        mean_output = httpclient.InferRequestedOutput("mean", binary_data=True)

        handle = shm.create_shared_memory_region("image", KEY, image.nbytes)
        client.register_system_shared_memory("image", KEY, image.nbytes)
        shared_input = httpclient.InferInput("image", SHAPE, "FP32")
        shared_input.set_shared_memory("image", image.nbytes)

        def binary_http() -> np.ndarray:
            return client.infer(MODEL_NAME, [binary_input], outputs=[mean_output]).as_numpy("mean")

        def shared_memory() -> np.ndarray:
            shm.set_shared_memory_region(handle, [image])
            return client.infer(MODEL_NAME, [shared_input], outputs=[mean_output]).as_numpy("mean")

        for label, call in (("binary HTTP", binary_http), ("shared memory", shared_memory)):
            got = call()
            if not np.allclose(got, expected, rtol=1e-4):  # a float32 sum, added in another order
                raise RuntimeError(f"{label} answered {got}, raw ONNX Runtime {expected}")
        series: dict[str, Callable[[], Any]] = {
            "raw run()": lambda: session.run(None, {"image": image}),
            "binary HTTP": binary_http,
            "shared memory": shared_memory,
        }
        times: dict[str, list[float]] = {label: [] for label in series}
        for block in range(args.blocks):
            order = list(series.items())
            for label, call in order if block % 2 == 0 else reversed(order):
                for index in range(args.per_block):
                    start = time.perf_counter()
                    call()
                    if index:
                        times[label].append(time.perf_counter() - start)
        client.unregister_system_shared_memory()
    finally:
        client.close()
        if handle is not None:
            shm.destroy_shared_memory_region(handle)
        stop_process(process)
    rows = {
        label: {
            "requests_per_s": len(samples) / sum(samples),
            "p50_ms": percentile_ms(samples, 50),
            "p99_ms": percentile_ms(samples, 99),
            "samples": len(samples),
        }
        for label, samples in times.items()
    }
    return {
        "model": f"ReduceMean of FP32 {SHAPE} ({int(np.prod(SHAPE)) * 4} bytes)",
        "blocks": args.blocks,
        "per_block": args.per_block,
        "series": rows,
        "shared_memory_speedup_p50": rows["binary HTTP"]["p50_ms"] / rows["shared memory"]["p50_ms"],
    }


def report(result: dict[str, Any]) -> None:
    print(f"{result['model']}, one client")
    print(f"{'series':<16}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}")
    for label, row in result["series"].items():
        print(f"{label:<16}{row['requests_per_s']:>9.1f}{row['p50_ms']:>9.3f}{row['p99_ms']:>9.3f}")
    print(f"shared memory: {result['shared_memory_speedup_p50']:.2f}x binary HTTP's p50")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=8, help="blocks of calls per series, in turn")
    parser.add_argument("--per-block", type=int, default=40, help="calls per block (the first one is left out)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (the server's log)")
    parser.add_argument("--register", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.register is not None:
        register(args.register)
        return 0
    return run_in_workdir(
        prefix="modelyard-bench-shm-",
        run=lambda work: measure(args, work),
        report=report,
        output=RESULTS,
        keep=args.keep,
        passed=lambda result: True,
    )


if __name__ == "__main__":
    sys.exit(main())
