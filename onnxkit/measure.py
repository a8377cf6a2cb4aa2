"""The measuring half of a benchmark, run in the bounded child (``onnxkit/sandbox.py``).

Loads the model (timed), warms it up, times batch-1 latency (p50, p99) and batched throughput at
batch 8 and 32 (or the model's ``max_batch_size``), and reads peak memory: the child's RSS, and on
CUDA the device memory NVML reports for it. It imports no Django: the child has no settings.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

CPU = "CPUExecutionProvider"
# Dynamic dimensions past the batch (a sequence length, say) are this long in the benchmark's inputs.
SEQUENCE = 32


def _feeds(session: Any, batch: int) -> dict[str, Any]:
    from onnxkit.datatypes import random_feeds

    return random_feeds(session, batch=batch, other=SEQUENCE)


def _batchable(session: Any) -> bool:
    return all(len(arg.shape) > 0 and not isinstance(arg.shape[0], int) for arg in session.get_inputs())


def _device_memory() -> int | None:
    """Device memory this process holds on the GPU, through NVML; None where there is none to read."""
    import os

    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            used = 0
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if proc.pid == os.getpid() and proc.usedGpuMemory:
                        used += int(proc.usedGpuMemory)
            return used
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML, no GPU, no permission: no reading
        return None


def benchmark_child(request: dict[str, Any], on_step: Callable[[str], None]) -> dict[str, Any]:
    """In the child: load, warm up, time batch-1 latency and batched throughput, read peak memory."""
    import resource

    import numpy as np
    import onnxruntime as ort

    provider = request["provider"]
    if provider not in ort.get_available_providers():
        raise RuntimeError(f"this host's ONNX Runtime has no {provider}")
    on_step("loading the model")
    started = time.perf_counter()
    session = ort.InferenceSession(request["model_path"], providers=[provider])
    load_seconds = time.perf_counter() - started
    used = session.get_providers()[0]
    batchable = _batchable(session)
    on_step("measuring latency at batch 1")
    feeds = _feeds(session, 1)
    for _ in range(3):
        session.run(None, feeds)
    latencies = []
    deadline = time.perf_counter() + float(request["seconds"])
    for _ in range(int(request["iterations"])):
        begin = time.perf_counter()
        session.run(None, feeds)
        latencies.append(time.perf_counter() - begin)
        if time.perf_counter() > deadline and len(latencies) >= 10:
            break
    throughput: dict[str, float] = {}
    most = int(request["max_batch_size"])  # 0: served without merging requests
    sizes = sorted({8, min(32, most)}) if batchable and most > 0 else []
    for batch in sizes:
        on_step(f"measuring throughput at batch {batch}")
        feeds = _feeds(session, batch)
        session.run(None, feeds)
        runs, begin = 0, time.perf_counter()
        while runs < 2 or time.perf_counter() - begin < float(request["seconds"]):
            session.run(None, feeds)
            runs += 1
        throughput[str(batch)] = runs * batch / (time.perf_counter() - begin)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    numbers: dict[str, Any] = {
        "provider": used,
        "ort_version": ort.__version__,
        "load_seconds": load_seconds,
        "latency_runs": len(latencies),
        "p50_ms": float(np.percentile(latencies, 50) * 1000),
        "p99_ms": float(np.percentile(latencies, 99) * 1000),
        "throughput": throughput,
        "sequence": SEQUENCE,
        "peak_rss_bytes": peak_rss,
    }
    if used != CPU:
        numbers["device_memory_bytes"] = _device_memory()
    return numbers
