"""The web UI's inference jobs: the list, a job's page (its progress, reloading while it runs, the result's link,
Cancel) and the submit form, whose input streams to the store after its CSRF token and fields are checked.

The jobs run by hand through the registry's steps and the inference processes' seam
(``tests/support/jobs_by_hand.py``); ``tests/e2e/test_jobs_browser.py`` does it all in Chromium.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from registry.models import AuditEvent, InferenceJob, Role
from storage import get_storage
from tests.support.jobs_by_hand import run_job
from tests.support.people import Person, login_person
from tests.support.registry import upload_versions

pytestmark = pytest.mark.django_db

ROWS = np.arange(8, dtype=np.float32).reshape(2, 4)


def npz() -> SimpleUploadedFile:
    out = io.BytesIO()
    np.savez(out, x=ROWS)
    return SimpleUploadedFile("rows.npz", out.getvalue())


@pytest.fixture
def ivy(db: None) -> Person:
    """Signed in, with the inference role."""
    return login_person("ivy", Role.INFERENCE)


@pytest.fixture
def demo(owner: Person, registered: str) -> str:
    upload_versions(owner, [1.0])
    return registered


def submit(client: Client, **fields: Any) -> Any:
    """The form as a browser sends it: its CSRF token and fields first, the file last."""
    client.get("/ui/jobs/new")  # sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    return client.post("/ui/jobs/new", {"csrfmiddlewaretoken": token, **fields, "input": npz()})


def test_a_job_submitted_from_the_form_is_shown_with_its_progress(ivy, demo):
    response = submit(ivy.client, model="demo", alias="", version="1", format="", outputs="", result_format="")
    job = InferenceJob.objects.get()
    assert (response.status_code, response["Location"]) == (302, f"/ui/jobs/{job.public_id}")
    assert (job.ref, job.format, job.rows, job.created_by.username, job.token) == ("1", "npz", 2, "ivy", None)
    page = ivy.client.get(response["Location"]).content.decode()
    assert f"Job {job.public_id} submitted: version 1 of demo." in page
    assert 'data-refresh="2"' in page  # it reloads itself while the job waits
    assert '<progress value="0" max="2"' in page and "0 of 2 rows (0%)" in page
    assert 'id="job-cancel"' in page and 'id="job-result"' not in page

    run_job(job.public_id)
    page = ivy.client.get(f"/ui/jobs/{job.public_id}").content.decode()
    assert "data-refresh" not in page and "2 of 2 rows (100%)" in page
    assert f'href="/api/v1/inference-jobs/{job.public_id}/result"' in page and 'id="job-cancel"' not in page
    download = ivy.client.get(f"/api/v1/inference-jobs/{job.public_id}/result")  # the session reads it
    with np.load(io.BytesIO(b"".join(download.streaming_content)), allow_pickle=False) as result:
        np.testing.assert_array_equal(result["y"], ROWS + 1)


def test_the_list_shows_your_own_jobs_and_the_form_to_those_who_may_submit(ivy, demo, mia):
    submit(ivy.client, model="demo", version="1")
    job = InferenceJob.objects.get()
    listed = ivy.client.get("/ui/jobs").content.decode()
    assert f'data-job="{job.public_id}"' in listed and 'id="new-job"' in listed and 'data-refresh="2"' in listed
    assert '<a href="/ui/jobs" aria-current="page">Jobs</a>' in listed
    theirs = mia.client.get("/ui/jobs").content.decode()
    assert job.public_id not in theirs and 'id="new-job"' not in theirs
    assert "Inference jobs need the inference role." in mia.client.get("/ui/jobs/new").content.decode()
    assert mia.client.get(f"/ui/jobs/{job.public_id}").status_code == 404
    assert ivy.client.get("/ui/jobs?state=succeeded").content.decode().count("data-job=") == 0


def test_submitting_without_the_inference_role_is_refused_and_audited(mia, demo):
    response = submit(mia.client, model="demo", version="1")
    assert response.status_code == 403
    assert "submitting an inference job needs the inference role" in response.content.decode()
    assert AuditEvent.objects.filter(action="access.denied", actor="mia").exists()
    assert not InferenceJob.objects.exists() and list(get_storage().list("inference-jobs/")) == []


def test_a_form_without_its_csrf_token_stores_nothing(ivy, demo):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(get_user_model().objects.get(username="ivy"))
    response = browser.post("/ui/jobs/new", {"model": "demo", "version": "1", "input": npz()})
    assert response.status_code == 403
    assert not InferenceJob.objects.exists() and list(get_storage().list("inference-jobs/")) == []


def test_a_refused_submission_shows_the_form_again_with_the_reason(ivy, demo):
    response = submit(ivy.client, model="demo", alias="gone", version="")
    assert response.status_code == 404
    page = response.content.decode()
    assert "model &#x27;demo&#x27; has no alias &#x27;gone&#x27;" in page and 'value="gone"' in page
    assert not InferenceJob.objects.exists()


def test_cancelling_from_the_page(ivy, demo):
    submit(ivy.client, model="demo", version="1")
    job = InferenceJob.objects.get()
    response = ivy.client.post(f"/ui/jobs/{job.public_id}/cancel")
    assert (response.status_code, response["Location"]) == (302, f"/ui/jobs/{job.public_id}")
    job.refresh_from_db()
    assert job.state == "cancelled"
    again = ivy.client.post(f"/ui/jobs/{job.public_id}/cancel")
    assert again.status_code == 409
    assert f"job {job.public_id} is cancelled; only a queued or running job can be cancelled" in again.content.decode()
