"""Archive, legal hold and delete of versions, and deleting a model, through the API (issue 27).

Deleting is two-phase: the row is marked (a tombstone) in the transaction that audits it, and the
files are removed from the store after the commit. Inside a test's transaction nothing commits, so a
request's after-commit work runs only where the test says so (``captureOnCommitCallbacks``): a test
that leaves it out is a process that died between the two phases.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import TestCase
from django.utils import timezone

from registry import artifacts, queueing, tasks
from registry.lifecycle import services as lifecycle
from registry.models import (
    PRODUCTION,
    AliasShadow,
    AuditEvent,
    ModelVersion,
    PromotionRequest,
    RegisteredModel,
    Role,
)
from registry.serving import LoadedRow, LoadState, WorkerReport, worker_heartbeat
from storage import StorageUnavailable, get_storage
from tests.support.people import Person, make_person
from tests.support.registry import create_model, set_alias, set_served, upload_versions
from tests.support.uploads import stored_keys

pytestmark = pytest.mark.django_db

V1 = "/api/v1/models/demo/versions/1"


@pytest.fixture
def admin(db: None) -> Person:
    return make_person("ada", Role.ADMIN)


@pytest.fixture
def auditor(db: None) -> Person:
    return make_person("aud", Role.AUDITOR)


@pytest.fixture
def two(owner: Person) -> list[ModelVersion]:
    create_model(owner)
    return upload_versions(owner, [1.0, 2.0])


def delete(person: Person, path: str, reason: str = "superseded", *, commit: bool = True) -> Any:
    """DELETE with a JSON reason; ``commit=False`` drops the after-commit work (a crash after the commit)."""
    body = json.dumps({"reason": reason}) if reason is not None else ""
    send = lambda: person.client.delete(  # noqa: E731
        path, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {person.token}"
    )
    if not commit:
        return send()
    with TestCase.captureOnCommitCallbacks(execute=True):
        return send()


def version_keys(version: ModelVersion) -> list[str]:
    files = list(version.files.values_list("storage_key", flat=True))
    return sorted(files + list(version.signatures.values_list("storage_key", flat=True)))


def actions(*names: str) -> list[tuple[str, str]]:
    return [(e.action, e.target) for e in AuditEvent.objects.filter(action__in=names).order_by("seq")]


# --- Archive -------------------------------------------------------------------------------------


def test_an_archived_version_is_hidden_from_lists_keeps_its_bytes_and_comes_back(owner, two):
    answer = owner.post(f"{V1}/archive", {"reason": "old experiment"})
    assert answer.status_code == 200, answer.content
    assert answer.json()["lifecycle"]["state"] == "archived"
    assert answer.json()["lifecycle"]["archived_by"] == "owner"
    assert [v["version"] for v in owner.get("/api/v1/models/demo/versions").json()["results"]] == [2]
    listed = owner.get("/api/v1/models/demo/versions?lifecycle=archived").json()["results"]
    assert [v["version"] for v in listed] == [1]
    everything = owner.get("/api/v1/models/demo/versions?lifecycle=all").json()["results"]
    assert [v["version"] for v in everything] == [2, 1]
    assert owner.get(f"{V1}/download").status_code == 200  # its bytes stay
    back = owner.post(f"{V1}/unarchive", {})
    assert (back.status_code, back.json()["lifecycle"]["state"]) == (200, "active")
    assert actions("version.archive", "version.unarchive") == [
        ("version.archive", "demo/1"),
        ("version.unarchive", "demo/1"),
    ]


def test_the_list_refuses_an_unknown_lifecycle(owner, two):
    answer = owner.get("/api/v1/models/demo/versions?lifecycle=gone")
    assert answer.status_code == 400
    assert answer.json()["error"] == "lifecycle must be one of active, archived, deleted, all, not 'gone'"


def test_an_archived_version_cannot_be_promoted_shadowed_or_rolled_out(owner, approver, two):
    assert owner.post(f"{V1}/archive", {}).status_code == 200
    refused = set_alias(owner, "staging", 1)
    assert refused.status_code == 409
    assert refused.json()["error"] == "version 1 is archived; unarchive it before it can be set on an alias"
    set_served(make_person("root", Role.ADMIN), "staging", True)
    set_alias(owner, "staging", 2)
    shadow = owner.put("/api/v1/models/demo/aliases/staging/shadow", {"version": 1, "sample": 0.5})
    assert (shadow.status_code, shadow.json()["error"]) == (
        409,
        "version 1 is archived; unarchive it before it can be used as a shadow",
    )
    rollout = owner.put("/api/v1/models/demo/aliases/staging/rollout", {"version": 1, "steps": [50, 100]})
    assert (rollout.status_code, rollout.json()["error"]) == (
        409,
        "version 1 is archived; unarchive it before it can be rolled out",
    )


def test_a_promotion_asked_for_before_the_version_was_archived_cannot_be_approved(owner, approver, two):
    request = set_alias(owner, PRODUCTION, 1)
    assert request.status_code == 202
    # Archiving is refused while the request is pending ...
    refused = owner.post(f"{V1}/archive", {})
    assert refused.status_code == 409
    assert refused.json()["error"] == (
        f"version 1 of model 'demo' cannot be archived: promotion request {request.json()['id']} names it"
    )
    assert refused.json()["detail"] == {"reasons": [f"promotion request {request.json()['id']} names it"]}


def test_archiving_is_refused_while_an_alias_points_at_it_and_needs_the_maintainer_role(owner, outsider, two):
    set_alias(owner, "staging", 1)
    refused = owner.post(f"{V1}/archive", {})
    assert (refused.status_code, refused.json()["error"]) == (
        409,
        "version 1 of model 'demo' cannot be archived: alias 'staging' points at it",
    )
    viewer = outsider.post("/api/v1/models/demo/versions/2/archive", {})
    assert (viewer.status_code, viewer.json()["error"]) == (
        403,
        "archiving or unarchiving a version needs the maintainer or admin role",
    )


# --- Legal hold ----------------------------------------------------------------------------------


def test_a_hold_needs_the_admin_or_auditor_role_and_a_reason(owner, auditor, two):
    refused = owner.post(f"{V1}/hold", {"reason": "litigation"})
    assert (refused.status_code, refused.json()["error"]) == (
        403,
        "placing or releasing a legal hold needs the admin or auditor role",
    )
    no_reason = auditor.post(f"{V1}/hold", {"reason": ""})
    assert (no_reason.status_code, no_reason.json()["error"]) == (400, "a legal hold needs a reason")
    held = auditor.post(f"{V1}/hold", {"reason": "case 2026-17"})
    assert held.status_code == 200, held.content
    assert held.json()["lifecycle"]["hold"]["by"] == "aud"
    assert held.json()["lifecycle"]["hold"]["reason"] == "case 2026-17"
    again = auditor.post(f"{V1}/hold", {"reason": "another"})
    assert (again.status_code, again.json()["error"]) == (
        409,
        "version 1 of model 'demo' is already under legal hold (by aud); release it first to change why",
    )
    released = auditor.post(f"{V1}/release", {"reason": "case closed"})
    assert (released.status_code, released.json()["lifecycle"]["hold"]) == (200, None)
    not_held = auditor.post(f"{V1}/release", {"reason": "twice"})
    assert (not_held.status_code, not_held.json()["error"]) == (
        409,
        "version 1 of model 'demo' is not under legal hold",
    )
    events = AuditEvent.objects.filter(action__in=["version.hold", "version.release"]).order_by("seq")
    assert [(e.action, e.actor, e.after) for e in events] == [
        ("version.hold", "aud", {"reason": "case 2026-17"}),
        ("version.release", "aud", {"reason": "case closed"}),
    ]


def test_a_held_version_cannot_be_deleted_even_by_an_admin(owner, admin, auditor, two):
    auditor.post(f"{V1}/hold", {"reason": "case 2026-17"})
    refused = delete(admin, V1)
    assert refused.status_code == 409
    [reason] = refused.json()["detail"]["reasons"]
    assert reason.startswith("it is under legal hold (by aud since ") and reason.endswith(": case 2026-17)")
    assert ModelVersion.objects.get(model__name="demo", version=1).deleted_at is None


# --- Delete: refusals ---------------------------------------------------------------------------


def test_deleting_needs_the_admin_role_and_a_reason(owner, admin, two):
    refused = delete(owner, V1)
    assert (refused.status_code, refused.json()["error"]) == (403, "deleting a version needs the admin role")
    no_reason = delete(admin, V1, reason="")
    assert (no_reason.status_code, no_reason.json()["error"]) == (400, "deleting a version needs a reason")
    no_body = admin.delete(V1)
    assert (no_body.status_code, no_body.json()["error"]) == (400, "deleting a version needs a reason")
    by_query = admin.delete(f"{V1}?reason=superseded")
    assert by_query.status_code == 200, by_query.content


def test_each_use_of_a_version_refuses_its_deletion_with_its_reason(owner, approver, admin, two):
    v1, v2 = two
    set_alias(owner, "staging", 1)
    set_served(admin, "staging", True)
    promotion = set_alias(owner, PRODUCTION, 2).json()["id"]
    AliasShadow.objects.create(
        alias=v1.model.aliases.get(name="staging"), version=v2, sample=0.5, started_by=owner.actor.user
    )
    worker_heartbeat(
        WorkerReport(
            worker_id="host-a:1",
            host="host-a",
            pid=1,
            device="cpu",
            provider="CPUExecutionProvider",
            started_at=timezone.now(),
            loaded=(LoadedRow(model="demo", version=1, aliases=("staging",), state=LoadState.READY),),
        )
    )
    first = delete(admin, V1)
    assert first.status_code == 409
    assert first.json()["error"] == (
        "version 1 of model 'demo' cannot be deleted: alias 'staging' points at it; "
        "inference process host-a:1 still serves it"
    )
    second = delete(admin, "/api/v1/models/demo/versions/2")
    assert second.json()["detail"]["reasons"] == [
        "a shadow on alias 'staging' runs it",
        f"promotion request {promotion} names it",
    ]
    assert ModelVersion.objects.filter(deleted_at__isnull=False).count() == 0
    assert len(stored_keys()) == len(version_keys(v1)) + len(version_keys(v2))


def test_a_live_rollout_refuses_the_deletion_of_both_its_versions(owner, admin, two):
    set_served(admin, "staging", True)
    set_alias(owner, "staging", 1)
    started = owner.put("/api/v1/models/demo/aliases/staging/rollout", {"version": 2, "steps": [50, 100]})
    assert started.status_code in (200, 201), started.content
    rollout = started.json()["id"]
    refused = delete(admin, "/api/v1/models/demo/versions/2")
    assert refused.json()["detail"]["reasons"] == [f"rollout {rollout} on alias 'staging' (running) uses it"]


# --- Delete: the tombstone and the bytes --------------------------------------------------------


def test_a_delete_removes_the_bytes_and_leaves_a_tombstone(owner, admin, two):
    v1, v2 = two
    keys = version_keys(v1)
    assert set(keys) <= set(stored_keys())
    answer = delete(admin, V1, "superseded by v2")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["version"] == 1 and body["sha256"] == v1.sha256
    assert (body["lifecycle"]["deleted"]["by"], body["lifecycle"]["deleted"]["reason"]) == ("ada", "superseded by v2")
    # The files went after the commit (in a test, as the request's block exits).
    assert owner.get(V1).json()["lifecycle"]["deleted"]["files_removed"] is True
    assert [f["sha256"] for f in body["files"]] == [v1.model_file.sha256]  # the digests stay with the tombstone
    assert set(stored_keys()) == set(version_keys(v2))  # every object of v1 is gone, v2's all stay
    gone = owner.get(f"{V1}/download")
    assert gone.status_code == 410
    assert gone.json()["error"].startswith("version 1 of model 'demo' was deleted by ada on ")
    assert gone.json()["error"].endswith(" UTC (superseded by v2); its files are gone")
    assert [v["version"] for v in owner.get("/api/v1/models/demo/versions").json()["results"]] == [2]
    tombstones = owner.get("/api/v1/models/demo/versions?lifecycle=deleted").json()["results"]
    assert [(v["version"], v["lifecycle"]["state"]) for v in tombstones] == [(1, "deleted")]
    assert owner.get(V1).status_code == 200
    assert actions("version.delete", "version.purge") == [("version.delete", "demo/1"), ("version.purge", "demo/1")]
    event = AuditEvent.objects.get(action="version.delete")
    assert event.after["sha256"] == v1.sha256 and event.after["reason"] == "superseded by v2"
    again = delete(admin, V1)
    assert again.status_code == 409
    assert again.json()["detail"]["reasons"] == ["it is already deleted"]


def test_a_deleted_versions_number_is_never_reused(owner, admin, two):
    delete(admin, "/api/v1/models/demo/versions/2")
    [v3] = upload_versions(owner, [3.0])
    assert v3.version == 3


def test_a_deleted_version_cannot_be_promoted_held_or_unarchived(owner, admin, auditor, two):
    delete(admin, V1)
    promote = set_alias(owner, "staging", 1)
    assert (promote.status_code, promote.json()["error"]) == (409, "version 1 is deleted; it cannot be set on an alias")
    hold = auditor.post(f"{V1}/hold", {"reason": "late"})
    assert (hold.status_code, hold.json()["error"]) == (
        409,
        "version 1 of model 'demo' is deleted; there is nothing left to hold",
    )
    unarchive = owner.post(f"{V1}/unarchive", {})
    assert unarchive.status_code == 409


@pytest.mark.django_db(transaction=True)  # the collector ends its database connection, as a periodic job does
def test_a_crash_between_the_two_phases_loses_nothing_and_leaks_nothing(owner, admin, two, monkeypatch):
    v1, v2 = two
    keys = version_keys(v1)
    # The process dies right after the commit, before it queues the second phase: the row is a tombstone,
    # and its files are still in the store.
    monkeypatch.setattr(queueing, "purge_enqueue", lambda version_id: None)
    answer = delete(admin, V1)
    assert answer.status_code == 200
    assert answer.json()["lifecycle"]["deleted"]["files_removed"] is False
    assert set(keys) <= set(stored_keys())
    # The collector leaves a pending deletion alone: the purge accounts for those objects.
    assert artifacts.collect_orphans(grace=timedelta(0)) == []
    assert set(keys) <= set(stored_keys())
    # The periodic job finishes it.
    assert tasks.purge_deleted_versions() == [v1.pk]
    assert set(stored_keys()) == set(version_keys(v2))
    assert ModelVersion.objects.get(pk=v1.pk).purged_at is not None
    assert tasks.purge_deleted_versions() == []


def test_a_store_failing_midway_leaves_the_deletion_pending_and_the_next_run_finishes_it(
    owner, admin, two, monkeypatch
):
    v1, v2 = two
    storage = get_storage()
    real_delete = storage.delete
    calls: list[str] = []

    def failing_after_one(key: str) -> None:
        calls.append(key)
        if len(calls) > 1:
            raise StorageUnavailable("the store is down")
        real_delete(key)

    monkeypatch.setattr(storage, "delete", failing_after_one)
    delete(admin, V1)
    version = ModelVersion.objects.get(pk=v1.pk)
    assert (version.purged_at, version.purge_attempts, version.purge_error) == (None, 1, "the store is down")
    assert len(set(version_keys(v1)) & set(stored_keys())) == len(version_keys(v1)) - 1
    monkeypatch.setattr(storage, "delete", real_delete)
    assert tasks.purge_deleted_versions() == [v1.pk]
    assert set(stored_keys()) == set(version_keys(v2))
    version.refresh_from_db()
    assert (version.purge_attempts, version.purge_error) == (2, "")


def test_a_failure_inside_the_first_phase_changes_nothing(owner, admin, two, monkeypatch):
    v1, _ = two

    def audit_down(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the audit chain is unavailable")

    monkeypatch.setattr(lifecycle, "audit_version", audit_down)
    with pytest.raises(RuntimeError):
        lifecycle.version_delete(version=v1, actor=admin.actor, reason="x")
    v1.refresh_from_db()
    assert v1.deleted_at is None
    assert set(version_keys(v1)) <= set(stored_keys())


@pytest.mark.django_db(transaction=True)  # the collector ends its database connection, as a periodic job does
def test_the_collector_removes_an_object_of_a_purged_version_that_came_back(owner, admin, two):
    v1, _ = two
    key = v1.model_file.storage_key
    delete(admin, V1)
    assert key not in stored_keys()
    import io

    get_storage().write(key, io.BytesIO(b"left behind"))  # a delete the store lost
    assert artifacts.collect_orphans(grace=timedelta(0)) == [key]
    assert key not in stored_keys()


def test_a_delete_removes_the_bytes_from_s3(s3_settings, s3_client, s3_bucket, owner, admin):
    create_model(owner)
    v1, v2 = upload_versions(owner, [1.0, 2.0])

    def objects() -> set[str]:
        listed = s3_client.list_objects_v2(Bucket=s3_bucket).get("Contents", [])
        return {item["Key"] for item in listed}

    keys_v1 = {f"pfx/{key}" for key in version_keys(v1)}
    assert keys_v1 <= objects()
    answer = delete(admin, V1)
    assert answer.status_code == 200
    assert owner.get(V1).json()["lifecycle"]["deleted"]["files_removed"] is True
    assert not keys_v1 & objects()
    assert {f"pfx/{key}" for key in version_keys(v2)} <= objects()


# --- Models -------------------------------------------------------------------------------------


def test_a_model_is_deleted_only_when_every_version_is(owner, admin, two):
    refused = delete(admin, "/api/v1/models/demo", "retired")
    assert (refused.status_code, refused.json()["error"]) == (
        409,
        "model 'demo' still has versions that are not deleted: 1, 2; delete them first",
    )
    by_maintainer = delete(owner, "/api/v1/models/demo", "retired")
    assert (by_maintainer.status_code, by_maintainer.json()["error"]) == (403, "deleting a model needs the admin role")
    delete(admin, V1)
    delete(admin, "/api/v1/models/demo/versions/2", commit=False)  # its files are still pending removal
    gone = delete(admin, "/api/v1/models/demo", "retired")
    assert gone.status_code == 204, gone.content
    assert not RegisteredModel.objects.filter(name="demo").exists()
    assert stored_keys() == []
    event = AuditEvent.objects.get(action="model.delete")
    assert [v["version"] for v in event.before["versions"]] == [1, 2]
    assert event.after == {"reason": "retired"}
    assert owner.get("/api/v1/models/demo").status_code == 404


def test_a_model_with_history_is_deleted_with_its_aliases_moves_and_requests(owner, approver, admin, two):
    set_alias(owner, "staging", 1)
    set_alias(owner, "staging", 2)
    request = set_alias(owner, PRODUCTION, 1).json()["id"]
    owner.post(f"/api/v1/promotions/{request}/cancel", {"reason": "not yet"})
    refused = delete(admin, "/api/v1/models/demo/versions/2")
    assert refused.json()["detail"]["reasons"] == ["alias 'staging' points at it"]
    cleared = owner.client.delete(
        "/api/v1/models/demo/aliases/staging",
        json.dumps({"reason": "retiring the model"}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {owner.token}",
    )
    assert (cleared.status_code, cleared.json()["version"]) == (200, None), cleared.content
    assert AuditEvent.objects.get(action="alias.clear").before == {"version": 2}
    assert delete(admin, V1).status_code == 200
    assert delete(admin, "/api/v1/models/demo/versions/2").status_code == 200
    assert delete(admin, "/api/v1/models/demo", "retired").status_code == 204
    assert not RegisteredModel.objects.filter(name="demo").exists()
    assert PromotionRequest.objects.filter(pk=request).count() == 0
    assert AuditEvent.objects.filter(model_name="demo", action="promotion.request").count() == 1  # the chain keeps it


def test_a_protected_alias_is_not_cleared(owner, approver, two):
    from tests.support.registry import promote

    promote(owner, approver, 1)
    refused = owner.delete(f"/api/v1/models/demo/aliases/{PRODUCTION}?reason=x")
    assert (refused.status_code, refused.json()["error"]) == (
        409,
        "alias 'production' is protected: unprotect it first (PATCH protected=false, approved by a second person), "
        "then clear it",
    )


def test_a_model_without_versions_is_deleted(owner, admin):
    create_model(owner, "empty")
    answer = delete(admin, "/api/v1/models/empty", "typo")
    assert answer.status_code == 204
    assert not RegisteredModel.objects.filter(name="empty").exists()
