"""A job's chunks as the inference processes take them: a claim under a lease, its renewal, done or failed.

``registry.serving`` re-exports all of it, the one way ``inference/jobs.py`` reaches a job. Every change
of a chunk is a conditional update on what the caller saw (its state, its worker, its attempts), so two
processes never both take a chunk, and a process whose lease lapsed cannot finish a chunk another has
taken since. A chunk whose process died keeps its ``running`` state with a lease that lapses; the next
claim takes it again as attempt 2, and past ``MODELYARD_INFERENCE_JOB_MAX_ATTEMPTS`` the chunk and its
job fail instead.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from registry import queueing
from registry.jobs import services
from registry.models import (
    InferenceJob,
    InferenceJobChunk,
    InferenceJobKind,
    InferenceJobState,
    JobStatus,
    ModelVersion,
    VersionStatus,
)

ACTIVE = (InferenceJobState.QUEUED, InferenceJobState.RUNNING)
# How many candidates one claim looks at before giving up for now (others may be taking them meanwhile).
CLAIM_CANDIDATES = 8


@dataclass(frozen=True)
class JobChunk:
    """One claimed chunk: what the inference process runs, and where it writes the output."""

    chunk_id: int
    job_id: str  # the job's public_id
    kind: str  # "batch" | "request"
    format: str  # "npz" | "jsonl" | "text" | "v2"
    version_id: int
    model: str
    version: int
    input_key: str
    output_key: str  # where the runner writes the chunk's output (delete it first: a lost attempt may have)
    start: int
    stop: int  # rows [start, stop)
    outputs: tuple[str, ...] = ()  # requested outputs; () = all
    parameters: Mapping[str, Any] = field(default_factory=dict)  # v2 parameters for every row
    attempt: int = 1  # 1 on the first claim; >1 is a retry
    lease_seconds: float = 60.0

    @property
    def rows(self) -> int:
        return self.stop - self.start


def _lease() -> timedelta:
    return timedelta(seconds=settings.INFERENCE_JOB_LEASE_SECONDS)


def job_chunk_claim(*, worker_id: str, version_ids: Collection[int]) -> JobChunk | None:
    """The oldest claimable chunk of a queued or running job of one of ``version_ids``, taken by ``worker_id``.

    Claimable: pending, or running with a lapsed lease (then attempt + 1; a chunk that has had its
    attempts fails, and its job with it, instead). Taken once across the fleet; the job moves to running.
    """
    if not version_ids:
        return None
    max_attempts = settings.INFERENCE_JOB_MAX_ATTEMPTS
    while True:
        now = timezone.now()
        candidates = list(
            InferenceJobChunk.objects.filter(job__state__in=ACTIVE, job__version_id__in=list(version_ids))
            .filter(Q(state=JobStatus.PENDING) | Q(state=JobStatus.RUNNING, lease_until__lt=now))
            .order_by("job_id", "index")
            .values("pk", "job_id", "state", "attempts", "worker_id", "lease_until")[:CLAIM_CANDIDATES]
        )
        if not candidates:
            return None
        exhausted = False
        for row in candidates:
            same = InferenceJobChunk.objects.filter(
                pk=row["pk"], state=row["state"], attempts=row["attempts"], worker_id=row["worker_id"]
            )
            if row["state"] == JobStatus.RUNNING:
                same = same.filter(lease_until=row["lease_until"])
                if row["attempts"] >= max_attempts:
                    _fail_lapsed(row, same, max_attempts)
                    exhausted = True
                    continue
            taken = same.update(
                state=JobStatus.RUNNING,
                attempts=F("attempts") + 1,
                worker_id=worker_id,
                lease_until=now + _lease(),
                error="",
            )
            if not taken:
                continue  # another process took it first
            InferenceJob.objects.filter(pk=row["job_id"], state=InferenceJobState.QUEUED).update(
                state=InferenceJobState.RUNNING, started_at=now
            )
            return _job_chunk(row["pk"])
        if not exhausted:
            return None  # every candidate was taken by others meanwhile; the next poll looks again


def _fail_lapsed(row: Mapping[str, Any], same: QuerySet[InferenceJobChunk], max_attempts: int) -> None:
    """A chunk whose last attempt's lease lapsed: it and its job fail."""
    error = (
        f"rows {_rows_of(row['pk'])} were lost {max_attempts} times: the inference process running them stopped "
        f"renewing its lease (MODELYARD_INFERENCE_JOB_MAX_ATTEMPTS allows {max_attempts} attempts)"
    )
    with transaction.atomic():
        # The job's row first, as every change of a job's chunks takes it: no two of them wait on each other.
        InferenceJob.objects.select_for_update().filter(pk=row["job_id"]).first()
        if not same.update(state=JobStatus.FAILED, error=error, lease_until=None, finished_at=timezone.now()):
            return
        services.job_end_locked(row["job_id"], state=InferenceJobState.FAILED, error=error)


def _rows_of(chunk_id: int) -> str:
    chunk = InferenceJobChunk.objects.only("start", "stop").get(pk=chunk_id)
    return f"[{chunk.start}, {chunk.stop})"


def _job_chunk(chunk_id: int) -> JobChunk:
    chunk = InferenceJobChunk.objects.select_related("job__version__model").get(pk=chunk_id)
    job = chunk.job
    options = job.parameters if job.kind == InferenceJobKind.BATCH else {}
    return JobChunk(
        chunk_id=chunk.pk,
        job_id=job.public_id,
        kind=job.kind,
        format=job.format,
        version_id=job.version_id,
        model=job.version.model.name,
        version=job.version.version,
        input_key=chunk.input_key,
        output_key=chunk.output_key,
        start=chunk.start,
        stop=chunk.stop,
        outputs=tuple(options.get("outputs") or ()),
        parameters=dict(options.get("parameters") or {}),
        attempt=chunk.attempts,
        lease_seconds=settings.INFERENCE_JOB_LEASE_SECONDS,
    )


def _mine(chunk_id: int, worker_id: str) -> QuerySet[InferenceJobChunk]:
    return InferenceJobChunk.objects.filter(pk=chunk_id, state=JobStatus.RUNNING, worker_id=worker_id)


def job_chunk_progress(chunk_id: int, *, worker_id: str) -> bool:
    """Renew the chunk's lease; False when its job ended (cancelled, failed) or the chunk is no longer this worker's."""
    return bool(_mine(chunk_id, worker_id).filter(job__state__in=ACTIVE).update(lease_until=timezone.now() + _lease()))


def job_chunk_done(chunk_id: int, *, worker_id: str, rows: int) -> None:
    """The chunk's output is in the store: count its rows; the last chunk queues the job's finish.

    An infer-async request has one chunk, whose output is the answer: it ends its job here.
    """
    with transaction.atomic():
        job_id = InferenceJobChunk.objects.filter(pk=chunk_id).values_list("job_id", flat=True).first()
        if job_id is None:
            return
        # The job's row is the lock that orders the chunks of one job finishing at once: exactly one sees none left.
        job = InferenceJob.objects.select_for_update().get(pk=job_id)
        if not _mine(chunk_id, worker_id).update(
            state=JobStatus.SUCCEEDED, lease_until=None, finished_at=timezone.now()
        ):
            return  # its lease lapsed and another process has it now, or the job was cancelled and swept
        InferenceJob.objects.filter(pk=job_id).update(rows_done=F("rows_done") + rows)
        if job.state not in ACTIVE:
            return
        left = InferenceJobChunk.objects.filter(job_id=job_id).exclude(state=JobStatus.SUCCEEDED).exists()
        if left:
            return
        if job.kind == InferenceJobKind.REQUEST:
            services.request_end_locked(job_id)
        else:
            transaction.on_commit(partial(queueing.inference_job_finish_enqueue, job_id))


def job_chunk_failed(chunk_id: int, *, worker_id: str, error: str, retry: bool, status: int = 500) -> None:
    """A chunk that could not run: back to pending when ``retry`` and attempts are left; else its job fails.

    ``status`` is what an infer-async GET answers with the error (400 for a request the model refuses).
    """
    with transaction.atomic():
        job_id = InferenceJobChunk.objects.filter(pk=chunk_id).values_list("job_id", flat=True).first()
        if job_id is None:
            return
        InferenceJob.objects.select_for_update().filter(pk=job_id).first()
        chunk = _mine(chunk_id, worker_id).first()
        if chunk is None:
            return
        if retry and chunk.attempts < settings.INFERENCE_JOB_MAX_ATTEMPTS:
            _mine(chunk_id, worker_id).update(state=JobStatus.PENDING, worker_id="", lease_until=None, error=error)
            return
        if retry:
            error = (
                f"{error} (rows [{chunk.start}, {chunk.stop}) failed {chunk.attempts} times; "
                f"MODELYARD_INFERENCE_JOB_MAX_ATTEMPTS allows {settings.INFERENCE_JOB_MAX_ATTEMPTS})"
            )
        _mine(chunk_id, worker_id).update(
            state=JobStatus.FAILED, lease_until=None, error=error, finished_at=timezone.now()
        )
        services.job_end_locked(chunk.job_id, state=InferenceJobState.FAILED, error=error, status=status)


def job_versions() -> QuerySet[ModelVersion]:
    """The ready versions of queued and running jobs, which every inference process keeps loaded for them."""
    return (
        ModelVersion.objects.filter(
            pk__in=InferenceJob.objects.filter(state__in=ACTIVE).values("version_id"),
            status=VersionStatus.READY,
            deleted_at__isnull=True,
        )
        .select_related("model")
        .prefetch_related("files", "signatures")
    )
