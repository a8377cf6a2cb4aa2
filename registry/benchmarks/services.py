"""Benchmarks of versions on the hardware that serves them: the rows, their claims, and the measuring child.

Every version that becomes ``ready`` gets one pending :class:`~registry.models.VersionBenchmark`
row per execution provider the fleet serves with (CPU when no inference process is online), in the
transaction that records its validation; ``POST .../benchmarks`` asks again. Inference processes
take the rows of their own provider through ``registry.serving`` (``benchmark_claim`` is a
conditional update, so one row is taken once), measure the version in a child process under
``MODELYARD_BENCHMARK_TIMEOUT_SECONDS`` (and, on CPU, ``MODELYARD_BENCHMARK_MEMORY_MB``) at a low
priority, and write the numbers back (``benchmark_record``).

The measuring itself is ``onnxkit/measure.py``: load time, p50/p99 latency at batch 1,
throughput at batch 8 and 32 (or the model's ``max_batch_size``), and peak memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from onnxkit.sandbox import CUDA_ENV, ChildLimits, ChildOutcome, run_in_child
from registry.audit.chain import Actor, audit_version
from registry.errors import Conflict
from registry.models import JobStatus, ModelVersion, VersionBenchmark, VersionStatus
from registry.provenance.services import ServedSignature, served_signatures

CPU = "CPUExecutionProvider"
TIMEOUT_SETTING = "MODELYARD_BENCHMARK_TIMEOUT_SECONDS"
MEMORY_SETTING = "MODELYARD_BENCHMARK_MEMORY_MB"
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
    audit_version(
        version,
        actor=actor,
        action="version.benchmark.request",
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
    # The bundles the inference process checks the files against before it measures them, as before a load.
    signatures: tuple[ServedSignature, ...] = ()


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
            # 0: served without merging requests, so throughput at a batch size means nothing for it
            max_batch_size=version.model.max_batch_size if version.batching_decision().merges else 0,
            provider=provider,
            signatures=served_signatures(version),
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
        inherit_env=CUDA_ENV,
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
    return run_in_child("onnxkit.measure:benchmark_child", request, benchmark_limits(provider))


def benchmarks_fail_lost(*, older_than: timedelta) -> list[int]:
    """Fail the benchmarks still ``running`` long past their limit: the process running them was lost."""
    before = timezone.now() - older_than
    lost = list(
        VersionBenchmark.objects.filter(status=JobStatus.RUNNING, started_at__lt=before).values_list("pk", flat=True)
    )
    VersionBenchmark.objects.filter(pk__in=lost, status=JobStatus.RUNNING).update(
        status=JobStatus.FAILED,
        error="the benchmark was lost: the inference process running it stopped; POST .../benchmarks runs it again",
        finished_at=timezone.now(),
    )
    return lost
