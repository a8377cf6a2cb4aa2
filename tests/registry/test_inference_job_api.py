"""Asynchronous inference over the REST API: submitting a job (an uploaded input, or one named in the store),
reading and listing jobs, cancelling, downloading the result; ``infer-async`` requests and their answers.

The jobs run to their end through the registry's own steps and the inference processes' seam, on a real
ONNX Runtime session (``tests/support/jobs_by_hand.py``). Every model is ``y = x + bias``.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from registry.models import AuditEvent, InferenceJob, Role
from storage import get_storage
from tests.support.jobs_by_hand import refuse_request, run_chunks, run_job
from tests.support.people import Person, make_person
from tests.support.registry import create_model, promote, set_alias, upload_versions

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/inference-jobs"
ROWS = np.arange(12, dtype=np.float32).reshape(3, 4)
ROLE_REFUSAL = "asynchronous inference needs the inference or admin role"


@pytest.fixture
def runner(db: None) -> Person:
    """A pipeline with the inference role: submits jobs."""
    return make_person("pipeline", Role.INFERENCE)


@pytest.fixture
def demo(owner: Person, registered: str) -> str:
    """demo v1 (y = x + 1) and v2 (y = x + 2), both ready; 'staging' points to v2."""
    upload_versions(owner, [1.0, 2.0])
    assert set_alias(owner, "staging", 2).status_code == 200
    return registered


def npz_bytes(**arrays: Any) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


def submit(person: Person, fields: dict[str, Any], data: bytes | None = None, name: str = "rows.npz") -> Any:
    """A multipart submission: the fields first, then the ``input`` part, as the CLI sends them."""
    parts: dict[str, Any] = dict(fields)
    if data is not None:
        parts["input"] = SimpleUploadedFile(name, data, content_type="application/octet-stream")
    return person.client.post(JOBS, parts, HTTP_AUTHORIZATION=f"Bearer {person.token}")  # multipart, in this order


def error_of(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["error"]


def stored_keys() -> list[str]:
    return sorted(item.key for item in get_storage().list("inference-jobs/"))


# --- Submitting ------------------------------------------------------------------------------------------


def test_submitting_an_npz_answers_202_with_the_queued_job_and_stores_the_input(runner, demo):
    data = npz_bytes(x=ROWS)
    response = submit(runner, {"model": "demo", "alias": "staging"}, data)
    assert response.status_code == 202, response.content
    answer = response.json()
    job = InferenceJob.objects.get(public_id=answer["id"])
    assert {key: answer[key] for key in ("model", "version", "ref", "format", "state", "rows", "rows_done")} == {
        "model": "demo",
        "version": 2,
        "ref": "staging",
        "format": "npz",
        "state": "queued",
        "rows": 3,
        "rows_done": 0,
    }
    assert (answer["errors"], answer["created_by"], answer["result"], answer["kind"]) == ([], "pipeline", None, "batch")
    assert answer["input_bytes"] == len(data) == job.input_bytes
    with get_storage().open(job.input_key) as stream:
        assert stream.read() == data
    assert job.input_key == f"inference-jobs/{job.public_id}/input.npz"
    event = AuditEvent.objects.get(action="inference_job.submit")
    assert (event.actor, event.target, event.model_name) == ("pipeline", job.public_id, "demo")


def test_without_alias_or_version_a_job_runs_on_production(runner, owner, approver, demo):
    promote(owner, approver, 1)
    response = submit(runner, {"model": "demo"}, npz_bytes(x=ROWS))
    assert response.status_code == 202, response.content
    assert (response.json()["ref"], response.json()["version"]) == ("production", 1)


def test_a_job_by_version_number_keeps_that_version(runner, demo):
    response = submit(runner, {"model": "demo", "version": "1", "alias": ""}, npz_bytes(x=ROWS))
    assert response.status_code == 202, response.content
    assert (response.json()["ref"], response.json()["version"]) == ("1", 1)


def test_a_job_runs_to_a_result_that_downloads_streamed(runner, demo):
    job_id = submit(runner, {"model": "demo", "alias": "staging"}, npz_bytes(x=ROWS)).json()["id"]
    run_job(job_id)
    detail = runner.get(f"{JOBS}/{job_id}").json()
    assert (detail["state"], detail["rows"], detail["rows_done"]) == ("succeeded", 3, 3)
    assert detail["result"] == f"{JOBS}/{job_id}/result"
    assert detail["started_at"] and detail["finished_at"]
    response = runner.get(detail["result"])
    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    assert response["Content-Length"] == str(len(body)) == str(detail["result_bytes"])
    assert response["Content-Disposition"] == f'attachment; filename="{job_id}-result.npz"'
    with np.load(io.BytesIO(body), allow_pickle=False) as result:
        np.testing.assert_array_equal(result["y"], ROWS + 2)
    assert f"inference-jobs/{job_id}/result.npz" in stored_keys()


def test_json_lines_named_in_the_store_run_to_v2_answers(runner, demo):
    lines = [
        {"id": f"r{i}", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": row.tolist()}]}
        for i, row in enumerate(ROWS)
    ]
    get_storage().write("inputs/rows.jsonl", io.BytesIO("".join(json.dumps(line) + "\n" for line in lines).encode()))
    response = runner.post(JOBS, {"model": "demo", "version": 1, "input_url": "inputs/rows.jsonl"})
    assert response.status_code == 202, response.content
    assert (response.json()["format"], response.json()["rows"]) == ("jsonl", 3)
    run_job(response.json()["id"])
    result = runner.get(f"{JOBS}/{response.json()['id']}/result")
    answers = [json.loads(line) for line in b"".join(result.streaming_content).decode().splitlines()]
    assert [answer["id"] for answer in answers] == ["r0", "r1", "r2"]
    assert answers[1]["outputs"][0]["data"] == (ROWS[1] + 1).tolist()
    assert answers[0]["model_name"] == "demo" and answers[0]["model_version"] == "1"


def test_submitting_needs_the_inference_role(owner, demo):
    response = submit(owner, {"model": "demo", "alias": "staging"}, npz_bytes(x=ROWS))
    assert error_of(response) == (403, ROLE_REFUSAL)
    assert not InferenceJob.objects.exists() and stored_keys() == []


def test_a_token_limited_to_other_models_cannot_submit_or_read(runner, demo):
    from registry.access import services as access
    from registry.audit.chain import SYSTEM

    job_id = submit(runner, {"model": "demo", "alias": "staging"}, npz_bytes(x=ROWS)).json()["id"]
    _, raw = access.token_create(username="pipeline", model_patterns=["fraud-*"], actor=SYSTEM)
    limited = Person("pipeline", raw, runner.client)
    refusal = "this API token is limited to models matching 'fraud-*'; 'demo' is not one of them"
    assert error_of(submit(limited, {"model": "demo", "alias": "staging"}, npz_bytes(x=ROWS))) == (403, refusal)
    assert error_of(limited.get(f"{JOBS}/{job_id}")) == (403, refusal)
    assert error_of(limited.post(f"{JOBS}/{job_id}/cancel")) == (403, refusal)
    assert limited.get(JOBS).json()["count"] == 0  # the list keeps to the token's models
    assert InferenceJob.objects.count() == 1


def test_fields_sent_after_the_input_are_refused_and_nothing_is_kept(runner, demo):
    body = (
        b'--B\r\nContent-Disposition: form-data; name="model"\r\n\r\ndemo\r\n'
        b'--B\r\nContent-Disposition: form-data; name="version"\r\n\r\n1\r\n'
        b'--B\r\nContent-Disposition: form-data; name="input"; filename="rows.npz"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n" + npz_bytes(x=ROWS) + b"\r\n"
        b'--B\r\nContent-Disposition: form-data; name="outputs"\r\n\r\ny\r\n--B--\r\n'
    )
    response = runner.client.post(
        JOBS, body, content_type="multipart/form-data; boundary=B", HTTP_AUTHORIZATION=f"Bearer {runner.token}"
    )
    assert error_of(response) == (
        400,
        "send 'outputs' before the 'input' file part: the job's fields are read before its input is stored",
    )
    assert not InferenceJob.objects.exists() and stored_keys() == []


@pytest.mark.parametrize(
    ("fields", "data", "expected"),
    [
        (
            {"model": "demo", "alias": "staging", "version": "1"},
            npz_bytes(x=ROWS),
            (400, "give an alias or a version, not both"),
        ),
        ({"model": "nope", "alias": "staging"}, npz_bytes(x=ROWS), (404, "no model named 'nope'")),
        (
            {"model": "demo", "alias": "staging"},
            None,
            (400, "send the input as a multipart 'input' file part, or name it in the store with input_url"),
        ),
        ({"model": "demo", "alias": "gone"}, npz_bytes(x=ROWS), (404, "model 'demo' has no alias 'gone'")),
    ],
    ids=["alias-and-version", "unknown-model", "no-input", "unknown-alias"],
)
def test_bad_submissions_are_refused_with_the_reason(runner, demo, fields, data, expected):
    assert error_of(submit(runner, fields, data)) == expected
    assert not InferenceJob.objects.exists() and stored_keys() == []


def test_a_job_past_the_row_limit_is_refused_naming_the_setting(runner, demo, settings):
    settings.INFERENCE_JOB_MAX_ROWS = 2
    response = submit(runner, {"model": "demo", "alias": "staging"}, npz_bytes(x=ROWS))
    assert response.status_code == 413
    assert response.json()["error"] == "the job has 3 rows; MODELYARD_INFERENCE_JOB_MAX_ROWS allows 2"
    assert not InferenceJob.objects.exists() and stored_keys() == []


def test_a_json_body_must_name_the_input_in_the_store(runner, demo):
    assert error_of(runner.post(JOBS, {"model": "demo"})) == (
        400,
        "send the input as a multipart 'input' file part, or name it in the store with input_url",
    )


# --- Reading, listing, cancelling --------------------------------------------------------------------------


def test_the_list_pages_filters_and_shows_only_your_own_jobs(runner, demo, outsider):
    ids = [submit(runner, {"model": "demo", "alias": "staging"}, npz_bytes(x=ROWS)).json()["id"] for _ in range(3)]
    runner.post(f"{JOBS}/{ids[0]}/cancel")
    page = runner.get(f"{JOBS}?page_size=2").json()
    assert page["count"] == 3 and [job["id"] for job in page["results"]] == ids[::-1][:2] and page["next"]
    assert [job["id"] for job in runner.get(f"{JOBS}?state=cancelled").json()["results"]] == [ids[0]]
    assert runner.get(f"{JOBS}?model=other").json()["count"] == 0
    assert error_of(runner.get(f"{JOBS}?state=lost")) == (
        400,
        "state must be one of queued, running, succeeded, failed, cancelled, not 'lost'",
    )
    # Someone else's jobs are not theirs to see; an admin sees them all.
    assert outsider.get(JOBS).json()["count"] == 0
    assert error_of(outsider.get(f"{JOBS}/{ids[1]}")) == (404, f"no inference job '{ids[1]}'")
    assert make_person("root", Role.ADMIN).get(JOBS).json()["count"] == 3


def test_cancelling_ends_the_job_once(runner, demo, outsider):
    job_id = submit(runner, {"model": "demo", "alias": "staging"}, npz_bytes(x=ROWS)).json()["id"]
    assert error_of(outsider.post(f"{JOBS}/{job_id}/cancel")) == (403, ROLE_REFUSAL)
    response = runner.post(f"{JOBS}/{job_id}/cancel")
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["finished_at"] is not None) == ("cancelled", True)
    assert error_of(runner.post(f"{JOBS}/{job_id}/cancel")) == (
        409,
        f"job {job_id} is cancelled; only a queued or running job can be cancelled",
    )
    assert AuditEvent.objects.filter(action="inference_job.cancel", target=job_id).count() == 1
    assert error_of(runner.get(f"{JOBS}/{job_id}/result")) == (
        409,
        f"job {job_id} is cancelled; its result is there once it has succeeded",
    )


def test_reading_needs_a_signed_in_caller(demo, runner, client):
    assert client.get(JOBS).status_code == 401


# --- infer-async -----------------------------------------------------------------------------------------


def _v2_body() -> dict[str, Any]:
    return {"id": "one", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def test_an_async_request_answers_202_then_the_v2_answer(runner, demo):
    response = runner.post("/api/v1/models/demo/infer-async?alias=staging", _v2_body())
    assert response.status_code == 202, response.content
    request_id = response.json()["id"]
    assert response.json() == {"id": request_id, "state": "queued"}
    assert response["Location"] == f"/api/v1/models/demo/infer-async/{request_id}"
    waiting = runner.get(response["Location"])
    assert (waiting.status_code, waiting.json()) == (202, {"id": request_id, "state": "queued"})
    run_chunks(InferenceJob.objects.get(public_id=request_id))
    answered = runner.get(response["Location"])
    assert answered.status_code == 200
    assert answered.json() == {
        "model_name": "demo",
        "model_version": "2",
        "id": "one",
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 4], "data": [3.0, 4.0, 5.0, 6.0]}],
    }
    assert error_of(runner.get(f"/api/v1/models/other/infer-async/{request_id}")) == (
        404,
        f"model 'other' has no asynchronous request '{request_id}'",
    )


def test_past_the_queued_limits_a_job_or_request_is_told_to_try_later(runner, demo, settings):
    settings.INFERENCE_JOB_MAX_QUEUED_PER_TOKEN = 1
    assert runner.post("/api/v1/models/demo/infer-async?alias=staging", _v2_body()).status_code == 202
    refused = runner.post("/api/v1/models/demo/infer-async?alias=staging", _v2_body())
    assert refused.status_code == 429
    assert refused.json()["error"].endswith(
        "has 1 job queued or running; MODELYARD_INFERENCE_JOB_MAX_QUEUED_PER_TOKEN allows 1"
    )
    settings.INFERENCE_JOB_MAX_QUEUED_PER_TOKEN = 10
    settings.INFERENCE_JOB_MAX_QUEUED = 1
    response = submit(runner, {"model": "demo", "alias": "staging"}, npz_bytes(x=ROWS))
    assert error_of(response) == (
        429,
        "1 job queued or running in all; MODELYARD_INFERENCE_JOB_MAX_QUEUED allows 1",
    )
    assert InferenceJob.objects.count() == 1


def test_a_refused_async_request_answers_the_models_error(runner, demo):
    request_id = runner.post("/api/v1/models/demo/infer-async?version=1", _v2_body()).json()["id"]
    refuse_request(request_id, "input 'x': expected 4 columns")
    assert error_of(runner.get(f"/api/v1/models/demo/infer-async/{request_id}")) == (
        400,
        "input 'x': expected 4 columns",
    )


def test_async_requests_need_the_inference_role_and_a_model_in_scope(owner, runner, demo):
    assert error_of(owner.post("/api/v1/models/demo/infer-async", _v2_body())) == (403, ROLE_REFUSAL)
    assert error_of(runner.post("/api/v1/models/demo/infer-async?version=x", _v2_body())) == (
        400,
        "version must be a whole number, got 'x'",
    )
    assert not InferenceJob.objects.exists()


def test_the_model_must_exist(runner, db):
    create_model(make_person("m", Role.MAINTAINER), "empty")
    assert runner.post("/api/v1/models/none/infer-async", _v2_body()).status_code == 404


# --- An S3 store ----------------------------------------------------------------------------------------------


def test_the_input_streams_to_an_s3_store_and_a_late_field_leaves_nothing_there(s3_settings, runner, demo):
    data = npz_bytes(x=ROWS)
    response = submit(runner, {"model": "demo", "alias": "staging"}, data)
    assert response.status_code == 202, response.content
    job = InferenceJob.objects.get(public_id=response.json()["id"])
    with get_storage().open(job.input_key) as stream:
        assert stream.read() == data
    run_job(job.public_id)
    result = runner.get(f"{JOBS}/{job.public_id}/result")
    with np.load(io.BytesIO(b"".join(result.streaming_content)), allow_pickle=False) as arrays:
        np.testing.assert_array_equal(arrays["y"], ROWS + 2)

    late = submit(
        runner, {"model": "demo", "version": "1", "input": SimpleUploadedFile("rows.npz", data), "format": "npz"}
    )
    assert error_of(late) == (
        400,
        "send 'format' before the 'input' file part: the job's fields are read before its input is stored",
    )
    assert InferenceJob.objects.count() == 1
    assert [key for key in stored_keys() if not key.startswith(f"inference-jobs/{job.public_id}/")] == []
