"""Benchmarks of versions on the hardware that serves them: the rows, their claims, and the measuring child.

Every version that becomes ``ready`` gets one pending :class:`~registry.models.VersionBenchmark`
row per execution provider the fleet serves with (CPU when no inference process is online), in the
transaction that records its validation; ``POST .../benchmarks`` asks again. Inference processes
take the rows of their own provider through ``registry.serving`` (``benchmark_claim`` is a
conditional update, so one row is taken once), measure the version in a child process under
``MODELYARD_BENCHMARK_TIMEOUT_SECONDS`` (and, on CPU, ``MODELYARD_BENCHMARK_MEMORY_MB``) at a low
priority, and write the numbers back (``benchmark_record``).

:func:`benchmark_child` runs in the child: it loads the model (timed), measures p50/p99 latency at
batch 1, throughput at batch 8 and 32 (or the model's ``max_batch_size``), and peak memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from registry.audit import Actor, audit_record
from registry.child_process import ChildLimits, ChildOutcome, run_in_child
from registry.errors import Conflict
from registry.models import JobStatus, ModelVersion, VersionBenchmark, VersionStatus

CPU = "CPUExecutionProvider"
TIMEOUT_SETTING = "MODELYARD_BENCHMARK_TIMEOUT_SECONDS"
MEMORY_SETTING = "MODELYARD_BENCHMARK_MEMORY_MB"
# Dynamic dimensions past the batch (a sequence length, say) are this long in the benchmark's inputs.
SEQUENCE = 32
SHARED_NOTE = "this process served inference traffic during the run; the numbers shared the device with it"


def benchmarks_request(version: ModelVersion, *, providers: set[str]) -> list[VersionBenchmark]:
    """Inside the caller's transaction: a pending row for each provider (an earlier run of it is reset).

    ``providers`` are those the fleet serves with (``registry.serving.fleet_providers``).
    """
    rows = []
    for provider in sorted(providers):
        row, _ = VersionBenchmark.objects.update_or_create(
            version=version,
            provider=provider,
            defaults={
                "status": JobStatus.PENDING,
                "numbers": {},
                "error": "",
                "note": "",
                "host_kind": "",
                "worker_id": "",
                "requested_at": timezone.now(),
                "started_at": None,
                "finished_at": None,
            },
        )
        rows.append(row)
    return rows


@transaction.atomic(durable=True)
def benchmark_rerun(*, version: ModelVersion, providers: set[str], actor: Actor) -> list[VersionBenchmark]:
    """``POST .../benchmarks``: run the benchmarks of a ready version again."""
    version = ModelVersion.objects.select_for_update().select_related("model").get(pk=version.pk)
    if version.status != VersionStatus.READY:
        raise Conflict(f"version {version.version} is {version.status}; only a ready version is benchmarked")
    running = version.benchmarks.filter(status=JobStatus.RUNNING).first()
    if running is not None:
        raise Conflict(f"the benchmark of version {version.version} on {running.provider} is running; wait for it")
    rows = benchmarks_request(version, providers=providers)
    audit_record(
        actor=actor,
        action="version.benchmark.request",
        target_type="version",
        target=f"{version.model.name}/{version.version}",
        model_name=version.model.name,
        after={"providers": [row.provider for row in rows]},
    )
    return rows


@dataclass(frozen=True)
class BenchmarkFile:
    """One file of the version to benchmark, as the artifact cache fetches and verifies it."""

    name: str
    storage_key: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True)
class BenchmarkJob:
    """A claimed benchmark: which version, its files as the artifact cache fetches them, its batching limit."""

    benchmark_id: int
    model: str
    version: int
    sha256: str
    files: tuple[BenchmarkFile, ...]
    model_file: str
    max_batch_size: int
    provider: str


def benchmark_claim(*, provider: str, host_kind: str, worker_id: str) -> BenchmarkJob | None:
    """Take the oldest pending benchmark of ``provider``, or None; a row is taken by one caller only."""
    for row in VersionBenchmark.objects.filter(status=JobStatus.PENDING, provider=provider).order_by("requested_at")[
        :5
    ]:
        taken = VersionBenchmark.objects.filter(pk=row.pk, status=JobStatus.PENDING).update(
            status=JobStatus.RUNNING, host_kind=host_kind, worker_id=worker_id, started_at=timezone.now()
        )
        if not taken:
            continue  # another process took it first
        version = ModelVersion.objects.select_related("model").get(pk=row.version_id)
        files = list(version.files.all())
        return BenchmarkJob(
            benchmark_id=row.pk,
            model=version.model.name,
            version=version.version,
            sha256=version.sha256,
            files=tuple(BenchmarkFile(f.name, f.storage_key, f.sha256, f.size_bytes) for f in files),
            model_file=next(f.name for f in files if f.role == "model"),
            max_batch_size=version.model.max_batch_size,
            provider=provider,
        )
    return None


def benchmark_record(*, benchmark_id: int, outcome: ChildOutcome, note: str = "") -> None:
    """Store what a claimed benchmark measured, or why it could not."""
    VersionBenchmark.objects.filter(pk=benchmark_id, status=JobStatus.RUNNING).update(
        status=JobStatus.SUCCEEDED if outcome.ok else JobStatus.FAILED,
        numbers=outcome.reply if outcome.ok else {},
        error=outcome.error,
        note=note,
        finished_at=timezone.now(),
    )


def benchmark_limits(provider: str) -> ChildLimits:
    return ChildLimits(
        timeout_seconds=settings.BENCHMARK_TIMEOUT_SECONDS,
        memory_mb=settings.BENCHMARK_MEMORY_MB if provider == CPU else 0,
        timeout_setting=TIMEOUT_SETTING,
        memory_setting=MEMORY_SETTING,
        what="benchmark",
        nice=settings.BENCHMARK_NICE,
        threads=0,
    )


def benchmark_measure(*, model_path: str, provider: str, max_batch_size: int) -> ChildOutcome:
    """Measure the model at ``model_path`` on ``provider`` in a bounded child at low priority."""
    request = {
        "model_path": model_path,
        "provider": provider,
        "max_batch_size": max_batch_size,
        "iterations": settings.BENCHMARK_ITERATIONS,
        "seconds": settings.BENCHMARK_SECONDS,
    }
    return run_in_child("registry.benchmarks:benchmark_child", request, benchmark_limits(provider))


# --- The child ------------------------------------------------------------------------------------


def _feeds(session: Any, batch: int) -> dict[str, Any]:
    import numpy as np

    from registry.datatypes import numpy_of_ort_type

    rng = np.random.default_rng(0)
    feeds = {}
    for arg in session.get_inputs():
        dtype = numpy_of_ort_type(arg.type)
        if dtype is None:
            raise ValueError(f"input '{arg.name}' has type {arg.type}, which the benchmark cannot synthesise")
        shape = [
            dim if isinstance(dim, int) and dim >= 0 else (batch if index == 0 else SEQUENCE)
            for index, dim in enumerate(arg.shape)
        ]
        if dtype is np.object_:
            feeds[arg.name] = np.full(shape, "a", dtype=object)
        elif np.issubdtype(dtype, np.floating):
            feeds[arg.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[arg.name] = np.ones(shape, dtype=dtype)
    return feeds


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
    sizes = sorted({8, min(32, int(request["max_batch_size"]))}) if batchable else []
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
