"""Where people decide: the promotion request, its review and the compare page show speed and accuracy; the policy.

The candidate is a real fp16 derivation (its accuracy delta measured by the derive job). Benchmark
numbers are written through the record service the inference processes use, with chosen values, so
the line's text can be asserted exactly; a real benchmark run is tested in tests/inference/test_benchmarks.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from onnxkit.sandbox import ChildOutcome
from registry import serving
from registry.models import AuditEvent, DeriveJob, JobStatus, ModelVersion, PromotionRequest, Role, VersionStatus
from tests.support.onnx_models import classifier_model
from tests.support.people import Person, login_person, make_person
from tests.support.polling import eventually
from tests.support.registry import create_model, promote, set_alias

pytestmark = pytest.mark.django_db(transaction=True)

CPU = "CPUExecutionProvider"
MINUS = "\u2212"
TIMES = "\u00d7"


@pytest.fixture
def mia() -> Person:
    return login_person("mia", Role.MAINTAINER, Role.APPROVER)


@pytest.fixture
def admin() -> Person:
    return make_person("root", Role.ADMIN)


def record_benchmark(version: ModelVersion, *, throughput32: float, p99_ms: float) -> None:
    """Take the version's pending CPU benchmark and record these numbers through the service processes use."""
    job = serving.benchmark_claim(provider=CPU, host_kind="cpu", worker_id="test")
    assert job is not None and job.version == version.version
    numbers = {
        "provider": CPU,
        "p50_ms": p99_ms / 2,
        "p99_ms": p99_ms,
        "throughput": {"8": throughput32 / 2, "32": throughput32},
        "load_seconds": 0.1,
        "peak_rss_bytes": 200 * 2**20,
    }
    serving.benchmark_record(benchmark_id=job.benchmark_id, outcome=ChildOutcome(reply=numbers))


def upload_v1(mia: Person) -> ModelVersion:
    create_model(mia)
    response = mia.upload("demo", [("model.onnx", classifier_model().SerializeToString())])
    assert response.status_code == 201, response.content
    return ModelVersion.objects.get(model__name="demo", version=1)


def derive_fp16(mia: Person, parent: ModelVersion) -> ModelVersion:
    response = mia.post(f"/api/v1/models/demo/versions/{parent.version}/derive", {"recipe": "fp16"})
    assert response.status_code == 202, response.content

    def built() -> ModelVersion | None:
        job = DeriveJob.objects.get(pk=response.json()["id"])
        assert job.status != JobStatus.FAILED, job.error
        if job.result_id is None:
            return None
        version = ModelVersion.objects.get(pk=job.result_id)
        return version if version.status == VersionStatus.READY else None

    return eventually(built, timeout=60)


@pytest.fixture
def candidate(mia: Person, ana: Person) -> ModelVersion:
    """production serves v1 (1000 rows/s at batch 32, p99 10 ms); v2 is its fp16 derivation, not yet measured."""
    v1 = upload_v1(mia)
    record_benchmark(v1, throughput32=1000.0, p99_ms=10.0)
    promote(mia, ana, 1)
    return derive_fp16(mia, v1)


def test_the_request_and_its_review_show_the_line(mia: Person, ana: Person, candidate: ModelVersion) -> None:
    record_benchmark(candidate, throughput32=1900.0, p99_ms=5.9)
    cosine = candidate.accuracy["worst"]["cosine"]

    response = set_alias(mia, "production", 2)

    assert response.status_code == 202, response.content
    line = (
        f"v2 against v1 (production): 1.9{TIMES} throughput at batch 32 on {CPU}, p99 {MINUS}41%, "
        f"cosine {cosine:.4f}, top-1 agreement 100.0%"
    )
    assert response.json()["comparison"] == line
    review = ana.client.get(f"/ui/promotions/{response.json()['id']}")
    assert review.status_code == 200
    assert review.context["diff"]["measured"].line() == line
    html = review.content.decode()
    assert f'<p id="measured-line" class="wrap"><strong>{line}</strong></p>' in html
    assert "batch 32: 1900/s" in html and "batch 32: 1000/s" in html  # both benchmarks, side by side
    assert "<code>scores</code>" in html  # the accuracy delta per output
    request_page = mia.client.get("/ui/models/demo/promote", {"alias": "production", "version": "2"})
    assert f"<strong>{line}</strong>" in request_page.content.decode()
    compare_page = mia.client.get("/ui/models/demo/compare", {"a": 1, "b": 2})
    assert compare_page.context["diff"]["measured"].line() == line.replace(" (production)", "")


def test_the_line_says_what_is_not_measured(mia: Person, ana: Person, candidate: ModelVersion) -> None:
    upload = mia.upload("demo", [("model.onnx", classifier_model(seed=9).SerializeToString())])  # v3: an upload
    assert upload.status_code == 201

    response = set_alias(mia, "production", 3)

    assert response.json()["comparison"] == (
        "v3 against v1 (production): no benchmark of both on one provider yet, "
        "no accuracy delta measured between v3 and v1"
    )


def test_the_version_page_shows_the_recipe_the_delta_and_the_benchmark(mia: Person, candidate: ModelVersion) -> None:
    record_benchmark(candidate, throughput32=1900.0, p99_ms=5.9)

    page = mia.client.get("/ui/models/demo/versions/2")

    html = page.content.decode()
    assert "Derived from" in html and "<strong>fp16</strong>" in html and "v2 against v1 on synthetic inputs" in html
    assert "batch 32: 1900/s" in html and "5.90 ms" in html
    parent = mia.client.get("/ui/models/demo/versions/1").content.decode()
    assert "Derived from this one:" in parent and "batch 32: 1000/s" in parent


def set_policy(person: Person, **policy: Any) -> Any:
    return person.patch("/api/v1/models/demo/aliases/production", policy)


def test_the_policy_refuses_a_slower_less_accurate_candidate_unless_forced(
    mia: Person, admin: Person, candidate: ModelVersion
) -> None:
    record_benchmark(candidate, throughput32=800.0, p99_ms=12.0)
    cosine = candidate.accuracy["worst"]["cosine"]
    assert set_policy(mia, max_slowdown_percent=10).status_code == 403
    answer = set_policy(admin, max_slowdown_percent=10, min_cosine=0.99999999)
    assert answer.status_code == 200, answer.content
    assert (answer.json()["max_slowdown_percent"], answer.json()["min_cosine"]) == (10.0, 0.99999999)
    assert AuditEvent.objects.get(action="alias.policy").after == {
        "max_slowdown_percent": 10.0,
        "min_cosine": 0.99999999,
        "max_abs_diff": None,
    }

    refused = set_alias(mia, "production", 2)

    assert refused.status_code == 409
    assert refused.json()["error"] == (
        "version 2 breaks the policy of 'production' against version 1: throughput at batch 32 on "
        f"{CPU} is 20.0% below version 1's (800.0 against 1000.0 rows/s; max_slowdown_percent 10); "
        f"cosine {cosine:.6g} is below min_cosine 0.99999999. Send force=true with a reason to set it anyway."
    )
    assert not PromotionRequest.objects.filter(state="pending").exists()
    no_reason = mia.client.put(
        "/api/v1/models/demo/aliases/production",
        {"version": 2, "force": True, "reason": " "},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {mia.token}",
    )
    assert no_reason.status_code == 400 and no_reason.json()["error"] == "force=true needs a reason"
    forced = mia.client.put(
        "/api/v1/models/demo/aliases/production",
        {"version": 2, "force": True, "reason": "fp16 halves the memory; accepted"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {mia.token}",
    )
    assert forced.status_code == 202, forced.content
    assert forced.json()["force"] is True
    event = AuditEvent.objects.filter(action="promotion.request").latest("seq")
    assert event.after["forced"] is True and event.after["version"] == 2


def test_the_policy_accepts_a_candidate_within_it(mia: Person, admin: Person, candidate: ModelVersion) -> None:
    record_benchmark(candidate, throughput32=950.0, p99_ms=11.0)
    set_policy(admin, max_slowdown_percent=10, min_cosine=0.999, max_abs_diff=0.5)

    response = set_alias(mia, "production", 2)

    assert response.status_code == 202, response.content
    assert response.json()["force"] is False


def test_the_policy_refuses_what_it_cannot_check(mia: Person, admin: Person, candidate: ModelVersion) -> None:
    set_policy(admin, max_slowdown_percent=5)  # v2's benchmark has not run

    refused = set_alias(mia, "production", 2)

    assert refused.status_code == 409
    assert refused.json()["error"] == (
        "version 2 breaks the policy of 'production' against version 1: max_slowdown_percent 5 cannot be "
        "checked: no benchmark of versions 2 and 1 on one provider has finished. "
        "Send force=true with a reason to set it anyway."
    )
    cleared = set_policy(admin, max_slowdown_percent=None)
    assert cleared.status_code == 200 and cleared.json()["max_slowdown_percent"] is None
    assert set_alias(mia, "production", 2).status_code == 202


def test_the_request_page_offers_force_past_the_policy_and_says_to_tick_it(
    mia: Person, admin: Person, candidate: ModelVersion
) -> None:
    set_policy(admin, max_slowdown_percent=5)  # v2's benchmark has not run; its signature is v1's
    page = mia.client.get("/ui/models/demo/promote", {"alias": "production", "version": "2"})
    assert page.context["diff"]["breaking"] == [] and page.context["diff"]["policy_violations"]
    assert b'<input type="checkbox" name="force" value="on">' in page.content

    refused = mia.client.post("/ui/models/demo/promote", {"alias": "production", "version": "2", "reason": "x"})

    assert refused.status_code == 409
    assert refused.context["error"] == (
        "version 2 breaks the policy of 'production' against version 1: max_slowdown_percent 5 cannot be "
        "checked: no benchmark of versions 2 and 1 on one provider has finished. "
        "Tick Force and give a reason to set it anyway."
    )
    forced = mia.client.post(
        "/ui/models/demo/promote", {"alias": "production", "version": "2", "reason": "fp16 is fine", "force": "on"}
    )
    assert forced.status_code == 302
    assert PromotionRequest.objects.get(state="pending").force is True
