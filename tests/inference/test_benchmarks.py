"""Benchmarks: every ready version gets a row, an inference process takes it once and measures it for real.

Real registry on the test database, real storage and artifact cache, real ONNX Runtime in the bounded
child. The numbers themselves are never asserted against a speed, only that a real run produced them.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest

from inference.benchmarks import BenchmarkRunner
from inference.cache import ArtifactCache
from registry import serving
from registry.models import AuditEvent, JobStatus, ModelVersion, VersionBenchmark, VersionSignature, VersionStatus
from tests.support.onnx_models import classifier_model
from tests.support.people import Person
from tests.support.polling import eventually
from tests.support.registry import artifact_path

pytestmark = pytest.mark.django_db(transaction=True)

CPU = "CPUExecutionProvider"


@pytest.fixture
def quick(settings: Any) -> Any:
    settings.BENCHMARK_SECONDS = 0.05
    settings.BENCHMARK_ITERATIONS = 20
    return settings


def ready_version(owner: Person, model: str, *, seed: int = 1) -> ModelVersion:
    """A validated classifier; another ``seed`` for a second version (the same bytes again are refused)."""
    response = owner.upload(model, [("model.onnx", classifier_model(seed=seed).SerializeToString())])
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get(model__name=model, version=response.json()["version"])
    assert version.status == VersionStatus.READY, version.errors
    return version


def runner(tmp_path: Path, served: Any = lambda: 0, worker: str = "bench-1") -> BenchmarkRunner:
    cache = ArtifactCache(tmp_path / f"cache-{worker}", 1024**3)
    return BenchmarkRunner(cache=cache, provider=CPU, host_kind="cpu", worker_id=worker, served=served)


def test_a_ready_version_gets_a_benchmark_with_numbers_from_a_real_run(
    owner: Person, registered: str, tmp_path: Path, quick: Any
) -> None:
    version = ready_version(owner, registered)
    [row] = VersionBenchmark.objects.filter(version=version)
    assert (row.provider, row.status) == (CPU, JobStatus.PENDING)

    assert runner(tmp_path).run_next() is True

    row.refresh_from_db()
    assert row.status == JobStatus.SUCCEEDED, row.error
    assert (row.host_kind, row.worker_id, row.note) == ("cpu", "bench-1", "")
    numbers = row.numbers
    assert numbers["provider"] == CPU and numbers["ort_version"] == ort.__version__
    assert numbers["load_seconds"] > 0 and 0 < numbers["p50_ms"] <= numbers["p99_ms"]
    assert set(numbers["throughput"]) == {"8", "32"} and all(v > 0 for v in numbers["throughput"].values())
    assert numbers["peak_rss_bytes"] > 50 * 2**20  # the child's interpreter and ONNX Runtime at least
    assert numbers["latency_runs"] >= 10
    body = owner.get(f"/api/v1/models/{registered}/versions/{version.version}/benchmarks").json()
    assert [(item["provider"], item["status"], item["numbers"]) for item in body] == [(CPU, "succeeded", numbers)]


def test_the_throughput_batch_follows_a_smaller_max_batch_size(
    owner: Person, registered: str, tmp_path: Path, quick: Any
) -> None:
    owner.patch(f"/api/v1/models/{registered}", {"max_batch_size": 16})
    version = ready_version(owner, registered)

    runner(tmp_path).run_next()

    assert set(VersionBenchmark.objects.get(version=version).numbers["throughput"]) == {"8", "16"}


@pytest.mark.parametrize("settings_", [{"max_batch_size": 0}, {"batching": "off"}])
def test_a_model_served_without_merging_is_measured_at_batch_1_only(
    owner: Person, registered: str, tmp_path: Path, quick: Any, settings_: dict[str, Any]
) -> None:
    """Throughput at batch 8 means nothing for a model that never merges; max_batch_size 0 once asked for batch 0."""
    assert owner.patch(f"/api/v1/models/{registered}", settings_).status_code == 200
    version = ready_version(owner, registered)

    runner(tmp_path).run_next()

    row = VersionBenchmark.objects.get(version=version)
    assert row.status == JobStatus.SUCCEEDED, row.error
    assert row.numbers["throughput"] == {}
    assert row.numbers["latency_runs"] >= 10


def test_a_benchmark_is_claimed_once(owner: Person, registered: str) -> None:
    ready_version(owner, registered)
    claims: list[Any] = []
    barrier = threading.Barrier(4)

    def claim(index: int) -> None:
        from django.db import connection

        try:
            barrier.wait()
            claims.append(serving.benchmark_claim(provider=CPU, host_kind="cpu", worker_id=f"w{index}"))
        finally:
            connection.close()

    threads = [threading.Thread(target=claim, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    taken = [job for job in claims if job is not None]
    assert len(claims) == 4 and len(taken) == 1
    row = VersionBenchmark.objects.get()
    assert row.status == JobStatus.RUNNING and row.worker_id in {"w0", "w1", "w2", "w3"}
    assert serving.benchmark_claim(provider=CPU, host_kind="cpu", worker_id="late") is None
    # a provider this version has no row for finds nothing
    assert serving.benchmark_claim(provider="CUDAExecutionProvider", host_kind="gpu", worker_id="g") is None


def test_a_benchmark_past_its_time_limit_fails_naming_the_setting(
    owner: Person, registered: str, tmp_path: Path, settings: Any
) -> None:
    version = ready_version(owner, registered)
    settings.BENCHMARK_TIMEOUT_SECONDS = 0.2

    runner(tmp_path).run_next()

    row = VersionBenchmark.objects.get(version=version)
    assert row.status == JobStatus.FAILED and row.numbers == {}
    assert row.error.startswith("the benchmark stopped after 0.2 s (MODELYARD_BENCHMARK_TIMEOUT_SECONDS) while ")


def test_a_benchmark_measures_only_bytes_that_verify(owner: Person, registered: str, tmp_path: Path) -> None:
    changed, unsigned = ready_version(owner, registered), ready_version(owner, registered, seed=2)
    stored = artifact_path(changed)
    stored.write_bytes(stored.read_bytes() + b"\0")  # changed in the bucket after validation
    VersionSignature.objects.filter(version=unsigned).delete()

    bench = runner(tmp_path)
    assert bench.run_next() is True and bench.run_next() is True

    rows = {row.version_id: row for row in VersionBenchmark.objects.all()}
    assert rows[changed.pk].status == JobStatus.FAILED and rows[changed.pk].numbers == {}
    assert rows[changed.pk].error.startswith(
        "the benchmark refused the version's files: sha256 mismatch for model.onnx: storage holds "
    )
    assert rows[unsigned.pk].error == (
        f"the benchmark refused the version's files: {registered} v2 is not signed by the registry "
        "(validated before signing existed: `modelyard sign-versions` signs it)"
    )


def test_a_process_that_served_traffic_meanwhile_notes_it(
    owner: Person, registered: str, tmp_path: Path, quick: Any
) -> None:
    version = ready_version(owner, registered)
    counter = iter(range(100))

    runner(tmp_path, served=lambda: next(counter)).run_next()

    row = VersionBenchmark.objects.get(version=version)
    assert row.status == JobStatus.SUCCEEDED and row.note == serving.SHARED_NOTE


def test_post_runs_the_benchmarks_again(
    owner: Person, outsider: Person, registered: str, tmp_path: Path, quick: Any
) -> None:
    version = ready_version(owner, registered)
    runner(tmp_path).run_next()
    path = f"/api/v1/models/{registered}/versions/{version.version}/benchmarks"

    assert outsider.post(path).status_code == 403
    response = owner.post(path)

    assert response.status_code == 202, response.content
    assert [(item["provider"], item["status"], item["numbers"]) for item in response.json()] == [(CPU, "pending", {})]
    assert AuditEvent.objects.get(action="version.benchmark.request").after == {"providers": [CPU]}
    serving.benchmark_claim(provider=CPU, host_kind="cpu", worker_id="w")
    running = owner.post(path)
    assert running.status_code == 409
    assert running.json()["error"] == (f"the benchmark of version {version.version} on {CPU} is running; wait for it")


def test_the_runtime_takes_benchmarks_on_its_reconcile_beat(
    owner: Person, registered: str, make_runtime: Any, quick: Any
) -> None:
    quick.BENCHMARKS_ENABLED = True
    version = ready_version(owner, registered)
    runtime = make_runtime()
    assert runtime.provider == CPU

    def measured() -> bool:
        runtime.reconcile_once()
        return VersionBenchmark.objects.get(version=version).status == JobStatus.SUCCEEDED

    eventually(measured, timeout=60, interval=0.2)
    row = VersionBenchmark.objects.get(version=version)
    assert row.worker_id == runtime.worker_id and row.host_kind == runtime.device
