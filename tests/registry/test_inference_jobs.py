"""Inference jobs in the registry: accepting a job, splitting it into chunks in the store, the chunks' claims and
leases as the inference processes take them, cancelling, assembling the result, the limits and the sweep.

The runner (``inference/jobs.py``) is played by the test: it claims chunks through ``registry.serving``, reads
each chunk's input from the store, and writes the outputs with numpy, as ``y = x + 1`` would.
"""

from __future__ import annotations

import io
import json
import zipfile
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from django.contrib.auth import get_user_model
from django.test import TestCase
from django.utils import timezone
from onnx import TensorProto, helper

from registry import queueing, serving
from registry.audit.chain import Actor
from registry.errors import Conflict, Gone, InvalidInput, NotFound, PayloadTooLarge, QueueFull
from registry.jobs import services
from registry.models import (
    ApiToken,
    AuditEvent,
    InferenceJob,
    InferenceJobChunk,
    JobStatus,
    ModelVersion,
    RegisteredModel,
    Role,
)
from storage import get_storage
from tests.support.people import Person, make_person
from tests.support.registry import create_model, set_alias, upload_versions
from tests.support.text_models import text_model_bytes, tiny_tokenizer_json

pytestmark = pytest.mark.django_db


# --- Helpers ---------------------------------------------------------------------------------------


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """The prepare and finish steps stay queued here; each test runs them itself."""
    queued: dict[str, list[int]] = {"prepare": [], "finish": []}
    monkeypatch.setattr(queueing, "inference_job_prepare_enqueue", queued["prepare"].append)
    monkeypatch.setattr(queueing, "inference_job_finish_enqueue", queued["finish"].append)
    monkeypatch.setattr(queueing, "inference_job_prepare_requeue", queued["prepare"].append)
    monkeypatch.setattr(queueing, "inference_job_finish_requeue", queued["finish"].append)
    return queued


@pytest.fixture
def ivy(db: None) -> Person:
    """A pipeline with the inference role: submits jobs."""
    return make_person("ivy", Role.INFERENCE)


@pytest.fixture
def model(owner: Person) -> RegisteredModel:
    """``demo``: version 1 is y = x + 1 (x FP32 [N, 4]), ready."""
    create_model(owner)
    upload_versions(owner, [1.0])
    return RegisteredModel.objects.get(name="demo")


def _who(person: Person) -> dict[str, Any]:
    user = get_user_model().objects.get(username=person.username)
    token = ApiToken.objects.filter(user=user).first()
    return {"user": user, "token": token, "actor": Actor(user=user, token_id=token.pk if token else None)}


def submit(
    model: RegisteredModel,
    person: Person,
    data: bytes | None,
    filename: str = "input.npz",
    *,
    ref: str = "1",
    input_url: str = "",
    **options: Any,
) -> InferenceJob:
    return services.job_submit(
        model=model,
        ref=ref,
        fmt=options.pop("fmt", None),
        filename=filename,
        stream=io.BytesIO(data) if data is not None else None,
        input_url=input_url,
        outputs=options.pop("outputs", []),
        result_format=options.pop("result_format", ""),
        **_who(person),
    )


def npz_bytes(**arrays: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out.getvalue()


def load_npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as found:
        return {name: found[name] for name in found.files}


def stored(key: str) -> bytes:
    with get_storage().open(key) as stream:
        return stream.read()


def rows_x(rows: int) -> np.ndarray:
    return np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)


def run_chunk(chunk: serving.JobChunk, *, worker_id: str) -> None:
    """What the runner does with an npz chunk of y = x + 1: its outputs into the store, then done."""
    inputs = load_npz(stored(chunk.input_key))
    get_storage().write(chunk.output_key, io.BytesIO(npz_bytes(y=inputs["x"] + 1)))
    with TestCase.captureOnCommitCallbacks(execute=True):  # the last chunk queues the finish after commit
        serving.job_chunk_done(chunk.chunk_id, worker_id=worker_id, rows=chunk.rows)


def lapse(chunk_id: int) -> None:
    InferenceJobChunk.objects.filter(pk=chunk_id).update(lease_until=timezone.now() - timedelta(seconds=1))


def two_input_model() -> bytes:
    """y = a + b, both FP32 [N, 4]."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 4])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "two", [a, b], [y])
    made = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    return made.SerializeToString()


def upload(owner: Person, name: str, files: list[tuple[str, bytes]]) -> RegisteredModel:
    create_model(owner, name)
    response = owner.upload(name, files)
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get(model__name=name, version=1)
    assert version.status == "ready", version.errors
    return version.model


def v2_line(rows: np.ndarray) -> bytes:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(rows.shape), "data": rows.ravel().tolist()}]}
    return json.dumps(body).encode()


# --- Accepting and preparing --------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["local", "s3"])
def test_prepare_splits_an_npz_into_chunks_of_the_chunk_rows(request, settings, store, model, ivy, steps):
    if store == "s3":
        request.getfixturevalue("s3_settings")
    settings.INFERENCE_JOB_CHUNK_ROWS = 4
    x = rows_x(10)
    data = npz_bytes(x=x)
    with TestCase.captureOnCommitCallbacks(execute=True):
        job = submit(model, ivy, data)
    assert (job.state, job.rows, job.rows_done, job.input_bytes) == ("queued", 10, 0, len(data))
    assert stored(job.input_key) == data
    assert steps["prepare"] == [job.pk]

    assert services.job_prepare(job.pk) == "prepared"
    chunks = list(InferenceJobChunk.objects.filter(job=job).order_by("index"))
    assert [(chunk.start, chunk.stop) for chunk in chunks] == [(0, 4), (4, 8), (8, 10)]
    for chunk in chunks:
        assert chunk.input_key == f"inference-jobs/{job.public_id}/chunks/{chunk.index:06d}.in.npz"
        assert chunk.output_key == f"inference-jobs/{job.public_id}/chunks/{chunk.index:06d}.out.npz"
        arrays = load_npz(stored(chunk.input_key))
        assert list(arrays) == ["x"]
        assert arrays["x"].dtype == np.float32
        np.testing.assert_array_equal(arrays["x"], x[chunk.start : chunk.stop])
    job.refresh_from_db()
    assert (job.state, job.rows, job.expires_at) == ("queued", 10, None)
    # A second delivery of the task changes nothing.
    assert services.job_prepare(job.pk) in {"skipped", "prepared already"}
    assert InferenceJobChunk.objects.filter(job=job).count() == 3


def test_prepare_splits_a_compressed_npz_too(settings, model, ivy, steps):
    settings.INFERENCE_JOB_CHUNK_ROWS = 3
    x = rows_x(7)
    out = io.BytesIO()
    np.savez_compressed(out, x=x)
    job = submit(model, ivy, out.getvalue())
    services.job_prepare(job.pk)
    parts = [load_npz(stored(c.input_key))["x"] for c in InferenceJobChunk.objects.filter(job=job).order_by("index")]
    np.testing.assert_array_equal(np.concatenate(parts), x)


@pytest.mark.parametrize("store", ["local", "s3"])
def test_prepare_splits_json_lines_line_for_line(request, settings, store, model, ivy, steps):
    if store == "s3":
        request.getfixturevalue("s3_settings")
    settings.INFERENCE_JOB_CHUNK_ROWS = 2
    lines = [v2_line(rows_x(1) + i) for i in range(5)]
    data = b"\n".join(lines) + b"\n"
    job = submit(model, ivy, data, "requests.jsonl")
    assert (job.format, job.rows) == ("jsonl", 5)
    services.job_prepare(job.pk)
    chunks = list(InferenceJobChunk.objects.filter(job=job).order_by("index"))
    assert [(c.start, c.stop) for c in chunks] == [(0, 2), (2, 4), (4, 5)]
    assert [stored(c.input_key) for c in chunks] == [
        lines[0] + b"\n" + lines[1] + b"\n",
        lines[2] + b"\n" + lines[3] + b"\n",
        lines[4] + b"\n",
    ]
    assert chunks[0].output_key.endswith("/chunks/000000.out.jsonl")


def test_prepare_splits_text_lines_into_npz_chunks_of_strings(settings, owner, ivy, steps):
    model = upload(owner, "texty", [("model.onnx", text_model_bytes()), ("tokenizer.json", tiny_tokenizer_json())])
    settings.INFERENCE_JOB_CHUNK_ROWS = 2
    texts = ["the cat sat", "a dog ran", "", "héllo wörld"]
    job = submit(model, ivy, "\r\n".join(texts).encode(), "texts.txt")
    assert (job.format, job.rows) == ("text", 4)
    services.job_prepare(job.pk)
    chunks = list(InferenceJobChunk.objects.filter(job=job).order_by("index"))
    found = [load_npz(stored(c.input_key)) for c in chunks]
    assert [list(arrays) for arrays in found] == [["text"], ["text"]]
    assert found[0]["text"].dtype.kind == "U"
    assert [*found[0]["text"].tolist(), *found[1]["text"].tolist()] == texts


def test_the_version_is_the_one_the_alias_names_at_acceptance(owner, model, ivy, steps):
    upload_versions(owner, [2.0])
    assert set_alias(owner, "staging", 1).status_code == 200
    job = submit(model, ivy, npz_bytes(x=rows_x(2)), ref="staging")
    assert (job.version.version, job.ref) == (1, "staging")
    assert set_alias(owner, "staging", 2).status_code == 200
    job.refresh_from_db()
    assert job.version.version == 1


def test_a_job_on_a_version_that_is_not_ready_is_refused(owner, model, ivy, steps):
    ModelVersion.objects.filter(model=model, version=1).update(status="failed")
    with pytest.raises(Conflict, match="version 1 of model 'demo' is failed; a job runs on a ready version"):
        submit(model, ivy, npz_bytes(x=rows_x(2)))
    with pytest.raises(NotFound, match="model 'demo' has no alias 'nope'"):
        submit(model, ivy, npz_bytes(x=rows_x(2)), ref="nope")


def test_submit_writes_the_audit_event_in_its_transaction(model, ivy, steps):
    job = submit(model, ivy, npz_bytes(x=rows_x(3)))
    event = AuditEvent.objects.get(action="inference_job.submit")
    assert (event.actor, event.target_type, event.target, event.model_name) == (
        "ivy",
        "inference_job",
        job.public_id,
        "demo",
    )
    assert event.after["rows"] == 3 and event.after["version"] == 1


# --- Input formats refused -----------------------------------------------------------------------------


def _refused(model: RegisteredModel, person: Person, data: bytes, filename: str = "input.npz") -> str:
    with pytest.raises(InvalidInput) as caught:
        submit(model, person, data, filename)
    assert not list(get_storage().list("inference-jobs/")), "a refused input left files in the store"
    assert not InferenceJob.objects.exists()
    return caught.value.message


def test_an_unknown_suffix_is_refused(model, ivy, steps):
    assert _refused(model, ivy, b"1,2,3", "input.csv") == (
        "unknown input suffix '.csv' of 'input.csv': send .npz (one array per model input), "
        ".jsonl (one v2 request body per line) or .txt (one text per line)"
    )


def test_an_npz_missing_an_input_is_refused(model, ivy, steps):
    assert _refused(model, ivy, npz_bytes(z=rows_x(2))) == (
        "the .npz input has no array for the model's input 'x' (it has z)"
    )


def test_an_npz_of_the_wrong_dtype_is_refused(model, ivy, steps):
    assert _refused(model, ivy, npz_bytes(x=rows_x(2).astype(np.float64))) == (
        "array 'x' has dtype float64, but input 'x' is FP32 (float32)"
    )


def test_an_npz_whose_arrays_have_different_rows_is_refused(owner, ivy, steps):
    model = upload(owner, "two", [("model.onnx", two_input_model())])
    assert _refused(model, ivy, npz_bytes(a=rows_x(3), b=rows_x(2))) == (
        "the .npz input's arrays have different numbers of rows: 'a' has 3, 'b' has 2"
    )


def test_an_npz_of_the_wrong_width_is_refused(model, ivy, steps):
    assert _refused(model, ivy, npz_bytes(x=np.zeros((2, 5), dtype=np.float32))) == (
        "array 'x' has shape [2, 5], but input 'x' needs 4 in dimension 1 [-1, 4]"
    )


def test_a_file_that_is_not_an_npz_is_refused(model, ivy, steps):
    assert _refused(model, ivy, b"not a zip") == (
        "the .npz input is not a zip of .npy arrays; save it with np.savez or np.savez_compressed"
    )


def test_a_json_line_that_is_not_a_v2_body_is_refused_naming_the_line(model, ivy, steps):
    good = v2_line(rows_x(1))
    assert _refused(model, ivy, good + b'\n{"x": [1, 2]}\n', "in.jsonl") == (
        'line 2 is not a v2 request body: "inputs" must be a list of tensors'
    )
    assert _refused(model, ivy, good + b"\n" + good + b"\n{oops\n", "in.jsonl") == (
        "line 3 is not a v2 request body: not JSON (Expecting property name enclosed in double quotes at column 2)"
    )
    wrong = json.dumps({"inputs": [{"name": "x", "datatype": "INT64", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
    assert _refused(model, ivy, wrong.encode(), "in.jsonl") == (
        "line 1 is not a v2 request body: input 'x' is INT64; the model takes FP32"
    )


def test_text_for_a_model_without_a_tokenizer_is_refused(model, ivy, steps):
    assert _refused(model, ivy, b"hello\n", "texts.txt") == (
        "text input needs a model with a tokenizer: version 1 of 'demo' has no tokenizer.json; send .npz or .jsonl"
    )


def test_an_unknown_output_is_refused(model, ivy, steps):
    with pytest.raises(InvalidInput, match="the model has no output 'z'; its outputs are y"):
        submit(model, ivy, npz_bytes(x=rows_x(2)), outputs=["z"])


# --- input_url -------------------------------------------------------------------------------------------


def test_an_input_named_by_its_key_in_the_local_store(model, ivy, steps):
    data = npz_bytes(x=rows_x(3))
    get_storage().write("datasets/batch.npz", io.BytesIO(data))
    job = submit(model, ivy, None, input_url="datasets/batch.npz")
    assert (job.input_key, job.rows, job.input_bytes) == ("datasets/batch.npz", 3, len(data))
    services.job_prepare(job.pk)
    assert InferenceJobChunk.objects.filter(job=job).count() == 1


def test_an_input_named_by_its_s3_url_in_the_configured_bucket(s3_settings, model, ivy, steps):
    data = npz_bytes(x=rows_x(3))
    get_storage().write("datasets/batch.npz", io.BytesIO(data))
    bucket = s3_settings.STORAGE.bucket
    job = submit(model, ivy, None, input_url=f"s3://{bucket}/pfx/datasets/batch.npz")
    assert (job.input_key, job.rows) == ("datasets/batch.npz", 3)
    with pytest.raises(InvalidInput, match="bucket 'elsewhere' is not the configured store's"):
        submit(model, ivy, None, input_url="s3://elsewhere/pfx/datasets/batch.npz")
    with pytest.raises(InvalidInput, match="outside the store's prefix 'pfx/'"):
        submit(model, ivy, None, input_url=f"s3://{bucket}/datasets/batch.npz")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("/etc/passwd.npz", "input_url: name a key in the configured store, not an absolute path"),
        ("datasets/../secrets.npz", "input_url: 'datasets/../secrets.npz' has an empty, '.' or '..' part"),
        ("s3://other-bucket/x.npz", "input_url: bucket 'other-bucket' is not the configured store's"),
        ("file:///etc/x.npz", "input_url: file:// is not the configured store"),
    ],
)
def test_an_input_url_outside_the_store_is_refused(model, ivy, steps, url, message):
    with pytest.raises(InvalidInput) as caught:
        submit(model, ivy, None, input_url=url)
    assert caught.value.message.startswith(message)


def test_an_input_url_naming_nothing_is_not_found(model, ivy, steps):
    with pytest.raises(NotFound, match=r"input_url: the store holds nothing at 'datasets/missing\.npz'"):
        submit(model, ivy, None, input_url="datasets/missing.npz")


# --- Limits ----------------------------------------------------------------------------------------------


def test_rows_past_the_limit_are_refused_naming_the_setting(settings, model, ivy, steps):
    settings.INFERENCE_JOB_MAX_ROWS = 5
    with pytest.raises(PayloadTooLarge) as caught:
        submit(model, ivy, npz_bytes(x=rows_x(6)))
    assert caught.value.message == "the job has 6 rows; MODELYARD_INFERENCE_JOB_MAX_ROWS allows 5"
    assert not list(get_storage().list("inference-jobs/"))
    submit(model, ivy, npz_bytes(x=rows_x(5)))


class Endless:
    """A client that never stops sending: the byte limit must stop it, not its end."""

    def __init__(self) -> None:
        self.sent = 0

    def read(self, n: int = -1) -> bytes:
        n = 65536 if n is None or n < 0 else n
        self.sent += n
        return b"\0" * n


@pytest.mark.parametrize("store", ["local", "s3"])
def test_bytes_past_the_limit_are_refused_while_streaming(request, settings, store, model, ivy, steps):
    if store == "s3":
        request.getfixturevalue("s3_settings")
    settings.INFERENCE_JOB_MAX_BYTES = 1000
    stream = Endless()
    with pytest.raises(PayloadTooLarge) as caught:
        services.job_submit(
            model=model,
            ref="1",
            fmt=None,
            filename="big.npz",
            stream=stream,  # type: ignore[arg-type]
            input_url="",
            outputs=[],
            result_format="",
            **_who(ivy),
        )
    assert caught.value.message == "the input is larger than 1000 bytes; MODELYARD_INFERENCE_JOB_MAX_BYTES allows 1000"
    assert stream.sent < 64 * 1024 * 1024  # refused as it streamed, not after
    assert not list(get_storage().list("inference-jobs/"))
    assert not InferenceJob.objects.exists()


def test_a_stored_input_past_the_byte_limit_is_refused(settings, model, ivy, steps):
    settings.INFERENCE_JOB_MAX_BYTES = 100
    data = npz_bytes(x=rows_x(10))
    get_storage().write("datasets/big.npz", io.BytesIO(data))
    with pytest.raises(PayloadTooLarge) as caught:
        submit(model, ivy, None, input_url="datasets/big.npz")
    assert caught.value.message == f"the input has {len(data)} bytes; MODELYARD_INFERENCE_JOB_MAX_BYTES allows 100"


def test_jobs_queued_per_token_past_the_limit_are_refused(settings, model, ivy, steps):
    settings.INFERENCE_JOB_MAX_QUEUED_PER_TOKEN = 1
    first = submit(model, ivy, npz_bytes(x=rows_x(2)))
    prefix = ApiToken.objects.get(user__username="ivy").prefix
    with pytest.raises(QueueFull) as caught:
        submit(model, ivy, npz_bytes(x=rows_x(2)))
    assert caught.value.message == (
        f"token {prefix} has 1 job queued or running; MODELYARD_INFERENCE_JOB_MAX_QUEUED_PER_TOKEN allows 1"
    )
    assert len(list(get_storage().list("inference-jobs/"))) == 1  # the first job's input only
    # Another token is counted apart; an ended job counts no more.
    submit(model, make_person("ian", Role.INFERENCE), npz_bytes(x=rows_x(2)))
    services.job_cancel(first, actor=_who(ivy)["actor"])
    submit(model, ivy, npz_bytes(x=rows_x(2)))


def test_jobs_queued_in_all_past_the_limit_are_refused(settings, model, ivy, steps):
    settings.INFERENCE_JOB_MAX_QUEUED = 2
    submit(model, ivy, npz_bytes(x=rows_x(2)))
    body = v2_line(rows_x(1))
    services.request_submit(model=model, ref="1", body=body, **_who(ivy))
    with pytest.raises(QueueFull) as caught:
        submit(model, make_person("ian", Role.INFERENCE), npz_bytes(x=rows_x(2)))
    assert caught.value.message == "2 jobs queued or running in all; MODELYARD_INFERENCE_JOB_MAX_QUEUED allows 2"


# --- Claims and leases -------------------------------------------------------------------------------------


def _prepared(model: RegisteredModel, person: Person, rows: int) -> InferenceJob:
    job = submit(model, person, npz_bytes(x=rows_x(rows)))
    assert services.job_prepare(job.pk) == "prepared"
    return job


def test_each_chunk_is_claimed_once(settings, model, ivy, steps):
    settings.INFERENCE_JOB_CHUNK_ROWS = 2
    job = _prepared(model, ivy, 5)
    version_id = job.version_id
    assert serving.job_chunk_claim(worker_id="w1", version_ids=[version_id + 1000]) is None  # not its version
    claimed = [serving.job_chunk_claim(worker_id=f"w{n}", version_ids=[version_id]) for n in range(4)]
    assert claimed[3] is None
    chunks = [chunk for chunk in claimed if chunk is not None]
    assert [(c.start, c.stop, c.attempt) for c in chunks] == [(0, 2, 1), (2, 4, 1), (4, 5, 1)]
    assert len({chunk.chunk_id for chunk in chunks}) == 3
    first = chunks[0]
    assert (first.job_id, first.kind, first.format, first.model, first.version) == (
        job.public_id,
        "batch",
        "npz",
        "demo",
        1,
    )
    assert (first.outputs, dict(first.parameters), first.lease_seconds) == (
        (),
        {},
        settings.INFERENCE_JOB_LEASE_SECONDS,
    )
    job.refresh_from_db()
    assert job.state == "running" and job.started_at is not None
    rows = InferenceJobChunk.objects.filter(job=job).order_by("index")
    assert [(c.state, c.worker_id, c.attempts) for c in rows] == [
        ("running", "w0", 1),
        ("running", "w1", 1),
        ("running", "w2", 1),
    ]


def test_progress_renews_the_lease_of_its_own_worker_only(model, ivy, steps):
    job = _prepared(model, ivy, 2)
    chunk = serving.job_chunk_claim(worker_id="w1", version_ids=[job.version_id])
    assert chunk is not None
    lapse(chunk.chunk_id)
    assert serving.job_chunk_progress(chunk.chunk_id, worker_id="w1") is True
    assert InferenceJobChunk.objects.get(pk=chunk.chunk_id).lease_until > timezone.now()
    assert serving.job_chunk_progress(chunk.chunk_id, worker_id="w2") is False


def test_a_lapsed_lease_is_claimed_again_as_attempt_2_and_fails_the_job_past_max_attempts(settings, model, ivy, steps):
    settings.INFERENCE_JOB_MAX_ATTEMPTS = 2
    job = _prepared(model, ivy, 3)
    first = serving.job_chunk_claim(worker_id="w1", version_ids=[job.version_id])
    assert first is not None and first.attempt == 1
    assert serving.job_chunk_claim(worker_id="w2", version_ids=[job.version_id]) is None  # leased to w1
    lapse(first.chunk_id)
    again = serving.job_chunk_claim(worker_id="w2", version_ids=[job.version_id])
    assert again is not None
    assert (again.chunk_id, again.attempt) == (first.chunk_id, 2)
    # w1 comes back too late: the chunk is w2's now.
    assert serving.job_chunk_progress(first.chunk_id, worker_id="w1") is False
    serving.job_chunk_done(first.chunk_id, worker_id="w1", rows=3)
    assert InferenceJob.objects.get(pk=job.pk).rows_done == 0

    lapse(again.chunk_id)
    assert serving.job_chunk_claim(worker_id="w3", version_ids=[job.version_id]) is None
    job.refresh_from_db()
    chunk = InferenceJobChunk.objects.get(pk=first.chunk_id)
    assert (job.state, chunk.state) == ("failed", "failed")
    assert job.errors == [
        "rows [0, 3) were lost 2 times: the inference process running them stopped renewing its lease "
        "(MODELYARD_INFERENCE_JOB_MAX_ATTEMPTS allows 2 attempts)"
    ]
    assert job.finished_at is not None and job.expires_at is not None
    event = AuditEvent.objects.get(action="inference_job.finish")
    assert (event.actor, event.target, event.after["state"]) == ("system", job.public_id, "failed")


def test_a_failed_chunk_is_retried_then_fails_its_job(settings, model, ivy, steps):
    settings.INFERENCE_JOB_MAX_ATTEMPTS = 2
    job = _prepared(model, ivy, 2)
    chunk = serving.job_chunk_claim(worker_id="w1", version_ids=[job.version_id])
    assert chunk is not None
    serving.job_chunk_failed(chunk.chunk_id, worker_id="w1", error="out of memory", retry=True)
    assert InferenceJobChunk.objects.get(pk=chunk.chunk_id).state == JobStatus.PENDING
    again = serving.job_chunk_claim(worker_id="w2", version_ids=[job.version_id])
    assert again is not None and again.attempt == 2
    serving.job_chunk_failed(again.chunk_id, worker_id="w2", error="out of memory", retry=True)
    job.refresh_from_db()
    assert job.state == "failed"
    assert job.errors == ["out of memory (rows [0, 2) failed 2 times; MODELYARD_INFERENCE_JOB_MAX_ATTEMPTS allows 2)"]


def test_cancel_stops_the_claims_and_the_running_chunks(settings, model, ivy, steps):
    settings.INFERENCE_JOB_CHUNK_ROWS = 1
    job = _prepared(model, ivy, 3)
    running = serving.job_chunk_claim(worker_id="w1", version_ids=[job.version_id])
    assert running is not None
    cancelled = services.job_cancel(job, actor=_who(ivy)["actor"])
    assert cancelled.state == "cancelled" and cancelled.finished_at is not None
    assert serving.job_chunk_claim(worker_id="w2", version_ids=[job.version_id]) is None
    assert serving.job_chunk_progress(running.chunk_id, worker_id="w1") is False
    with pytest.raises(
        Conflict, match=f"job {job.public_id} is cancelled; only a queued or running job can be cancelled"
    ):
        services.job_cancel(job, actor=_who(ivy)["actor"])
    event = AuditEvent.objects.get(action="inference_job.cancel")
    assert (event.actor, event.target, event.after["state"]) == ("ivy", job.public_id, "cancelled")


# --- Finishing --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["local", "s3"])
def test_finish_assembles_an_npz_result_row_for_row(request, settings, store, model, ivy, steps):
    if store == "s3":
        request.getfixturevalue("s3_settings")
    settings.INFERENCE_JOB_CHUNK_ROWS = 3
    x = rows_x(8)
    job = _prepared(model, ivy, 8)
    while (chunk := serving.job_chunk_claim(worker_id="w1", version_ids=[job.version_id])) is not None:
        assert steps["finish"] == []
        run_chunk(chunk, worker_id="w1")
    assert steps["finish"] == [job.pk]
    job.refresh_from_db()
    assert (job.state, job.rows_done) == ("running", 8)

    assert services.job_finish(job.pk) == "succeeded"
    job.refresh_from_db()
    assert job.state == "succeeded" and job.result_key == f"inference-jobs/{job.public_id}/result.npz"
    stream, content_type, filename, size = services.job_result(job)
    data = stream.read()
    stream.close()
    assert (content_type, filename, size) == ("application/zip", f"{job.public_id}-result.npz", len(data))
    result = load_npz(data)
    assert list(result) == ["y"]
    np.testing.assert_array_equal(result["y"], x + 1)
    assert zipfile.ZipFile(io.BytesIO(data)).namelist() == ["y.npy"]
    event = AuditEvent.objects.get(action="inference_job.finish")
    assert event.after["state"] == "succeeded" and event.after["rows_done"] == 8
    assert services.job_finish(job.pk) == "skipped"  # delivered twice


def test_finish_pads_outputs_whose_later_dimensions_differ_between_chunks(settings, model, ivy, steps):
    settings.INFERENCE_JOB_CHUNK_ROWS = 2
    job = _prepared(model, ivy, 4)
    outputs = [np.ones((2, 3), dtype=np.float32), np.full((2, 5), 2, dtype=np.float32)]
    for output in outputs:
        chunk = serving.job_chunk_claim(worker_id="w", version_ids=[job.version_id])
        assert chunk is not None
        get_storage().write(chunk.output_key, io.BytesIO(npz_bytes(tokens=output)))
        serving.job_chunk_done(chunk.chunk_id, worker_id="w", rows=2)
    services.job_finish(job.pk)
    job.refresh_from_db()
    result = load_npz(services.job_result(job)[0].read())["tokens"]
    expected = np.zeros((4, 5), dtype=np.float32)
    expected[:2, :3], expected[2:] = 1, 2
    np.testing.assert_array_equal(result, expected)


def test_finish_concatenates_json_lines_in_order(settings, model, ivy, steps):
    settings.INFERENCE_JOB_CHUNK_ROWS = 2
    job = submit(model, ivy, b"\n".join(v2_line(rows_x(1) + i) for i in range(3)), "in.jsonl")
    services.job_prepare(job.pk)
    answers = []
    while (chunk := serving.job_chunk_claim(worker_id="w", version_ids=[job.version_id])) is not None:
        lines = stored(chunk.input_key).splitlines()
        out = [json.dumps({"model_name": "demo", "outputs": [{"row": chunk.start + i}]}) for i in range(len(lines))]
        answers += out
        get_storage().write(chunk.output_key, io.BytesIO("\n".join(out).encode()))  # no final line end
        serving.job_chunk_done(chunk.chunk_id, worker_id="w", rows=len(lines))
    services.job_finish(job.pk)
    job.refresh_from_db()
    stream, content_type, filename, _ = services.job_result(job)
    assert (content_type, filename) == ("application/jsonl", f"{job.public_id}-result.jsonl")
    assert stream.read().decode().splitlines() == answers


def test_finish_writes_one_json_line_per_text(settings, owner, ivy, steps):
    model = upload(owner, "texty", [("model.onnx", text_model_bytes()), ("tokenizer.json", tiny_tokenizer_json())])
    settings.INFERENCE_JOB_CHUNK_ROWS = 2
    job = submit(model, ivy, b"a\nb\nc\n", "texts.txt", outputs=["sentence_embedding"])
    services.job_prepare(job.pk)
    embeddings = np.arange(12, dtype=np.float32).reshape(3, 4)
    while (chunk := serving.job_chunk_claim(worker_id="w", version_ids=[job.version_id])) is not None:
        assert chunk.outputs == ("sentence_embedding",)
        texts = load_npz(stored(chunk.input_key))["text"]
        get_storage().write(
            chunk.output_key, io.BytesIO(npz_bytes(sentence_embedding=embeddings[chunk.start : chunk.stop]))
        )
        serving.job_chunk_done(chunk.chunk_id, worker_id="w", rows=len(texts))
    services.job_finish(job.pk)
    job.refresh_from_db()
    lines = [json.loads(line) for line in services.job_result(job)[0].read().splitlines()]
    assert lines == [
        {"outputs": [{"name": "sentence_embedding", "datatype": "FP32", "shape": [1, 4], "data": row.tolist()}]}
        for row in embeddings
    ]


def test_a_result_is_refused_until_the_job_succeeded(model, ivy, steps):
    job = submit(model, ivy, npz_bytes(x=rows_x(2)))
    with pytest.raises(Conflict, match=f"job {job.public_id} is queued; its result is there once it has succeeded"):
        services.job_result(job)


# --- Desired state -------------------------------------------------------------------------------------------


def test_desired_state_keeps_a_jobs_version_after_its_alias_moved(owner, model, ivy, steps):
    upload_versions(owner, [2.0])
    assert set_alias(owner, "staging", 1).status_code == 200
    job = submit(model, ivy, npz_bytes(x=rows_x(2)), ref="staging")
    assert set_alias(owner, "staging", 2).status_code == 200
    state = serving.desired_state()
    assert job.version_id in state.versions
    spec = state.versions[job.version_id]
    assert (spec.model, spec.version, spec.mirror_only) == ("demo", 1, False)
    assert all(job.version_id not in aliases.values() for aliases in state.routes.values())
    services.job_cancel(job, actor=_who(ivy)["actor"])
    assert job.version_id not in serving.desired_state().versions


# --- Infer-async requests -------------------------------------------------------------------------------------


def test_an_async_request_is_answered_from_its_chunk_then_expires(settings, model, ivy, steps):
    body = v2_line(rows_x(1))
    job = services.request_submit(model=model, ref="1", body=body, **_who(ivy))
    assert (job.kind, job.format, job.rows) == ("request", "v2", 1)
    assert steps["prepare"] == []  # nothing to split
    assert services.request_answer(job) == (202, json.dumps({"id": job.public_id, "state": "queued"}).encode())
    chunk = serving.job_chunk_claim(worker_id="w", version_ids=[job.version_id])
    assert chunk is not None and (chunk.kind, chunk.format) == ("request", "v2")
    assert stored(chunk.input_key) == body
    answer = json.dumps({"model_name": "demo", "model_version": "1", "outputs": []}).encode()
    get_storage().write(chunk.output_key, io.BytesIO(answer))
    serving.job_chunk_done(chunk.chunk_id, worker_id="w", rows=1)
    job.refresh_from_db()
    assert job.state == "succeeded"
    assert services.request_answer(job) == (200, answer)
    ttl = job.expires_at - job.finished_at
    assert ttl == timedelta(seconds=settings.ASYNC_RESULT_TTL_SECONDS)

    InferenceJob.objects.filter(pk=job.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    job.refresh_from_db()
    with pytest.raises(NotFound, match="has expired"):
        services.request_answer(job)
    swept = services.jobs_sweep()
    assert swept.expired == [job.public_id]
    assert not InferenceJob.objects.filter(pk=job.pk).exists()
    assert not list(get_storage().list(f"inference-jobs/{job.public_id}/"))


def test_an_async_request_the_model_refuses_answers_its_status(model, ivy, steps):
    job = services.request_submit(model=model, ref="1", body=v2_line(rows_x(1)), **_who(ivy))
    chunk = serving.job_chunk_claim(worker_id="w", version_ids=[job.version_id])
    assert chunk is not None
    serving.job_chunk_failed(chunk.chunk_id, worker_id="w", error="input 'x' has 3 values", retry=False, status=400)
    job.refresh_from_db()
    assert job.state == "failed"
    status, body = services.request_answer(job)
    assert (status, json.loads(body)["error"]) == (400, "input 'x' has 3 values")


def test_an_async_request_that_is_not_a_v2_body_is_refused(model, ivy, steps):
    body = json.dumps({"inputs": [{"name": "y", "datatype": "FP32", "shape": [1], "data": [1]}]}).encode()
    with pytest.raises(InvalidInput) as caught:
        services.request_submit(model=model, ref="1", body=body, **_who(ivy))
    assert caught.value.message == "the request is not a v2 request body: the model has no input 'y'; its inputs are x"
    assert not InferenceJob.objects.exists()
    assert not list(get_storage().list("inference-jobs/"))


# --- The sweep ---------------------------------------------------------------------------------------------------


def test_the_sweep_deletes_a_batch_result_past_its_ttl(settings, model, ivy, steps):
    job = _prepared(model, ivy, 2)
    chunk = serving.job_chunk_claim(worker_id="w", version_ids=[job.version_id])
    assert chunk is not None
    run_chunk(chunk, worker_id="w")
    services.job_finish(job.pk)
    job.refresh_from_db()
    assert job.expires_at - job.finished_at == timedelta(seconds=settings.INFERENCE_JOB_RESULT_TTL_SECONDS)
    assert services.jobs_sweep().expired == []
    InferenceJob.objects.filter(pk=job.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert services.jobs_sweep().expired == [job.public_id]
    job.refresh_from_db()
    assert (job.state, job.result_key, job.expires_at) == ("succeeded", "", None)
    assert not list(get_storage().list(f"inference-jobs/{job.public_id}/"))
    with pytest.raises(Gone, match="MODELYARD_INFERENCE_JOB_RESULT_TTL_SECONDS"):
        services.job_result(job)


def test_the_sweep_queues_a_lost_preparation_and_a_lost_finish_again(model, ivy, steps):
    lost_prepare = submit(model, ivy, npz_bytes(x=rows_x(2)))
    lost_finish = _prepared(model, ivy, 2)
    chunk = serving.job_chunk_claim(worker_id="w", version_ids=[lost_finish.version_id])
    assert chunk is not None
    run_chunk(chunk, worker_id="w")
    steps["prepare"].clear()
    steps["finish"].clear()
    assert services.jobs_sweep().prepare == []  # too recent: its task may still be on its way
    long_ago = timezone.now() - timedelta(minutes=5)
    InferenceJob.objects.filter(pk=lost_prepare.pk).update(created_at=long_ago)
    InferenceJobChunk.objects.filter(job=lost_finish).update(finished_at=long_ago)
    swept = services.jobs_sweep()
    assert (swept.prepare, swept.finish) == ([lost_prepare.pk], [lost_finish.pk])
    assert (steps["prepare"], steps["finish"]) == ([lost_prepare.pk], [lost_finish.pk])
    # A step taken by a task is not queued again until its lease lapses.
    InferenceJob.objects.filter(pk=lost_prepare.pk).update(expires_at=timezone.now() + timedelta(minutes=1))
    assert services.jobs_sweep().prepare == []
    assert services.job_finish(lost_finish.pk) == "succeeded"


# --- Reading ---------------------------------------------------------------------------------------------------


def test_visible_jobs_are_ones_own_and_everyones_for_an_auditor(model, ivy, steps):
    mine = submit(model, ivy, npz_bytes(x=rows_x(2)))
    other = submit(model, make_person("ian", Role.INFERENCE), npz_bytes(x=rows_x(2)))
    make_person("aud", Role.AUDITOR)
    users = get_user_model().objects
    assert list(services.visible_jobs(users.get(username="ivy"))) == [mine]
    assert list(services.visible_jobs(users.get(username="aud"))) == [other, mine]


def test_the_sweep_fails_a_job_whose_version_was_deleted(model, ivy, steps):
    job = _prepared(model, ivy, 2)
    ModelVersion.objects.filter(pk=job.version_id).update(deleted_at=timezone.now())
    assert (
        serving.job_chunk_claim(worker_id="w", version_ids=[job.version_id]) is not None
    )  # the runner decides nothing
    assert services.jobs_sweep().orphaned == [job.public_id]
    job.refresh_from_db()
    assert job.state == "failed"
    assert job.errors == ["version 1 is no longer ready (deleted, or failed again); the job cannot run"]
    assert job.version_id not in serving.desired_state().versions


def test_a_result_format_the_input_does_not_offer_is_refused(model, ivy, steps):
    with pytest.raises(InvalidInput) as caught:
        submit(model, ivy, npz_bytes(x=rows_x(2)), result_format="jsonl")
    assert caught.value.message == "result_format 'jsonl' is not offered for npz input; use npz"


def test_the_format_named_wins_over_the_suffix(model, ivy, steps):
    job = submit(model, ivy, v2_line(rows_x(1)), "requests.data", fmt="jsonl")
    assert (job.format, job.rows, job.input_key.rsplit("/", 1)[-1]) == ("jsonl", 1, "input.jsonl")
    with pytest.raises(InvalidInput, match=r"^unknown input format 'csv': use npz, jsonl or text$"):
        submit(model, ivy, b"1", "x.csv", fmt="csv")


def test_an_oss_url_of_the_configured_bucket_names_a_key(s3_settings):
    bucket = s3_settings.STORAGE.bucket
    assert services.store_key_of(f"oss://{bucket}/pfx/in/a.npz") == "in/a.npz"
    with pytest.raises(InvalidInput, match="holds the jobs' own files"):
        services.store_key_of(f"s3://{bucket}/pfx/inference-jobs/abc/input.npz")
