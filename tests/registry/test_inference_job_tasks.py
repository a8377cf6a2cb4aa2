"""Inference jobs' tasks without a broker: the split and the finish run on job threads, never in the request,
and the sweep runs on the beat schedule (the embedded scheduler's too)."""

from __future__ import annotations

import io
import json
import threading
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from modelyard.embedded import EmbeddedScheduler
from registry import serving
from registry.audit.chain import SYSTEM, Actor
from registry.jobs import services
from registry.models import ApiToken, InferenceJob, InferenceJobChunk, RegisteredModel, Role, WebhookDelivery
from registry.webhooks import services as webhooks
from storage import get_storage
from tests.support.people import Person, make_person
from tests.support.polling import eventually
from tests.support.registry import create_model, upload_versions

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ivy(db: None) -> Person:
    return make_person("ivy", Role.INFERENCE)


@pytest.fixture
def model(owner: Person) -> RegisteredModel:
    create_model(owner)
    upload_versions(owner, [1.0])
    return RegisteredModel.objects.get(name="demo")


def _who(person: Person) -> dict[str, Any]:
    user = get_user_model().objects.get(username=person.username)
    token = ApiToken.objects.get(user=user)
    return {"user": user, "token": token, "actor": Actor(user=user, token_id=token.pk)}


def _npz(**arrays: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out.getvalue()


def test_submit_answers_before_the_split_and_a_job_thread_runs_it_then_the_finish(
    settings, monkeypatch, model, ivy, queued
):
    settings.INFERENCE_JOB_CHUNK_ROWS = 2
    webhooks.webhook_create(url="https://hooks.example.com/jobs", events=["inference_job.finished"], actor=SYSTEM)
    release = threading.Event()
    prepare = services.job_prepare

    def held_prepare(job_id: int) -> str:
        release.wait(30)
        return prepare(job_id)

    monkeypatch.setattr(services, "job_prepare", held_prepare)
    x = np.arange(20, dtype=np.float32).reshape(5, 4)
    job = services.job_submit(
        model=model,
        ref="1",
        fmt=None,
        filename="input.npz",
        stream=io.BytesIO(_npz(x=x)),
        input_url="",
        outputs=[],
        result_format="",
        **_who(ivy),
    )
    # The submission has returned while its split waits on the job thread.
    assert not InferenceJobChunk.objects.filter(job=job).exists()
    release.set()
    eventually(lambda: InferenceJobChunk.objects.filter(job=job).count() == 3, what="the job was not split")

    while (chunk := serving.job_chunk_claim(worker_id="w", version_ids=[job.version_id])) is not None:
        with get_storage().open(chunk.input_key) as stream, np.load(io.BytesIO(stream.read())) as inputs:
            y = inputs["x"] + 1
        out = io.BytesIO()
        np.savez(out, y=y)
        out.seek(0)
        get_storage().write(chunk.output_key, out)
        serving.job_chunk_done(chunk.chunk_id, worker_id="w", rows=chunk.rows)
    eventually(lambda: InferenceJob.objects.get(pk=job.pk).state == "succeeded", what="the job did not finish")
    job.refresh_from_db()
    with services.job_result(job)[0] as stream, np.load(io.BytesIO(stream.read())) as result:
        np.testing.assert_array_equal(result["y"], x + 1)
    delivery = WebhookDelivery.objects.get(event="inference_job.finished")
    body = json.loads(delivery.body)
    assert (body["model"], body["version"]) == ("demo", 1)
    assert body["details"] | {"errors": []} == {
        "job": job.public_id,
        "kind": "batch",
        "state": "succeeded",
        "rows": 5,
        "rows_done": 5,
        "errors": [],
    }
    assert queued == [delivery.pk]


def test_the_sweep_is_on_the_beat_schedule_and_runs_on_the_embedded_scheduler(settings, model, ivy):
    assert django_settings.CELERY_BEAT_SCHEDULE["sweep-inference-jobs"] == {
        "task": "registry.tasks.sweep_inference_jobs",
        "schedule": 60.0,
    }
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
    job = services.request_submit(model=model, ref="1", body=body.encode(), **_who(ivy))
    services.job_cancel(job, actor=SYSTEM)
    InferenceJob.objects.filter(pk=job.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert list(get_storage().list(f"inference-jobs/{job.public_id}/"))

    settings.CELERY_BEAT_SCHEDULE = {
        "sweep": django_settings.CELERY_BEAT_SCHEDULE["sweep-inference-jobs"] | {"schedule": 0.2}
    }
    scheduler = EmbeddedScheduler()
    scheduler.start()
    try:
        eventually(lambda: not InferenceJob.objects.filter(pk=job.pk).exists(), timeout=30, what="not swept")
    finally:
        scheduler.stop()
        scheduler.join(timeout=10)
    assert not list(get_storage().list(f"inference-jobs/{job.public_id}/"))


def test_concurrent_claims_take_each_chunk_once(settings, model, ivy):
    settings.INFERENCE_JOB_CHUNK_ROWS = 1
    job = services.job_submit(
        model=model,
        ref="1",
        fmt=None,
        filename="input.npz",
        stream=io.BytesIO(_npz(x=np.zeros((12, 4), dtype=np.float32))),
        input_url="",
        outputs=[],
        result_format="",
        **_who(ivy),
    )
    eventually(lambda: InferenceJobChunk.objects.filter(job=job).count() == 12, what="the job was not split")
    taken: list[tuple[str, int]] = []
    start = threading.Barrier(4)

    def worker(name: str) -> None:
        from django.db import connection

        try:
            start.wait()
            while (chunk := serving.job_chunk_claim(worker_id=name, version_ids=[job.version_id])) is not None:
                taken.append((name, chunk.chunk_id))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(f"w{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    ids = [chunk_id for _, chunk_id in taken]
    assert sorted(ids) == sorted(InferenceJobChunk.objects.filter(job=job).values_list("pk", flat=True))
    assert len(set(ids)) == 12
    rows = InferenceJobChunk.objects.filter(job=job)
    assert {(row.pk, row.worker_id) for row in rows} == set((chunk_id, name) for name, chunk_id in taken)
    assert all(row.attempts == 1 for row in rows)
