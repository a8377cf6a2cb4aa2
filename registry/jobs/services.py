"""Inference jobs in the registry: accepting one, cancelling it, its result; the tasks' preparing and finishing.

The API, the UI and the command line call :func:`job_submit`, :func:`request_submit`, :func:`job_cancel`,
:func:`job_result`, :func:`request_answer` and :func:`visible_jobs`; the tasks in ``registry/tasks.py``
call :func:`job_prepare`, :func:`job_finish` and :func:`jobs_sweep`. ``registry/jobs/__init__.py`` tells
the whole story; ``chunks.py`` is the inference processes' side.
"""

from __future__ import annotations

import io
import json
import logging
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, Max, Q, QuerySet
from django.utils import timezone

from modelyard.error_body import error_body
from registry import notify, queueing
from registry.access.auth import has_role
from registry.audit.chain import SYSTEM, Actor, audit_record
from registry.errors import (
    Conflict,
    Gone,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    QueueFull,
    RegistryError,
    StorageDown,
)
from registry.jobs import formats
from registry.models import (
    Alias,
    ApiToken,
    InferenceJob,
    InferenceJobChunk,
    InferenceJobFormat,
    InferenceJobKind,
    InferenceJobState,
    JobStatus,
    ModelVersion,
    RegisteredModel,
    Role,
    VersionStatus,
    WebhookEvent,
)
from registry.webhooks.services import emit
from storage import ObjectNotFound, StorageError, StorageUnavailable, get_storage

logger = logging.getLogger(__name__)

ACTIVE = (InferenceJobState.QUEUED, InferenceJobState.RUNNING)
ENDED = (InferenceJobState.SUCCEEDED, InferenceJobState.FAILED, InferenceJobState.CANCELLED)
PREFIX = "inference-jobs"
# The lease of a job's registry-side step (preparing, finishing): a task still at it this long after it
# began was lost with its worker, and the sweep queues the step again.
STEP_LEASE = timedelta(minutes=15)
# A step whose task was never queued (lost between commit and broker) is queued again after this long.
LOST_QUEUEING = timedelta(seconds=60)
MAX_ERRORS = 50
# Serialises the queue-limit checks of concurrent submissions (PostgreSQL's transaction-level advisory lock).
QUEUE_LOCK = 0x6A6F6273  # "jobs"

ROWS_SETTING = "MODELYARD_INFERENCE_JOB_MAX_ROWS"
BYTES_SETTING = "MODELYARD_INFERENCE_JOB_MAX_BYTES"
PER_TOKEN_SETTING = "MODELYARD_INFERENCE_JOB_MAX_QUEUED_PER_TOKEN"
QUEUED_SETTING = "MODELYARD_INFERENCE_JOB_MAX_QUEUED"


def job_prefix(public_id: str) -> str:
    return f"{PREFIX}/{public_id}"


def _work_dir() -> Path:
    path = Path(settings.VALIDATION_WORK_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def _scratch() -> Iterator[Path]:
    """A private folder under the work directory for one job's local copies; removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="inference-job-", dir=_work_dir()))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- Accepting a job ---------------------------------------------------------------------------------


def version_for_ref(model: RegisteredModel, ref: str) -> ModelVersion:
    """The ready version ``ref`` names now: an alias of ``model``, or a version number."""
    ref = (ref or "").strip()
    if not ref:
        raise InvalidInput("name the version: an alias or a version number")
    if ref.isdigit():
        version = ModelVersion.objects.filter(model=model, version=int(ref)).select_related("model").first()
        if version is None:
            raise NotFound(f"model '{model.name}' has no version {ref}")
    else:
        alias = Alias.objects.filter(model=model, name=ref).select_related("version__model").first()
        if alias is None:
            raise NotFound(f"model '{model.name}' has no alias '{ref}'")
        if alias.version is None:
            raise Conflict(f"alias '{ref}' of model '{model.name}' points to no version")
        version = alias.version
    if version.deleted_at is not None:
        raise Gone(f"version {version.version} of model '{model.name}' is deleted")
    if version.status != VersionStatus.READY:
        raise Conflict(
            f"version {version.version} of model '{model.name}' is {version.status}; a job runs on a ready version",
            detail={"status": version.status},
        )
    return version


def _active_jobs_of(user: Any, token: ApiToken | None) -> QuerySet[InferenceJob]:
    active = InferenceJob.objects.filter(state__in=ACTIVE)
    if token is not None:
        return active.filter(token=token)
    return active.filter(token__isnull=True, created_by=user)


def _check_queue(user: Any, token: ApiToken | None) -> None:
    """Refuse a job past the queued limits, per token (per user without one) and in all, naming the setting."""
    per = settings.INFERENCE_JOB_MAX_QUEUED_PER_TOKEN
    mine = _active_jobs_of(user, token).count()
    if mine >= per:
        who = f"token {token.prefix}" if token is not None else f"user {user.get_username() if user else 'anonymous'}"
        raise QueueFull(
            f"{who} has {_jobs(mine)} queued or running; {PER_TOKEN_SETTING} allows {per}",
            detail={"limit": per, "setting": PER_TOKEN_SETTING},
        )
    limit = settings.INFERENCE_JOB_MAX_QUEUED
    total = InferenceJob.objects.filter(state__in=ACTIVE).count()
    if total >= limit:
        raise QueueFull(
            f"{_jobs(total)} queued or running in all; {QUEUED_SETTING} allows {limit}",
            detail={"limit": limit, "setting": QUEUED_SETTING},
        )


def _jobs(count: int) -> str:
    return f"{count} job" if count == 1 else f"{count} jobs"


def _check_rows(rows: int) -> None:
    limit = settings.INFERENCE_JOB_MAX_ROWS
    if rows > limit:
        raise PayloadTooLarge(
            f"the job has {rows} rows; {ROWS_SETTING} allows {limit}", detail={"limit": limit, "setting": ROWS_SETTING}
        )


def _too_many_bytes(size: int | None = None) -> PayloadTooLarge:
    limit = settings.INFERENCE_JOB_MAX_BYTES
    what = f"the input has {size} bytes" if size is not None else f"the input is larger than {limit} bytes"
    return PayloadTooLarge(f"{what}; {BYTES_SETTING} allows {limit}", detail={"limit": limit, "setting": BYTES_SETTING})


class _CountingCopy:
    """An input's stream as the store reads it: counted against the byte limit and copied to a local file.

    The store may wrap what a read raises (boto3 reads in its own threads); ``error`` keeps the refusal.
    """

    def __init__(self, raw: BinaryIO, local: BinaryIO, limit: int) -> None:
        self._raw = raw
        self._local = local
        self._limit = limit
        self.size = 0
        self.error: RegistryError | None = None

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        if data:
            self.size += len(data)
            if self.size > self._limit:
                self.error = _too_many_bytes()
                raise self.error
            self._local.write(data)
        return data

    def readable(self) -> bool:
        return True


def store_key_of(input_url: str) -> str:
    """The key in the configured store that ``input_url`` names: ``s3://<bucket>/<key>``, ``oss://...`` or a key.

    Another bucket, an absolute path or a ``..`` is refused: a job reads only what the registry's store holds.
    """
    url = input_url.strip()
    config = settings.STORAGE
    scheme, sep, rest = url.partition("://")
    if sep:
        if scheme not in {"s3", "oss"}:
            raise InvalidInput(
                f"input_url: {scheme}:// is not the configured store; name a key in it, or s3://bucket/key"
            )
        bucket, _, key = rest.partition("/")
        if config.kind != "s3" or bucket != config.bucket:
            raise InvalidInput(f"input_url: bucket '{bucket}' is not the configured store's; a job reads only from it")
        prefix = config.prefix.strip("/")
        if prefix:
            if not key.startswith(prefix + "/"):
                raise InvalidInput(f"input_url: '{key}' is outside the store's prefix '{prefix}/'")
            key = key[len(prefix) + 1 :]
    else:
        key = url
    if not key or key.startswith("/") or "\\" in key:
        raise InvalidInput("input_url: name a key in the configured store, not an absolute path")
    if any(part in {"", ".", ".."} for part in key.split("/")):
        raise InvalidInput(f"input_url: '{key}' has an empty, '.' or '..' part")
    if key.startswith(PREFIX + "/"):
        raise InvalidInput(f"input_url: '{PREFIX}/' holds the jobs' own files; name your input elsewhere")
    return key


def _stored_size(key: str) -> int:
    storage = get_storage()
    try:
        for item in storage.list(key):
            if item.key == key:
                return item.size
    except StorageUnavailable as exc:
        raise StorageDown(f"artifact storage is unavailable: {exc}") from exc
    raise NotFound(f"input_url: the store holds nothing at '{key}'")


def _copy_from_store(key: str, path: Path) -> int:
    """Copy the stored ``key`` to ``path``, within the byte limit; its size."""
    limit = settings.INFERENCE_JOB_MAX_BYTES
    size = 0
    try:
        with get_storage().open(key) as source, path.open("wb") as out:
            while chunk := source.read(1024 * 1024):
                size += len(chunk)
                if size > limit:
                    raise _too_many_bytes()
                out.write(chunk)
    except ObjectNotFound as exc:
        raise NotFound(f"input_url: the store holds nothing at '{key}'") from exc
    except StorageUnavailable as exc:
        raise StorageDown(f"artifact storage is unavailable: {exc}") from exc
    return size


def _write(key: str, stream: BinaryIO, *, replace: bool = False) -> Any:
    """Write ``stream`` at ``key``; ``replace`` first deletes what a lost attempt may have left there."""
    storage = get_storage()
    try:
        if replace:
            storage.delete(key)
        return storage.write(key, stream)
    except StorageUnavailable as exc:
        raise StorageDown(f"artifact storage is unavailable: {exc}") from exc
    except StorageError as exc:
        raise StorageDown(f"artifact storage refused the write: {exc}") from exc


def _delete_quietly(keys: Sequence[str]) -> None:
    storage = get_storage()
    for key in keys:
        try:
            storage.delete(key)
        except StorageError:
            logger.warning("could not delete %s; the sweep of its job deletes it later", key)


def job_submit(
    *,
    model: RegisteredModel,
    ref: str,
    fmt: str | None,
    filename: str,
    stream: BinaryIO | None,
    input_url: str,
    outputs: Sequence[str],
    result_format: str,
    user: Any,
    token: ApiToken | None,
    actor: Actor,
) -> InferenceJob:
    """Accept a batch job: its input uploaded (``stream``, stored as it is read) or named (``input_url``).

    ``fmt`` None or empty: from the file name's suffix (``.npz``, ``.jsonl``, ``.txt``). The version is
    the one ``ref`` names now. Every refusal (format, input, limits) comes before the job is recorded,
    and leaves nothing in the store.
    """
    input_url = (input_url or "").strip()
    if (stream is None) == (not input_url):
        raise InvalidInput("send the input as a file ('input') or name it in the store ('input_url'), one of the two")
    version = version_for_ref(model, ref)
    job_format = formats.format_of(fmt, filename or input_url)
    formats.check_model_takes(job_format, version)
    checked_outputs = formats.checked_outputs(outputs, version.signature)
    result = formats.result_format_of(job_format, result_format)
    _check_queue(user, token)
    public_id = secrets.token_hex(8)
    written: list[str] = []
    try:
        with _scratch() as folder:
            local = folder / f"input.{formats.INPUT_SUFFIX[job_format]}"
            if stream is not None:
                key = f"{job_prefix(public_id)}/input.{formats.INPUT_SUFFIX[job_format]}"
                with local.open("wb") as out:
                    reader = _CountingCopy(stream, out, settings.INFERENCE_JOB_MAX_BYTES)
                    try:
                        stored = get_storage().write(key, reader)  # type: ignore[arg-type]  # a readable stream is enough
                    except BaseException as exc:
                        if reader.error is not None and reader.error is not exc:
                            raise reader.error from None
                        if isinstance(exc, StorageUnavailable):
                            raise StorageDown(f"artifact storage is unavailable: {exc}") from exc
                        if isinstance(exc, StorageError):
                            raise StorageDown(f"artifact storage refused the write: {exc}") from exc
                        raise
                written.append(key)
                size, sha256 = stored.size, stored.sha256
            else:
                key = store_key_of(input_url)
                size = _stored_size(key)
                if size > settings.INFERENCE_JOB_MAX_BYTES:
                    raise _too_many_bytes(size)
                size, sha256 = _copy_from_store(key, local), ""
            rows = formats.inspect(local, job_format, version.signature)
        _check_rows(rows)
        job = _record_job(
            public_id=public_id,
            kind=InferenceJobKind.BATCH,
            version=version,
            ref=ref,
            job_format=job_format,
            rows=rows,
            input_key=key,
            input_bytes=size,
            input_sha256=sha256,
            parameters={"outputs": checked_outputs, "result_format": result, "parameters": {}},
            user=user,
            token=token,
            actor=actor,
        )
    except BaseException:
        _delete_quietly(written)
        raise
    return job


def request_submit(
    *, model: RegisteredModel, ref: str, body: bytes, user: Any, token: ApiToken | None, actor: Actor
) -> InferenceJob:
    """Accept one infer-async request: a v2 request body, answered later by :func:`request_answer`."""
    version = version_for_ref(model, ref)
    if len(body) > settings.INFERENCE_JOB_MAX_BYTES:
        raise _too_many_bytes(len(body))
    formats.check_v2_text(body, version.signature, where="the request")
    _check_queue(user, token)
    public_id = secrets.token_hex(8)
    key = f"{job_prefix(public_id)}/input.json"
    stored = _write(key, io.BytesIO(body))
    try:
        return _record_job(
            public_id=public_id,
            kind=InferenceJobKind.REQUEST,
            version=version,
            ref=ref,
            job_format=InferenceJobFormat.V2,
            rows=1,
            input_key=key,
            input_bytes=stored.size,
            input_sha256=stored.sha256,
            parameters={},
            user=user,
            token=token,
            actor=actor,
            one_chunk=True,
        )
    except BaseException:
        _delete_quietly([key])
        raise


@transaction.atomic(durable=True)
def _record_job(
    *,
    public_id: str,
    kind: str,
    version: ModelVersion,
    ref: str,
    job_format: str,
    rows: int,
    input_key: str,
    input_bytes: int,
    input_sha256: str,
    parameters: dict[str, Any],
    user: Any,
    token: ApiToken | None,
    actor: Actor,
    one_chunk: bool = False,
) -> InferenceJob:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [QUEUE_LOCK])
    _check_queue(user, token)  # again, now that no other submission can pass it at the same time
    # Ready when checked, but a deletion may have come since: the row lock keeps it until this commits.
    version = ModelVersion.objects.select_for_update().select_related("model").get(pk=version.pk)
    if version.status != VersionStatus.READY or version.deleted_at is not None:
        raise Conflict(f"version {version.version} of model '{version.model.name}' is no longer ready")
    job = InferenceJob.objects.create(
        public_id=public_id,
        kind=kind,
        model=version.model,
        version=version,
        ref=ref,
        format=job_format,
        rows=rows,
        input_key=input_key,
        input_bytes=input_bytes,
        input_sha256=input_sha256,
        parameters=parameters,
        created_by=user if getattr(user, "pk", None) is not None else None,
        token=token,
    )
    if one_chunk:
        InferenceJobChunk.objects.create(
            job=job,
            index=0,
            start=0,
            stop=1,
            input_key=input_key,
            output_key=f"{job_prefix(public_id)}/chunks/{0:06d}.out.json",
        )
    audit_record(
        actor=actor,
        action="inference_job.submit",
        target_type="inference_job",
        target=public_id,
        model_name=version.model.name,
        after=_summary(job),
    )
    if kind == InferenceJobKind.BATCH:
        transaction.on_commit(partial(queueing.inference_job_prepare_enqueue, job.pk))
    else:
        _wake_runners(public_id)
    return job


def _summary(job: InferenceJob) -> dict[str, Any]:
    return {
        "id": job.public_id,
        "kind": job.kind,
        "model": job.model.name,
        "version": job.version.version,
        "ref": job.ref,
        "format": job.format,
        "state": job.state,
        "rows": job.rows,
        "rows_done": job.rows_done,
    }


# --- Ending a job ------------------------------------------------------------------------------------


def _ttl(job: InferenceJob) -> timedelta:
    seconds = (
        settings.ASYNC_RESULT_TTL_SECONDS
        if job.kind == InferenceJobKind.REQUEST
        else settings.INFERENCE_JOB_RESULT_TTL_SECONDS
    )
    return timedelta(seconds=seconds)


def _end(job: InferenceJob, *, state: str, actor: Actor, action: str, error: str = "") -> None:
    """Inside the caller's transaction, with ``job`` locked and active: end it, audited, with the webhook event."""
    now = timezone.now()
    job.state, job.finished_at, job.expires_at = state, now, now + _ttl(job)
    fields = ["state", "finished_at", "expires_at"]
    if error:
        job.errors = [*job.errors, error][-MAX_ERRORS:]
        fields.append("errors")
    job.save(update_fields=fields)
    after = {**_summary(job), **({"error": error} if error else {})}
    audit_record(
        actor=actor,
        action=action,
        target_type="inference_job",
        target=job.public_id,
        model_name=job.model.name,
        after=after,
    )
    emit(
        WebhookEvent.INFERENCE_JOB_FINISHED,
        model=job.model,
        version=job.version.version,
        details={
            "job": job.public_id,
            "kind": job.kind,
            "state": state,
            "rows": job.rows,
            "rows_done": job.rows_done,
            "errors": job.errors,
        },
    )


def _locked(job_id: int) -> InferenceJob | None:
    return InferenceJob.objects.select_for_update().select_related("model", "version").filter(pk=job_id).first()


def job_end_locked(job_id: int, *, state: str, error: str = "", status: int = 500) -> bool:
    """Inside the caller's transaction: end an active job (``failed``, mostly), by the registry; False if it had ended.

    ``status`` is what an infer-async GET answers with the error.
    """
    job = _locked(job_id)
    if job is None or job.state not in ACTIVE:
        return False
    if job.kind == InferenceJobKind.REQUEST and state == InferenceJobState.FAILED:
        job.parameters = {**job.parameters, "error_status": status}
        job.save(update_fields=["parameters"])
    _end(job, state=state, actor=SYSTEM, action="inference_job.finish", error=error)
    return True


def request_end_locked(job_id: int) -> None:
    """Inside the caller's transaction: an infer-async request's one chunk is done; its output is the answer."""
    job = _locked(job_id)
    if job is None or job.state not in ACTIVE:
        return
    chunk = job.chunks.get(index=0)
    job.result_key = chunk.output_key
    job.save(update_fields=["result_key"])
    _end(job, state=InferenceJobState.SUCCEEDED, actor=SYSTEM, action="inference_job.finish")


@transaction.atomic(durable=True)
def job_cancel(job: InferenceJob, *, actor: Actor) -> InferenceJob:
    """Cancel a queued or running job: no chunk is claimed from now on; running ones stop at their next renewal."""
    locked = _locked(job.pk)
    if locked is None:
        raise NotFound(f"no inference job {job.public_id}")
    if locked.state not in ACTIVE:
        raise Conflict(
            f"job {locked.public_id} is {locked.state}; only a queued or running job can be cancelled",
            detail={"state": locked.state},
        )
    _end(locked, state=InferenceJobState.CANCELLED, actor=actor, action="inference_job.cancel")
    return locked


# --- Reading ---------------------------------------------------------------------------------------


def visible_jobs(user: Any) -> QuerySet[InferenceJob]:
    """The jobs ``user`` may see: their own; an admin's or an auditor's, everyone's."""
    jobs = InferenceJob.objects.select_related("model", "version", "created_by")
    if has_role(user, Role.AUDITOR):
        return jobs
    if user is None or not getattr(user, "is_authenticated", False):
        return jobs.none()
    return jobs.filter(created_by=user)


def job_result(job: InferenceJob) -> tuple[BinaryIO, str, str, int]:
    """A succeeded batch job's result: the stream, its content type, a file name, its size."""
    if job.state != InferenceJobState.SUCCEEDED:
        raise Conflict(
            f"job {job.public_id} is {job.state}; its result is there once it has succeeded",
            detail={"state": job.state},
        )
    if not job.result_key:
        raise Gone(
            f"the result of job {job.public_id} was deleted: results are kept "
            "MODELYARD_INFERENCE_JOB_RESULT_TTL_SECONDS after the job ends"
        )
    suffix = job.result_key.rsplit(".", 1)[-1]
    try:
        stream = get_storage().open(job.result_key)
    except ObjectNotFound as exc:
        raise Gone(f"the result of job {job.public_id} is no longer in the store") from exc
    except StorageUnavailable as exc:
        raise StorageDown(f"artifact storage is unavailable: {exc}") from exc
    return stream, formats.CONTENT_TYPES[suffix], f"{job.public_id}-result.{suffix}", job.result_bytes


def request_answer(job: InferenceJob) -> tuple[int, bytes]:
    """What ``GET .../infer-async/{id}`` answers: 202 while it waits, 200 with the v2 answer, or the error's status."""
    if job.expires_at is not None and job.state in ENDED and job.expires_at <= timezone.now():
        raise NotFound(
            f"the answer of request {job.public_id} has expired: answers are kept MODELYARD_ASYNC_RESULT_TTL_SECONDS"
        )
    if job.state in ACTIVE:
        return 202, json.dumps({"id": job.public_id, "state": job.state}).encode()
    if job.state == InferenceJobState.SUCCEEDED:
        try:
            with get_storage().open(job.result_key) as stream:
                return 200, stream.read()
        except ObjectNotFound as exc:
            raise NotFound(f"the answer of request {job.public_id} is no longer in the store") from exc
        except StorageUnavailable as exc:
            raise StorageDown(f"artifact storage is unavailable: {exc}") from exc
    if job.state == InferenceJobState.CANCELLED:
        return 409, json.dumps(error_body(f"request {job.public_id} was cancelled")).encode()
    status = int(job.parameters.get("error_status", 500))
    message = job.errors[-1] if job.errors else "the request failed"
    return status, json.dumps(error_body(message)).encode()


# --- The tasks: prepare, finish, sweep -----------------------------------------------------------------


def _take_step(job_id: int, state: str) -> InferenceJob | None:
    """Take a batch job's preparing (state queued) or finishing (running) step; None when another has it."""
    now = timezone.now()
    taken = (
        InferenceJob.objects.filter(pk=job_id, kind=InferenceJobKind.BATCH, state=state)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__lt=now))
        .update(expires_at=now + STEP_LEASE)
    )
    if not taken:
        return None
    return InferenceJob.objects.select_related("model", "version").get(pk=job_id)


def _release_step(job_id: int) -> None:
    InferenceJob.objects.filter(pk=job_id, state__in=ACTIVE).update(expires_at=None)


@transaction.atomic(durable=True)
def _fail(job_id: int, error: str) -> None:
    job_end_locked(job_id, state=InferenceJobState.FAILED, error=error)


def job_prepare(job_id: int) -> str:
    """Split a queued job's input into chunk files and record its chunks (safe to run twice)."""
    job = _take_step(job_id, InferenceJobState.QUEUED)
    if job is None:
        return "skipped"
    if job.chunks.exists():
        _release_step(job_id)
        return "prepared already"
    prefix = job_prefix(job.public_id)
    suffix = formats.CHUNK_INPUT_SUFFIX[job.format]
    chunks: list[InferenceJobChunk] = []
    try:
        with _scratch() as folder:
            local = folder / "input"
            _copy_from_store(job.input_key, local)
            pieces = formats.split(local, job.format, job.version.signature, settings.INFERENCE_JOB_CHUNK_ROWS)
            for index, (start, stop, data) in enumerate(pieces):
                key = f"{prefix}/chunks/{index:06d}.in.{suffix}"
                _write(key, data, replace=True)  # a lost preparation may have written it
                output_key = f"{prefix}/chunks/{index:06d}.out.{formats.CHUNK_OUTPUT_SUFFIX[job.format]}"
                chunks.append(
                    InferenceJobChunk(
                        job_id=job_id, index=index, start=start, stop=stop, input_key=key, output_key=output_key
                    )
                )
        rows = chunks[-1].stop if chunks else 0
        _check_rows(rows)
        if not chunks:
            raise InvalidInput("the input has no rows")
    except (InvalidInput, PayloadTooLarge, NotFound) as exc:
        _fail(job_id, exc.message)
        return "failed"
    except StorageDown:
        _release_step(job_id)
        raise
    return _record_chunks(job_id, chunks, rows)


@transaction.atomic(durable=True)
def _record_chunks(job_id: int, chunks: list[InferenceJobChunk], rows: int) -> str:
    job = _locked(job_id)
    if job is None or job.state != InferenceJobState.QUEUED or job.chunks.exists():
        return "ended meanwhile"  # cancelled: the sweep deletes the chunk files with the job's other files
    InferenceJobChunk.objects.bulk_create(chunks)
    job.rows, job.expires_at = rows, None
    job.save(update_fields=["rows", "expires_at"])
    _wake_runners(job.public_id)
    return "prepared"


def _wake_runners(public_id: str) -> None:
    """After commit: tell the inference processes to look for chunks now, not at their next reconcile beat.

    The alias-change channel (``registry.notify``) wakes every process's reconcile loop, whose pass
    polls its job runner; a lost message costs one beat (``MODELYARD_RECONCILE_POLL_SECONDS``).
    """
    transaction.on_commit(partial(notify.publish, {"inference_job": public_id}))


def job_finish(job_id: int) -> str:
    """Assemble a job's result from its chunks' outputs, and end it ``succeeded`` (safe to run twice)."""
    job = _take_step(job_id, InferenceJobState.RUNNING)
    if job is None:
        return "skipped"
    chunks = list(job.chunks.order_by("index"))
    if not chunks or any(chunk.state != JobStatus.SUCCEEDED for chunk in chunks):
        _release_step(job_id)
        return "not done"
    result_format = job.parameters.get("result_format") or formats.result_format_of(job.format, "")
    key = f"{job_prefix(job.public_id)}/result.{formats.RESULT_SUFFIX[result_format]}"
    try:
        with _scratch() as folder:
            parts = []
            for chunk in chunks:
                path = folder / f"{chunk.index:06d}"
                _copy_from_store(chunk.output_key, path)
                parts.append(formats.Part(path=path, rows=chunk.stop - chunk.start, start=chunk.start))
            result = folder / "result"
            with result.open("wb") as out:
                formats.assemble(job.format, result_format, parts, out, outputs=job.parameters.get("outputs") or [])
            with result.open("rb") as stream:
                stored = _write(key, stream, replace=True)  # a lost finish may have written it
    except (InvalidInput, NotFound) as exc:
        _fail(job_id, f"the result could not be assembled: {exc.message}")
        return "failed"
    except StorageDown:
        _release_step(job_id)
        raise
    return _record_result(job_id, key, stored.size)


@transaction.atomic(durable=True)
def _record_result(job_id: int, key: str, size: int) -> str:
    job = _locked(job_id)
    if job is None or job.state != InferenceJobState.RUNNING:
        return "ended meanwhile"
    job.result_key, job.result_bytes = key, size
    job.save(update_fields=["result_key", "result_bytes"])
    _end(job, state=InferenceJobState.SUCCEEDED, actor=SYSTEM, action="inference_job.finish")
    return "succeeded"


@dataclass(frozen=True)
class Swept:
    """What one sweep did: jobs whose files expired (and infer-async rows deleted), steps queued again."""

    expired: list[str]
    prepare: list[int]
    finish: list[int]
    # Jobs failed because their version was deleted (or is no longer ready) before they ran.
    orphaned: list[str] = field(default_factory=list)


def jobs_sweep(*, limit: int = 200) -> Swept:
    """Delete the files (and an infer-async job's row) of ended jobs past their TTL; queue lost steps again."""
    now = timezone.now()
    expired = []
    for job in InferenceJob.objects.filter(state__in=ENDED, expires_at__lte=now).order_by("expires_at")[:limit]:
        try:
            _delete_files(job)
        except StorageError:
            logger.warning("could not delete the files of inference job %s; the next sweep tries again", job.public_id)
            continue
        if job.kind == InferenceJobKind.REQUEST:
            InferenceJob.objects.filter(pk=job.pk, expires_at=job.expires_at).delete()
        else:
            InferenceJob.objects.filter(pk=job.pk, expires_at=job.expires_at).update(
                expires_at=None, result_key="", result_bytes=0
            )
        expired.append(job.public_id)
    stale = Q(expires_at__lt=now) | Q(expires_at__isnull=True, created_at__lt=now - LOST_QUEUEING)
    prepare = list(
        InferenceJob.objects.filter(stale, kind=InferenceJobKind.BATCH, state=InferenceJobState.QUEUED)
        .annotate(n=Count("chunks"))
        .filter(n=0)
        .values_list("pk", flat=True)[:limit]
    )
    finish = list(
        InferenceJob.objects.filter(kind=InferenceJobKind.BATCH, state=InferenceJobState.RUNNING)
        .filter(Q(expires_at__lt=now) | Q(expires_at__isnull=True))
        .annotate(
            n=Count("chunks"),
            done=Count("chunks", filter=Q(chunks__state=JobStatus.SUCCEEDED)),
            last=Max("chunks__finished_at"),
        )
        .filter(n__gt=0, done=F("n"), last__lt=now - LOST_QUEUEING)
        .values_list("pk", flat=True)[:limit]
    )
    for job_id in prepare:
        queueing.inference_job_prepare_requeue(job_id)
    for job_id in finish:
        queueing.inference_job_finish_requeue(job_id)
    orphaned = []
    gone = InferenceJob.objects.filter(state__in=ACTIVE).filter(
        Q(version__deleted_at__isnull=False) | ~Q(version__status=VersionStatus.READY)
    )
    for job in gone.select_related("version")[:limit]:
        error = f"version {job.version.version} is no longer ready (deleted, or failed again); the job cannot run"
        _fail(job.pk, error)
        orphaned.append(job.public_id)
    return Swept(expired=expired, prepare=prepare, finish=finish, orphaned=orphaned)


def _delete_files(job: InferenceJob) -> None:
    """Delete what the store holds under the job's prefix (its input when uploaded, chunks, result)."""
    storage = get_storage()
    for item in list(storage.list(job_prefix(job.public_id) + "/")):
        storage.delete(item.key)
