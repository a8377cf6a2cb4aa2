"""Shadow traffic on an alias over the REST API: start, read, stop; the tallies the heartbeats write; the desired
state the inference processes read; what a move and a promotion request do to a shadow.

The inference processes are stood in for by ``registry.serving.worker_heartbeat`` with tallies recorded here
(``onnxkit.agreement.Tally``) on known arrays; ``tests/inference/test_shadow_processes.py`` runs real ones.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from onnxkit.agreement import Tally
from registry.errors import PermissionDenied
from registry.models import AliasShadow, AuditEvent, ModelVersion, RegisteredModel, Role, ShadowTally, VersionStatus
from registry.serving import ShadowSpec, ShadowTallyRow, WorkerReport, desired_state, worker_heartbeat
from registry.shadow import services as shadows
from tests.support.people import Person, make_person
from tests.support.registry import promote, set_alias, set_served, upload_versions

pytestmark = pytest.mark.django_db

SHADOW = "/api/v1/models/demo/aliases/production/shadow"
STAGING_SHADOW = "/api/v1/models/demo/aliases/staging/shadow"

ZERO_SIDE = {"answered": 0, "errors": 0, "error_rate": None, "p50_ms": None, "p99_ms": None, "last_error": ""}
ZERO_REPORT = {
    "requests": 0,
    "compared": 0,
    "dropped": 0,
    "dropped_by_reason": {},
    "primary": ZERO_SIDE,
    "candidate": ZERO_SIDE,
    "outputs": {},
}

# Class scores of two rows: row 0's winner is column 3, row 1's column 0.
SCORES = np.array([[0.0, 1.0, 2.0, 3.0], [3.0, 2.0, 1.0, 0.0]], dtype=np.float32)


@pytest.fixture
def admin() -> Person:
    return make_person("root", Role.ADMIN)


@pytest.fixture
def versions(owner: Person, registered: str) -> list[ModelVersion]:
    """demo v1, v2, v3: ``y = x + 1``, ``+ 2``, ``+ 3``, each ready."""
    return upload_versions(owner, [1.0, 2.0, 3.0])


@pytest.fixture
def serving_v1(owner: Person, approver: Person, versions: list[ModelVersion]) -> list[ModelVersion]:
    """Production (protected, served) serves v1."""
    promote(owner, approver, 1)
    return versions


@pytest.fixture
def served_staging(owner: Person, admin: Person, versions: list[ModelVersion]) -> list[ModelVersion]:
    """Staging (unprotected) serves v1 too, now that an admin has made it served."""
    assert set_alias(owner, "staging", 1).status_code == 200
    set_served(admin, "staging", True)
    return versions


def start(person: Person, version: int, path: str = SHADOW, **body: Any) -> Any:
    return person.put(path, {"version": version, **body})


def error_of(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["error"]


def audit(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action).order_by("seq"))


def heartbeat(worker_id: str, *rows: ShadowTallyRow) -> None:
    worker_heartbeat(
        WorkerReport(
            worker_id=worker_id,
            host="host-a",
            pid=4242,
            device="cpu",
            provider="CPUExecutionProvider",
            started_at=datetime(2026, 1, 1, tzinfo=UTC),
            loaded=(),
            shadows=rows,
        )
    )


def tally_of(candidate: np.ndarray, requests: int) -> Tally:
    """``requests`` mirrored requests whose primary answered SCORES and the candidate ``candidate``."""
    tally = Tally()
    for _ in range(requests):
        tally.record(primary={"y": SCORES}, primary_seconds=0.002, candidate={"y": candidate}, candidate_seconds=0.003)
    return tally


# --- starting -------------------------------------------------------------------------------------------------


def test_put_with_the_version_alone_starts_a_shadow_of_a_tenth(
    owner, serving_v1, monkeypatch, django_capture_on_commit_callbacks
):
    published: list[dict[str, Any]] = []
    monkeypatch.setattr("registry.notify.publish", published.append)

    with django_capture_on_commit_callbacks(execute=True):
        response = start(owner, 2)

    assert response.status_code == 201, response.content
    body = response.json()
    shadow = AliasShadow.objects.get()
    assert body.pop("started_at") == shadow.started_at.isoformat()
    assert body == {
        "id": shadow.pk,
        "model": "demo",
        "alias": "production",
        "version": 2,
        "serving": 1,
        "sample": 0.1,
        "running": True,
        "started_by": "owner",
        "ended_at": None,
        "ended_by": None,
        "end_reason": "",
        "workers": 0,
        "report": ZERO_REPORT,
    }
    assert (shadow.version.version, shadow.sample, shadow.ended_at) == (2, 0.1, None)
    [event] = audit("alias.shadow_start")
    assert (event.actor, event.target_type, event.target, event.model_name) == (
        "owner",
        "alias",
        "demo@production",
        "demo",
    )
    assert event.before is None
    assert event.after == {"shadow": shadow.pk, "version": 2, "sample": 0.1}
    # The inference processes are told at once, as for an alias move.
    assert {"model": "demo", "alias": "production", "shadow": True} in published


def test_put_takes_a_sample_and_get_reads_it(owner, outsider, serving_v1):
    assert start(owner, 3, sample=1).status_code == 201

    response = outsider.get(SHADOW)  # reading needs no role

    assert response.status_code == 200
    assert (response.json()["version"], response.json()["sample"], response.json()["running"]) == (3, 1.0, True)


@pytest.mark.parametrize(
    "body, status, message",
    [
        ({}, 400, "version: This field is required."),
        ({"sample": 0.5}, 400, "version: This field is required."),
        ({"version": 2, "sample": 0}, 400, "sample must be above 0 and at most 1 (a share of the requests), not 0"),
        (
            {"version": 2, "sample": -0.5},
            400,
            "sample must be above 0 and at most 1 (a share of the requests), not -0.5",
        ),
        ({"version": 2, "sample": 1.5}, 400, "sample must be above 0 and at most 1 (a share of the requests), not 1.5"),
        ({"version": 2, "sample": "abc"}, 400, "sample: A valid number is required."),
        ({"version": 9}, 404, "model 'demo' has no version 9"),
        ({"version": 1}, 409, "alias 'production' serves version 1 already; shadow another version"),
    ],
)
def test_put_refuses_bad_input(owner, serving_v1, body, status, message):
    response = owner.put(SHADOW, body)

    assert error_of(response) == (status, message)
    assert not AliasShadow.objects.exists()
    assert not audit("alias.shadow_start")


def test_put_accepts_a_sample_below_a_ten_thousandth(owner, serving_v1):
    """Above 0 is the one rule (the service's, the database's): the API adds no floor of its own."""
    response = start(owner, 2, sample=0.00005)

    assert response.status_code == 201, response.content
    assert response.json()["sample"] == 0.00005


def test_put_refuses_an_alias_that_is_not_served(owner, serving_v1):
    assert set_alias(owner, "staging", 1).status_code == 200  # staging: pointed at v1, not served

    response = start(owner, 2, STAGING_SHADOW)

    assert error_of(response) == (409, "alias 'staging' is not served, so it has no requests to mirror; serve it first")
    assert not AliasShadow.objects.exists()


def test_put_refuses_an_alias_that_points_to_no_version(owner, versions):
    response = start(owner, 2)  # production: served, but never promoted

    assert error_of(response) == (
        409,
        "alias 'production' points to no version yet: there is nothing to compare against",
    )


def test_put_refuses_a_version_that_is_not_ready(owner, serving_v1):
    ModelVersion.objects.filter(model__name="demo", version=3).update(status=VersionStatus.FAILED)

    response = start(owner, 3)

    assert error_of(response) == (409, "version 3 is failed; only a ready version can shadow an alias")


def test_put_on_an_unknown_alias_or_model_is_404(owner, serving_v1):
    assert error_of(start(owner, 2, "/api/v1/models/demo/aliases/canary/shadow")) == (
        404,
        "model 'demo' has no alias 'canary'",
    )
    unknown = start(owner, 2, "/api/v1/models/nope/aliases/production/shadow")
    assert unknown.status_code == 404
    assert unknown.json() == {"error": "not found", "detail": None}
    for path in ("/api/v1/models/nope/aliases/production/shadow", "/api/v1/models/demo/aliases/canary/shadow"):
        assert owner.get(path).status_code == 404
        assert owner.delete(path).status_code == 404
    assert not AliasShadow.objects.exists()


def test_starting_or_stopping_needs_the_maintainer_role(owner, approver, outsider, serving_v1):
    for person in (outsider, approver):
        assert error_of(start(person, 2)) == (403, "this action needs the maintainer or admin role")
    assert not AliasShadow.objects.exists()
    assert start(owner, 2).status_code == 201
    for person in (outsider, approver):
        assert error_of(person.delete(SHADOW)) == (403, "this action needs the maintainer or admin role")
    assert AliasShadow.objects.get().ended_at is None
    # The services check the role themselves, for callers other than the API.
    model = RegisteredModel.objects.get(name="demo")
    with pytest.raises(PermissionDenied) as refused:
        shadows.shadow_start(model=model, alias_name="production", version_number=3, sample=0.5, actor=outsider.actor)
    assert refused.value.message == "starting or stopping a shadow needs the maintainer or admin role"
    with pytest.raises(PermissionDenied) as refused:
        shadows.shadow_stop(model=model, alias_name="production", actor=approver.actor)
    assert refused.value.message == "starting or stopping a shadow needs the maintainer or admin role"


def test_an_admin_may_start_a_shadow(admin, serving_v1):
    response = start(admin, 2)

    assert response.status_code == 201, response.content
    assert response.json()["started_by"] == "root"


def test_put_again_replaces_the_running_shadow(owner, serving_v1):
    first = start(owner, 2).json()

    second = start(owner, 3, sample=0.5)

    assert second.status_code == 201, second.content
    assert (second.json()["version"], second.json()["sample"], second.json()["running"]) == (3, 0.5, True)
    assert second.json()["id"] != first["id"]
    old = AliasShadow.objects.get(pk=first["id"])
    assert old.ended_at is not None and old.ended_by.username == "owner"
    assert old.end_reason == "replaced by a shadow of version 3"
    assert AliasShadow.objects.filter(ended_at__isnull=True).count() == 1
    assert owner.get(SHADOW).json()["id"] == second.json()["id"]  # the running one, not the last ended
    event = audit("alias.shadow_start")[-1]
    assert event.before == {"shadow": first["id"], "version": 2, "sample": 0.1}
    assert event.after == {"shadow": second.json()["id"], "version": 3, "sample": 0.5}


# --- reading and stopping -------------------------------------------------------------------------------------


def test_get_when_the_alias_was_never_shadowed_is_404(owner, serving_v1):
    assert error_of(owner.get(SHADOW)) == (404, "alias 'production' of model 'demo' has never been shadowed")


def test_delete_when_nothing_runs_is_404(owner, serving_v1):
    assert error_of(owner.delete(SHADOW)) == (404, "alias 'production' of model 'demo' has no running shadow")
    assert start(owner, 2).status_code == 201
    assert owner.delete(SHADOW).status_code == 200
    assert error_of(owner.delete(SHADOW)) == (404, "alias 'production' of model 'demo' has no running shadow")
    assert len(audit("alias.shadow_stop")) == 1


def test_delete_without_a_body_stops_it_and_get_then_reads_the_ended_one(owner, outsider, serving_v1):
    started = start(owner, 2).json()

    stopped = owner.delete(SHADOW)

    assert stopped.status_code == 200, stopped.content
    body = stopped.json()
    assert (body["id"], body["running"], body["ended_by"], body["end_reason"]) == (
        started["id"],
        False,
        "owner",
        "stopped",
    )
    assert body["ended_at"] is not None and body["report"] == ZERO_REPORT
    [event] = audit("alias.shadow_stop")
    assert (event.actor, event.target) == ("owner", "demo@production")
    assert event.before == {"shadow": started["id"], "version": 2, "sample": 0.1}
    assert event.after == {"reason": "stopped"}
    read = outsider.get(SHADOW)
    assert read.status_code == 200
    assert read.json() == body


def test_delete_with_a_reason_keeps_it(owner, serving_v1):
    start(owner, 2)

    stopped = owner.delete(SHADOW, data={"reason": "enough data"}, content_type="application/json")

    assert stopped.status_code == 200, stopped.content
    assert stopped.json()["end_reason"] == "enough data"
    assert audit("alias.shadow_stop")[0].after == {"reason": "enough data"}


def test_get_after_several_reads_the_last_one(owner, serving_v1):
    start(owner, 2)
    owner.delete(SHADOW)
    latest = start(owner, 3).json()
    owner.delete(SHADOW, data={"reason": "done"}, content_type="application/json")

    body = owner.get(SHADOW).json()

    assert (body["id"], body["version"], body["running"], body["end_reason"]) == (latest["id"], 3, False, "done")


# --- tallies from the heartbeats ------------------------------------------------------------------------------


def test_tallies_from_two_workers_merge_into_the_report(owner, serving_v1):
    shadow_id = start(owner, 2).json()["id"]
    # Worker a: the candidate adds 0.25 everywhere; no row's winner moves.
    first = tally_of(SCORES + 0.25, requests=3)
    # Worker b: row 1's last column grows past its winner; row 0 only moves by 0.5.
    moved = SCORES.copy()
    moved[0, 3] = 3.5
    moved[1, 3] = 4.0
    second = tally_of(moved, requests=2)

    heartbeat("worker-a", ShadowTallyRow(shadow_id, first.as_json()))
    heartbeat("worker-b", ShadowTallyRow(shadow_id, second.as_json()))
    body = owner.get(SHADOW).json()

    assert body["workers"] == 2
    report = body["report"]
    assert (report["requests"], report["compared"], report["dropped"]) == (5, 5, 0)
    assert report["candidate"]["answered"] == 5 and report["primary"]["answered"] == 5
    out = report["outputs"]["y"]
    assert out["rows"] == 10
    assert out["max_abs_diff"] == 4.0  # worker b's, the larger
    # Worker a: 3 requests of 8 values, each 0.25 off; worker b: 2 requests, 0.5 and 4.0 off.
    assert out["mean_abs_diff"] == pytest.approx((3 * 8 * 0.25 + 2 * 4.5) / (5 * 8))
    assert out["top1_agreement"] == pytest.approx((6 + 2) / 10)  # a: 6 of 6 rows; b: 2 of 4
    assert report == Tally(first.as_json()).merge(second.as_json()).report()
    assert set(ShadowTally.objects.values_list("worker_id", flat=True)) == {"worker-a", "worker-b"}


def test_a_second_heartbeat_replaces_the_workers_tally(owner, serving_v1):
    shadow_id = start(owner, 2).json()["id"]
    heartbeat("worker-a", ShadowTallyRow(shadow_id, tally_of(SCORES, requests=3).as_json()))
    heartbeat("worker-b", ShadowTallyRow(shadow_id, tally_of(SCORES, requests=2).as_json()))

    # The process's counts since it began mirroring: 4 now, not 3 + 4.
    heartbeat("worker-a", ShadowTallyRow(shadow_id, tally_of(SCORES, requests=4).as_json()))

    body = owner.get(SHADOW).json()
    assert (body["workers"], body["report"]["requests"]) == (2, 6)
    assert ShadowTally.objects.filter(shadow_id=shadow_id).count() == 2
    assert ShadowTally.objects.get(worker_id="worker-a").tally["requests"] == 4


def test_a_heartbeat_for_an_unknown_shadow_writes_nothing(owner, serving_v1):
    shadow_id = start(owner, 2).json()["id"]

    heartbeat("worker-a", ShadowTallyRow(shadow_id + 1000, tally_of(SCORES, requests=3).as_json()))
    assert not ShadowTally.objects.exists()
    heartbeat(
        "worker-a",
        ShadowTallyRow(shadow_id + 1000, tally_of(SCORES, requests=3).as_json()),
        ShadowTallyRow(shadow_id, tally_of(SCORES, requests=1).as_json()),
    )

    assert list(ShadowTally.objects.values_list("shadow_id", "worker_id")) == [(shadow_id, "worker-a")]
    assert owner.get(SHADOW).json()["report"]["requests"] == 1


def test_an_ended_shadows_last_counts_still_arrive(owner, serving_v1):
    shadow_id = start(owner, 2).json()["id"]
    owner.delete(SHADOW)

    heartbeat("worker-a", ShadowTallyRow(shadow_id, tally_of(SCORES, requests=2).as_json()))

    body = owner.get(SHADOW).json()
    assert (body["running"], body["workers"], body["report"]["requests"]) == (False, 1, 2)


def test_the_report_takes_the_last_error_of_the_latest_counts(owner, serving_v1):
    shadow_id = start(owner, 2).json()["id"]
    for worker, error in (("worker-b", "b failed"), ("worker-a", "a failed")):
        tally = Tally()
        tally.record(
            primary={"y": SCORES}, primary_seconds=0.001, candidate=None, candidate_seconds=0.0, candidate_error=error
        )
        heartbeat(worker, ShadowTallyRow(shadow_id, tally.as_json()))

    candidate = owner.get(SHADOW).json()["report"]["candidate"]

    assert (candidate["errors"], candidate["error_rate"], candidate["last_error"]) == (2, 1.0, "a failed")


# --- the desired state ----------------------------------------------------------------------------------------


def test_desired_state_carries_the_running_shadow_and_its_version(owner, serving_v1):
    v1, v2 = serving_v1[0], serving_v1[1]
    assert desired_state().shadows == {}
    shadow_id = start(owner, 2, sample=0.25).json()["id"]

    state = desired_state()

    assert state.routes == {"demo": {"production": v1.pk}}
    assert set(state.versions) == {v1.pk, v2.pk}
    assert state.versions[v2.pk].version == 2
    assert state.shadows == {"demo": {"production": ShadowSpec(shadow_id=shadow_id, version_id=v2.pk, sample=0.25)}}

    owner.delete(SHADOW)
    after = desired_state()
    assert after.shadows == {}
    assert set(after.versions) == {v1.pk}


def test_desired_state_leaves_out_a_shadow_of_an_alias_no_longer_served(owner, admin, serving_v1, served_staging):
    v1, v3 = served_staging[0], served_staging[2]
    shadow_id = start(owner, 3, STAGING_SHADOW).json()["id"]
    assert desired_state().shadows == {"demo": {"staging": ShadowSpec(shadow_id, v3.pk, 0.1)}}

    set_served(admin, "staging", False)

    state = desired_state()
    assert state.shadows == {}
    assert set(state.versions) == {v1.pk}  # production's; staging's candidate is not loaded
    assert AliasShadow.objects.get(pk=shadow_id).ended_at is None  # it resumes if the alias is served again
    set_served(admin, "staging", True)
    assert desired_state().shadows == {"demo": {"staging": ShadowSpec(shadow_id, v3.pk, 0.1)}}


# --- moves and promotions -------------------------------------------------------------------------------------


def test_moving_an_alias_to_the_shadowed_version_ends_the_shadow(owner, serving_v1, served_staging):
    shadow_id = start(owner, 2, STAGING_SHADOW).json()["id"]
    heartbeat("worker-a", ShadowTallyRow(shadow_id, tally_of(SCORES + 1, requests=3).as_json()))

    # A move to another version leaves it running: it compares against the new version.
    moved = owner.put("/api/v1/models/demo/aliases/staging", {"version": 3})
    assert moved.status_code == 200, moved.content
    assert owner.get(STAGING_SHADOW).json()["running"] is True
    assert owner.get(STAGING_SHADOW).json()["serving"] == 3

    moved = owner.put("/api/v1/models/demo/aliases/staging", {"version": 2})

    assert moved.status_code == 200, moved.content
    body = owner.get(STAGING_SHADOW).json()
    assert (body["id"], body["running"], body["ended_by"], body["serving"]) == (shadow_id, False, "owner", 2)
    assert body["end_reason"].startswith("promoted")
    assert body["end_reason"] == shadows.PROMOTED
    assert body["report"]["requests"] == 3  # the report stays
    [event] = audit("alias.shadow_stop")
    assert event.target == "demo@staging"
    assert event.before == {"shadow": shadow_id, "version": 2, "sample": 0.1}
    assert event.after == {"reason": shadows.PROMOTED}
    assert desired_state().shadows == {}
    # The production shadow was never involved.
    assert AliasShadow.objects.count() == 1


def test_a_promotion_request_carries_the_shadow_report(owner, approver, serving_v1):
    shadow_id = start(owner, 2).json()["id"]
    heartbeat("worker-a", ShadowTallyRow(shadow_id, tally_of(SCORES + 0.25, requests=3).as_json()))
    heartbeat("worker-b", ShadowTallyRow(shadow_id, tally_of(SCORES + 0.5, requests=1).as_json()))

    asked = set_alias(owner, "production", 2)

    assert asked.status_code == 202, asked.content
    assert asked.json()["shadow_report"]["id"] == shadow_id
    promotion = owner.get(f"/api/v1/promotions/{asked.json()['id']}")
    assert promotion.status_code == 200
    kept = promotion.json()["shadow_report"]
    assert (kept["id"], kept["version"], kept["serving"], kept["running"], kept["workers"]) == (
        shadow_id,
        2,
        1,
        True,
        2,
    )
    assert kept["as_of"]
    assert kept["report"]["requests"] == 4
    assert kept["report"]["outputs"]["y"]["max_abs_diff"] == 0.5
    assert kept["report"] == owner.get(SHADOW).json()["report"]

    # The request keeps the report as it stood: later counts do not change it.
    heartbeat("worker-a", ShadowTallyRow(shadow_id, tally_of(SCORES + 0.25, requests=30).as_json()))
    assert owner.get(f"/api/v1/promotions/{asked.json()['id']}").json()["shadow_report"]["report"]["requests"] == 4

    # Approving moves production to the candidate, which ends the shadow.
    approved = approver.post(f"/api/v1/promotions/{asked.json()['id']}/approve", {"reason": "ok"})
    assert approved.status_code == 200, approved.content
    body = owner.get(SHADOW).json()
    assert (body["running"], body["ended_by"], body["serving"]) == (False, "approver", 2)
    assert body["end_reason"].startswith("promoted")


def test_a_promotion_request_for_a_version_never_shadowed_carries_none(owner, serving_v1):
    start(owner, 2)

    asked = set_alias(owner, "production", 3)

    assert asked.status_code == 202, asked.content
    assert owner.get(f"/api/v1/promotions/{asked.json()['id']}").json()["shadow_report"] is None
