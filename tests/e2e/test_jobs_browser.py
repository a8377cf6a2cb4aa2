"""Inference jobs in real Chromium, against a real ``modelyard serve --role all`` (``tests/support/ui.py``).

The submit form streams its input through the server's ASGI handler; the server's own inference runtime
runs the chunks; the job's page reloads itself while the job runs, shows the rows done, and links the
result once it succeeded. A job can be cancelled from its page.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import expect

from registry import services
from registry.models import InferenceJob, Role
from registry.uploads import LocalUpload, version_upload
from tests.support.onnx_models import add_model_bytes
from tests.support.ui import PHONE, csp_violations, login, person, shoot

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.usefixtures("shared_storage")]

ROWS = np.arange(4_000, dtype=np.float32).reshape(1_000, 4)


def _model(name: str) -> None:
    """``name`` v1, y = x + 1, validated here through the one upload service."""
    owner = person(f"{name}-owner", Role.MAINTAINER)
    model = services.model_create(name=name, actor=owner)
    version_upload(model=model, source=LocalUpload([("model.onnx", add_model_bytes(bias=1.0))]), actor=owner)


def test_a_job_submitted_in_the_browser_runs_and_its_result_downloads(server, browser, tmp_path: Path):
    _model("adder")
    person("runner", Role.INFERENCE)
    np.savez(tmp_path / "rows.npz", x=ROWS)
    page = login(browser, server.url, "runner")

    page.get_by_role("link", name="Jobs", exact=True).click()
    page.wait_for_url(f"{server.url}/ui/jobs")
    expect(page.locator("#jobs")).to_contain_text("No inference jobs.")
    page.get_by_role("link", name="Submit a job").click()
    page.fill("#id_model", "adder")
    page.fill("#id_version", "1")
    page.set_input_files("#id_input", str(tmp_path / "rows.npz"))
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url(f"{server.url}/ui/jobs/*")
    job_id = page.url.rsplit("/", 1)[-1]
    expect(page.get_by_role("status").first).to_have_text(f"Job {job_id} submitted: version 1 of adder.")

    # The page reloads itself until the job has ended, the progress bar full.
    expect(page.locator("#job-state")).to_have_text("succeeded", timeout=120_000)
    expect(page.locator("#job-progress")).to_contain_text("1000 of 1000 rows (100%)")
    assert page.locator("#job-progress progress").get_attribute("value") == "1000"
    assert page.locator("body").get_attribute("data-refresh") is None
    shoot(page, "inference-job")
    with page.expect_download() as download:
        page.locator("#job-result").click()
    with np.load(download.value.path(), allow_pickle=False) as result:
        np.testing.assert_array_equal(result["y"], ROWS + 1)

    page.get_by_role("link", name="Jobs", exact=True).click()
    row = page.locator(f"#jobs tr[data-job='{job_id}']")
    expect(row).to_contain_text("succeeded")
    expect(row).to_contain_text("1000 / 1000")
    job = InferenceJob.objects.get(public_id=job_id)
    assert (job.created_by.username, job.version.version, job.rows_done) == ("runner", 1, 1000)

    # The three pages fit a phone.
    page.set_viewport_size(PHONE)
    for label, path in (("jobs", "/ui/jobs"), ("job", f"/ui/jobs/{job_id}"), ("job-new", "/ui/jobs/new")):
        page.goto(f"{server.url}{path}")
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"], label
        shoot(page, f"phone-{label}")
    assert csp_violations(page) == []


def test_a_running_job_is_cancelled_from_its_page(server, browser, tmp_path: Path):
    _model("slowadder")
    person("canceller", Role.INFERENCE)
    # Many rows, so the job is still on its way when Cancel is pressed.
    np.savez(tmp_path / "many.npz", x=np.zeros((400_000, 4), dtype=np.float32))
    page = login(browser, server.url, "canceller")
    page.goto(f"{server.url}/ui/jobs/new")
    page.fill("#id_model", "slowadder")
    page.fill("#id_version", "1")
    page.set_input_files("#id_input", str(tmp_path / "many.npz"))
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url(f"{server.url}/ui/jobs/*")
    job_id = page.url.rsplit("/", 1)[-1]
    page.locator("#job-cancel").click()
    page.locator("dialog#confirm").get_by_role("button", name="Cancel the job").click()
    expect(page.get_by_role("status").first).to_have_text(f"Job {job_id} cancelled.")
    expect(page.locator("#job-state")).to_have_text("cancelled")
    assert page.locator("#job-cancel").count() == 0
    assert InferenceJob.objects.get(public_id=job_id).state == "cancelled"
    assert csp_violations(page) == []
