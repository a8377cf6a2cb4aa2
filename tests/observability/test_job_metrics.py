"""The registry's ``/metrics`` counts asynchronous inference jobs from their rows: queued, running, rows left.

In-process, on the test database, scraped through the web role's ``/metrics`` ASGI app; the job rows are
put in the states the job services leave them in.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from modelyard import metrics as exposition
from registry import metrics
from registry.models import InferenceJob, InferenceJobFormat, InferenceJobKind, InferenceJobState, ModelVersion
from tests.support.prometheus import samples, value
from tests.support.registry import create_model, upload_versions

pytestmark = pytest.mark.django_db(transaction=True)  # the scrape reads the database from a thread of its own

JOBS = "modelyard_inference_jobs"
ROWS_QUEUED = "modelyard_inference_job_rows_queued"


@pytest.fixture(autouse=True)
def database_collector(settings: Any) -> Iterator[None]:
    """What modelyard.asgi does for the web role: read the registry's state at every scrape."""
    settings.METRICS_PUBLIC = True
    exposition.add_collector(metrics.DATABASE)
    yield
    exposition.remove_collector(metrics.DATABASE)


def scrape_metrics() -> str:
    """``GET /metrics`` of the web role, as Prometheus sends it."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(metrics.app({"type": "http", "method": "GET", "path": "/metrics", "headers": []}, receive, send))
    assert sent[0]["status"] == 200
    return b"".join(m.get("body", b"") for m in sent[1:]).decode()


def job(version: ModelVersion, state: str, rows: int | None, rows_done: int = 0, **fields: Any) -> InferenceJob:
    return InferenceJob.objects.create(
        public_id=uuid.uuid4().hex,
        model=version.model,
        version=version,
        format=InferenceJobFormat.NPZ,
        state=state,
        rows=rows,
        rows_done=rows_done,
        **fields,
    )


def test_no_jobs_reads_zero_for_each_state():
    got = scrape_metrics()
    assert {labels["state"]: v for name, labels, v in samples(got) if name == JOBS} == {"queued": 0, "running": 0}
    assert value(got, ROWS_QUEUED) == 0
    assert "# TYPE modelyard_inference_jobs gauge" in got
    assert "# TYPE modelyard_inference_job_rows_queued gauge" in got


def test_jobs_queued_and_running_and_their_rows_left_come_from_the_job_rows(owner):
    create_model(owner)
    [version] = upload_versions(owner, [1.0])
    job(version, InferenceJobState.QUEUED, 100)
    job(version, InferenceJobState.QUEUED, None)  # its input not split yet: its rows are not known
    job(version, InferenceJobState.RUNNING, 50, 20)
    job(version, InferenceJobState.RUNNING, 7, 0, kind=InferenceJobKind.REQUEST)  # an infer-async request
    # Ended jobs count for nothing, however many rows they left.
    job(version, InferenceJobState.SUCCEEDED, 10, 10)
    job(version, InferenceJobState.FAILED, 40, 5)
    job(version, InferenceJobState.CANCELLED, 30, 0)

    got = scrape_metrics()
    assert value(got, JOBS, state="queued") == 2
    assert value(got, JOBS, state="running") == 2
    assert value(got, ROWS_QUEUED) == 100 + 30 + 7
    assert {labels["state"] for name, labels, _ in samples(got) if name == JOBS} == {"queued", "running"}

    # As the fleet computes them, the rows left fall; a finished job leaves the counts.
    InferenceJob.objects.filter(state=InferenceJobState.RUNNING, rows=50).update(rows_done=50)
    InferenceJob.objects.filter(state=InferenceJobState.QUEUED, rows=100).update(
        state=InferenceJobState.RUNNING, rows_done=60
    )
    InferenceJob.objects.filter(rows=7).update(state=InferenceJobState.SUCCEEDED, rows_done=7)
    got = scrape_metrics()
    assert (value(got, JOBS, state="queued"), value(got, JOBS, state="running")) == (1, 2)
    assert value(got, ROWS_QUEUED) == 40
    assert value(got, "modelyard_registry_metrics_up") == 1
