"""Retention rules over the REST API and the periodic job: the rule and its exact refusals, who may set it, the
preview and the run that does exactly what it listed, archive and delete (files gone from the local store
and from S3), and what a rule spares: a legal hold, an alias now or lately, recent serving, what still uses
a version, a validation still running.

Versions are aged by moving their ``created_at`` back, or by passing the plan a later ``now``: no sleeps.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import TestCase
from django.utils import timezone

from registry.errors import InvalidInput
from registry.lifecycle import retention
from registry.lifecycle import services as lifecycle
from registry.models import (
    Alias,
    AliasMove,
    AuditEvent,
    ModelFile,
    ModelVersion,
    RegisteredModel,
    Role,
    VersionSignature,
    VersionStatus,
)
from registry.serving import LoadedRow, LoadState, WorkerReport, worker_heartbeat
from registry.tasks import apply_retention
from tests.support.people import Person, make_person
from tests.support.registry import artifact_path, create_model, set_alias, upload_versions
from tests.support.s3 import bucket_objects

pytestmark = pytest.mark.django_db

RETENTION = "/api/v1/models/demo/retention"
PREVIEW = "/api/v1/models/demo/retention/preview"
ARCHIVE_RULE = {"keep_last": 2, "keep_days": 30, "then": "archive"}
DELETE_RULE = {"keep_last": 2, "keep_days": 30, "then": "delete"}


@pytest.fixture
def admin() -> Person:
    return make_person("root", Role.ADMIN)


@pytest.fixture
def auditor() -> Person:
    return make_person("audrey", Role.AUDITOR)


def at(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M} UTC"


def error_of(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["error"]


def model() -> RegisteredModel:
    return RegisteredModel.objects.get(name="demo")


def version(number: int) -> ModelVersion:
    return ModelVersion.objects.get(model__name="demo", version=number)


def age(days: float, *numbers: int) -> datetime:
    """Move the versions' creation ``days`` back; the new ``created_at``."""
    created = timezone.now() - timedelta(days=days)
    ModelVersion.objects.filter(model__name="demo", version__in=numbers).update(created_at=created)
    return created


def audit(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action).order_by("seq"))


def set_rule(person: Person, rule: Any) -> Any:
    return person.put(RETENTION, json.dumps(rule))  # as JSON whatever it is: a string, null


def why_archived(number: int, rule: dict[str, Any] = ARCHIVE_RULE) -> str:
    newest = "the newest version" if rule["keep_last"] == 1 else f"the {rule['keep_last']} newest versions"
    return (
        f"not among {newest}, created {at(version(number).created_at)} "
        f"(more than {rule['keep_days']} days ago), and neither aliased nor served since then"
    )


def run(**kwargs: Any) -> list[dict[str, Any]]:
    """The job for 'demo', with what it queues after commit (a deletion's file removal) run as a server does."""
    with TestCase.captureOnCommitCallbacks(execute=True):
        return [action.as_json() for action in retention.retention_apply(model=model(), **kwargs)]


# --- The rule ----------------------------------------------------------------------------------------

NOT_AN_OBJECT = 'a retention rule is a JSON object: {"keep_last": N, "keep_days": D, "then": "archive" or "delete"}'
KEEP_LAST = "keep_last must be a whole number from 1 to 10000"
KEEP_DAYS = "keep_days must be a whole number from 1 to 36500"
THEN = 'then must be "archive" or "delete"'


@pytest.mark.parametrize(
    ("rule", "error", "detail"),
    [
        ([], NOT_AN_OBJECT, None),
        ("keep 10", NOT_AN_OBJECT, None),
        (
            {"keep_last": 1, "keep_days": 1, "keep_size": 5, "Then": "archive"},
            "unknown key(s) in the retention rule: 'Then', 'keep_size' (a rule has keep_last, keep_days and then)",
            {"unknown": ["Then", "keep_size"]},
        ),
        ({"keep_days": 90}, "a retention rule needs keep_last", {"field": "keep_last"}),
        ({"keep_last": 10}, "a retention rule needs keep_days", {"field": "keep_days"}),
        ({"keep_last": 0, "keep_days": 90}, KEEP_LAST, {"field": "keep_last"}),
        ({"keep_last": -3, "keep_days": 90}, KEEP_LAST, {"field": "keep_last"}),
        ({"keep_last": 10_001, "keep_days": 90}, KEEP_LAST, {"field": "keep_last"}),
        ({"keep_last": True, "keep_days": 90}, KEEP_LAST, {"field": "keep_last"}),
        ({"keep_last": 2.5, "keep_days": 90}, KEEP_LAST, {"field": "keep_last"}),
        ({"keep_last": 10.0, "keep_days": 90}, KEEP_LAST, {"field": "keep_last"}),
        ({"keep_last": "10", "keep_days": 90}, KEEP_LAST, {"field": "keep_last"}),
        ({"keep_last": None, "keep_days": 90}, KEEP_LAST, {"field": "keep_last"}),
        ({"keep_last": 10, "keep_days": 0}, KEEP_DAYS, {"field": "keep_days"}),
        ({"keep_last": 10, "keep_days": 36_501}, KEEP_DAYS, {"field": "keep_days"}),
        ({"keep_last": 10, "keep_days": False}, KEEP_DAYS, {"field": "keep_days"}),
        ({"keep_last": 10, "keep_days": "90"}, KEEP_DAYS, {"field": "keep_days"}),
        ({"keep_last": 10, "keep_days": 90, "then": "purge"}, THEN, {"field": "then"}),
        ({"keep_last": 10, "keep_days": 90, "then": ""}, THEN, {"field": "then"}),
        ({"keep_last": 10, "keep_days": 90, "then": None}, THEN, {"field": "then"}),
        ({"keep_last": 10, "keep_days": 90, "then": ["delete"]}, THEN, {"field": "then"}),
    ],
)
def test_a_rule_that_is_not_one_is_refused_with_what_is_wrong(admin, registered, rule, error, detail):
    response = set_rule(admin, rule)

    assert response.status_code == 400
    assert response.json() == {"error": error, "detail": detail}
    assert model().retention is None
    assert audit("model.retention") == []
    # The preview refuses the same rule with the same words.
    assert admin.post(PREVIEW, json.dumps(rule)).json() == {"error": error, "detail": detail}


def test_the_largest_rule_is_accepted_and_then_defaults_to_archive(owner, registered):
    response = set_rule(owner, {"keep_last": 10_000, "keep_days": 36_500})

    assert response.status_code == 200, response.content
    assert response.json() == {
        "model": "demo",
        "rule": {"keep_last": 10_000, "keep_days": 36_500, "then": "archive"},
    }


def test_a_maintainer_sets_an_archive_rule_and_it_is_audited(owner, outsider, registered):
    response = set_rule(owner, {"keep_last": 10, "keep_days": 90})

    assert response.status_code == 200, response.content
    rule = {"keep_last": 10, "keep_days": 90, "then": "archive"}
    assert response.json() == {"model": "demo", "rule": rule}
    assert model().retention == rule
    (event,) = audit("model.retention")
    assert (event.actor, event.target_type, event.target, event.model_name) == ("owner", "model", "demo", "demo")
    assert (event.before, event.after) == ({"retention": None}, {"retention": rule})
    # Anyone signed in reads it, on its own and with the model.
    assert outsider.get(RETENTION).json() == {"model": "demo", "rule": rule}
    assert outsider.get("/api/v1/models/demo").json()["retention"] == rule

    # The same rule again changes nothing and writes nothing.
    assert set_rule(owner, {"keep_days": 90, "keep_last": 10, "then": "archive"}).status_code == 200
    assert len(audit("model.retention")) == 1


def test_a_viewer_cannot_set_or_remove_a_rule(owner, outsider, registered):
    assert set_rule(owner, ARCHIVE_RULE).status_code == 200

    assert error_of(set_rule(outsider, {"keep_last": 1, "keep_days": 1})) == (403, retention.NEEDS_MAINTAINER)
    assert error_of(set_rule(outsider, None)) == (403, retention.NEEDS_MAINTAINER)
    assert error_of(outsider.delete(RETENTION)) == (403, retention.NEEDS_MAINTAINER)

    assert model().retention == ARCHIVE_RULE
    assert len(audit("model.retention")) == 1
    assert [event.actor for event in audit("access.denied")] == ["outsider"] * 3


def test_a_rule_that_deletes_needs_an_admin(owner, admin, registered):
    assert error_of(set_rule(owner, DELETE_RULE)) == (403, retention.NEEDS_ADMIN)
    assert model().retention is None

    assert set_rule(admin, DELETE_RULE).json() == {"model": "demo", "rule": DELETE_RULE}
    assert model().retention == DELETE_RULE
    # Making it archive instead, or removing it, deletes less: a maintainer may.
    assert set_rule(owner, ARCHIVE_RULE).json()["rule"] == ARCHIVE_RULE
    events = audit("model.retention")
    assert [(e.actor, e.before, e.after) for e in events] == [
        ("root", {"retention": None}, {"retention": DELETE_RULE}),
        ("owner", {"retention": DELETE_RULE}, {"retention": ARCHIVE_RULE}),
    ]


def test_a_rule_is_removed_by_null_or_by_delete(owner, registered):
    assert set_rule(owner, ARCHIVE_RULE).status_code == 200
    assert set_rule(owner, None).json() == {"model": "demo", "rule": None}
    assert model().retention is None

    assert set_rule(owner, ARCHIVE_RULE).status_code == 200
    response = owner.delete(RETENTION)
    assert response.status_code == 200
    assert response.json() == {"model": "demo", "rule": None}
    assert model().retention is None
    assert [(e.before, e.after) for e in audit("model.retention")] == [
        ({"retention": None}, {"retention": ARCHIVE_RULE}),
        ({"retention": ARCHIVE_RULE}, {"retention": None}),
        ({"retention": None}, {"retention": ARCHIVE_RULE}),
        ({"retention": ARCHIVE_RULE}, {"retention": None}),
    ]
    assert error_of(owner.get("/api/v1/models/nothing/retention"))[0] == 404


def test_an_empty_body_is_no_rule(owner, registered):
    assert error_of(owner.put(RETENTION, "")) == (400, "a retention rule needs keep_last")
    response = owner.put(RETENTION, "keep_last=1", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415
    assert model().retention is None


# --- Preview -----------------------------------------------------------------------------------------


def test_preview_without_a_rule_is_a_conflict(outsider, registered):
    assert error_of(outsider.post(PREVIEW)) == (
        409,
        "model 'demo' has no retention rule; set one, or send a rule to preview",
    )
    assert error_of(outsider.post("/api/v1/models/nothing/retention/preview"))[0] == 404


def test_anyone_signed_in_previews_a_rule_before_it_is_saved(owner, outsider, registered):
    upload_versions(owner, [1.0, 2.0, 3.0])
    age(40, 1, 2, 3)

    response = outsider.post(PREVIEW, {"keep_last": 2, "keep_days": 30})

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["model"], body["rule"], body["kept"]) == ("demo", ARCHIVE_RULE, [])
    assert body["actions"] == [{"version": 1, "action": "archive", "why": why_archived(1)}]
    assert datetime.fromisoformat(body["as_of"]) <= timezone.now()
    # Nothing changed: no rule saved, nothing archived.
    assert model().retention is None
    assert version(1).archived_at is None


def test_the_preview_lists_what_the_run_does_and_the_run_does_exactly_that(owner, auditor, registered):
    """v1 goes; v2 is held; staging points at v3; canary pointed at v4 a moment ago; v5 was served 5 days ago;
    a pending promotion names v6; v7 and v8 are the two newest."""
    upload_versions(owner, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    age(40, 1, 2, 3, 4, 5, 6, 7)
    assert auditor.post("/api/v1/models/demo/versions/2/hold", {"reason": "litigation"}).status_code == 200
    assert set_alias(owner, "staging", 3).status_code == 200
    assert set_alias(owner, "canary", 4).status_code == 200
    assert set_alias(owner, "canary", 8).status_code == 200
    served = timezone.now() - timedelta(days=5)
    ModelVersion.objects.filter(model__name="demo", version=5).update(last_served_at=served)
    asked = set_alias(owner, "production", 6)
    assert asked.status_code == 202, asked.content
    assert set_rule(owner, ARCHIVE_RULE).status_code == 200

    preview = owner.post(PREVIEW).json()

    held = version(2)
    moved_away = AliasMove.objects.get(alias__name="canary", to_version__version=8).moved_at
    assert preview["rule"] == ARCHIVE_RULE
    assert preview["actions"] == [{"version": 1, "action": "archive", "why": why_archived(1)}]
    assert preview["kept"] == [
        {
            "version": 2,
            "action": "keep",
            "why": f"it is under legal hold (by audrey since {at(held.held_at)}: litigation)",
        },
        {"version": 3, "action": "keep", "why": "alias 'staging' points at it"},
        {
            "version": 4,
            "action": "keep",
            "why": f"alias 'canary' pointed at it until {at(moved_away)}, within the last 30 days",
        },
        {
            "version": 5,
            "action": "keep",
            "why": f"an inference process served it at {at(served)}, within the last 30 days",
        },
        {"version": 6, "action": "keep", "why": f"promotion request {asked.json()['id']} names it"},
    ]

    done = run()

    assert done == preview["actions"]
    assert [v.version for v in ModelVersion.objects.filter(archived_at__isnull=False)] == [1]
    archived = version(1)
    assert (archived.archived_by, archived.lifecycle) == (None, "archived")
    (event,) = audit("version.archive")
    assert (event.actor, event.target, event.after) == (
        "system",
        "demo/1",
        {"reason": "retention rule: keep_last 2, keep_days 30"},
    )
    assert artifact_path(archived).exists()  # archiving keeps the bytes
    # Run again: v1 is archived already, so nothing is left to do, and the same versions are spared.
    again = owner.post(PREVIEW).json()
    assert (again["actions"], again["kept"]) == ([], preview["kept"])
    assert run() == []


def test_a_hold_beats_a_rule_that_deletes(owner, admin, auditor, registered):
    upload_versions(owner, [1.0, 2.0, 3.0, 4.0])
    age(40, 1, 2, 3, 4)
    assert auditor.post("/api/v1/models/demo/versions/1/hold", {"reason": "litigation"}).status_code == 200
    assert set_rule(admin, DELETE_RULE).status_code == 200
    held = version(1)
    hold = f"it is under legal hold (by audrey since {at(held.held_at)}: litigation)"

    preview = admin.post(PREVIEW).json()

    assert preview["kept"] == [{"version": 1, "action": "keep", "why": hold}]
    assert preview["actions"] == [{"version": 2, "action": "delete", "why": why_archived(2, DELETE_RULE)}]
    assert run() == preview["actions"]
    held.refresh_from_db()
    assert (held.deleted_at, held.lifecycle) == (None, "active")
    assert artifact_path(held).exists()
    assert version(2).lifecycle == "deleted"

    # Released, it goes on the next run.
    assert auditor.post("/api/v1/models/demo/versions/1/release", {"reason": "settled"}).status_code == 200
    assert run() == [{"version": 1, "action": "delete", "why": why_archived(1, DELETE_RULE)}]
    assert version(1).lifecycle == "deleted"


def test_a_rule_that_deletes_removes_the_files_from_the_store_and_leaves_tombstones(owner, admin, registered):
    upload_versions(owner, [1.0, 2.0, 3.0, 4.0])
    age(40, 1, 2, 3)
    lifecycle.version_archive(version=version(2), actor=owner.actor, reason="superseded")
    paths = {number: artifact_path(version(number)) for number in (1, 2, 3, 4)}
    assert set_rule(admin, DELETE_RULE).status_code == 200
    archived_at = version(2).archived_at
    assert archived_at is not None

    done = run()

    assert done == [
        {"version": 1, "action": "delete", "why": why_archived(1, DELETE_RULE)},
        {"version": 2, "action": "delete", "why": why_archived(2, DELETE_RULE) + f"; archived since {at(archived_at)}"},
    ]
    for number in (1, 2):
        tombstone = version(number)
        assert (tombstone.lifecycle, tombstone.deleted_by, tombstone.delete_reason) == (
            "deleted",
            None,
            "retention rule: keep_last 2, keep_days 30",
        )
        assert tombstone.purged_at is not None
        assert not paths[number].exists()
        signatures = VersionSignature.objects.filter(version=tombstone).values_list("storage_key", flat=True)
        assert signatures and not any(stored(key) for key in signatures)
    assert paths[3].exists() and paths[4].exists()
    assert [(e.actor, e.target) for e in audit("version.delete")] == [("system", "demo/1"), ("system", "demo/2")]
    assert [(e.actor, e.target) for e in audit("version.purge")] == [("system", "demo/1"), ("system", "demo/2")]
    # Tombstones are not counted among the newest, and never come up again.
    assert admin.post(PREVIEW).json()["actions"] == []


def stored(key: str) -> bool:
    """Whether the local store holds ``key``."""
    return Path(django_settings.STORAGE.path, *key.split("/")).exists()


def test_a_rule_that_deletes_removes_the_objects_from_s3(owner, admin, registered, s3_settings, s3_client, s3_bucket):
    upload_versions(owner, [1.0, 2.0])
    age(40, 1, 2)
    keys = {
        number: set(ModelFile.objects.filter(version=version(number)).values_list("storage_key", flat=True))
        | set(VersionSignature.objects.filter(version=version(number)).values_list("storage_key", flat=True))
        for number in (1, 2)
    }
    assert all(keys.values())
    stored = set(bucket_objects(s3_client, s3_bucket))
    assert {f"pfx/{key}" for number in (1, 2) for key in keys[number]} <= stored
    rule = {"keep_last": 1, "keep_days": 30, "then": "delete"}
    assert set_rule(admin, rule).status_code == 200
    preview = admin.post(PREVIEW).json()

    assert run() == preview["actions"] == [{"version": 1, "action": "delete", "why": why_archived(1, rule)}]

    left = set(bucket_objects(s3_client, s3_bucket))
    assert not {f"pfx/{key}" for key in keys[1]} & left
    assert {f"pfx/{key}" for key in keys[2]} <= left
    assert version(1).purged_at is not None


# --- The windows -------------------------------------------------------------------------------------


def test_keep_last_counts_the_newest_versions_that_are_not_deleted(owner, admin, registered):
    upload_versions(owner, [1.0, 2.0, 3.0, 4.0])
    age(40, 1, 2, 3, 4)

    def planned(keep_last: int) -> list[int]:
        rule = {"keep_last": keep_last, "keep_days": 30}
        return [action.version for action in retention.retention_plan(model=model(), rule=rule).actions]

    assert planned(1) == [1, 2, 3]
    assert planned(3) == [1]
    assert planned(4) == []
    with TestCase.captureOnCommitCallbacks(execute=True):
        lifecycle.version_delete(version=version(4), actor=admin.actor, reason="broken")
    assert planned(3) == []  # v4 is a tombstone: the three newest are now v3, v2, v1
    assert planned(1) == [1, 2]


def test_keep_days_counts_from_the_creation_to_the_second(owner, registered):
    upload_versions(owner, [1.0, 2.0])
    created = version(1).created_at
    rule = {"keep_last": 1, "keep_days": 30}

    def planned(now: datetime) -> list[int]:
        return [action.version for action in retention.retention_plan(model=model(), rule=rule, now=now).actions]

    assert planned(created + timedelta(days=30)) == []  # exactly 30 days old: still kept
    assert planned(created + timedelta(days=30, seconds=1)) == [1]
    assert planned(created + timedelta(days=29)) == []


def test_an_alias_keeps_a_version_for_keep_days_after_it_moved_away(owner, registered):
    upload_versions(owner, [1.0, 2.0, 3.0])
    assert set_alias(owner, "staging", 1).status_code == 200
    assert set_alias(owner, "staging", 3).status_code == 200
    left = AliasMove.objects.get(to_version__version=3).moved_at
    age(400, 1, 2)
    rule = {"keep_last": 1, "keep_days": 30}

    def plan(now: datetime) -> tuple[list[int], list[tuple[int, str]]]:
        found = retention.retention_plan(model=model(), rule=rule, now=now)
        return [a.version for a in found.actions], [(k.version, k.why) for k in found.kept]

    assert plan(left + timedelta(days=30)) == (
        [2],
        [(1, f"alias 'staging' pointed at it until {at(left)}, within the last 30 days")],
    )
    assert plan(left + timedelta(days=30, seconds=1)) == ([1, 2], [])


def test_an_alias_moved_to_a_version_lately_keeps_it_after_the_alias_is_gone(owner, admin, registered):
    upload_versions(owner, [1.0, 2.0])
    assert set_alias(owner, "staging", 1).status_code == 200
    set_at = AliasMove.objects.get(to_version__version=1).moved_at
    # The alias points elsewhere now without a move that names v1 (its history says it was set to v1).
    Alias.objects.filter(model__name="demo", name="staging").update(version=version(2))
    age(40, 1)

    kept = retention.retention_plan(model=model(), rule={"keep_last": 1, "keep_days": 30}).kept

    assert [(k.version, k.why) for k in kept] == [
        (1, f"alias 'staging' was set to it at {at(set_at)}, within the last 30 days")
    ]


def test_a_version_served_lately_is_kept_and_the_heartbeat_stamps_it(owner, registered):
    upload_versions(owner, [1.0, 2.0])
    age(40, 1)
    worker_heartbeat(
        WorkerReport(
            worker_id="w1",
            host="host-a",
            pid=1,
            device="cpu",
            provider="CPUExecutionProvider",
            started_at=datetime(2026, 1, 1, tzinfo=UTC),
            loaded=(LoadedRow(model="demo", version=1, state=LoadState.READY),),
        )
    )
    served = version(1).last_served_at
    assert served is not None
    rule = {"keep_last": 1, "keep_days": 30}

    kept = retention.retention_plan(model=model(), rule=rule).kept
    assert [(k.version, k.why) for k in kept] == [
        (1, f"an inference process served it at {at(served)}, within the last 30 days")
    ]
    # A rule that deletes also hears that the process still has it loaded.
    kept = retention.retention_plan(model=model(), rule={**rule, "then": "delete"}).kept
    assert [(k.version, k.why) for k in kept] == [
        (
            1,
            "inference process w1 still serves it; "
            f"an inference process served it at {at(served)}, within the last 30 days",
        )
    ]
    # Served 30 days and a second before the plan's moment: outside the window.
    later = served + timedelta(days=30, seconds=1)
    assert [a.version for a in retention.retention_plan(model=model(), rule=rule, now=later).actions] == [1]


def test_a_version_whose_validation_has_not_finished_is_kept(owner, registered):
    upload_versions(owner, [1.0, 2.0, 3.0])
    age(40, 1, 2)
    ModelVersion.objects.filter(model__name="demo", version=1).update(status=VersionStatus.VALIDATING)
    ModelVersion.objects.filter(model__name="demo", version=2).update(status=VersionStatus.FAILED)

    plan = retention.retention_plan(model=model(), rule={"keep_last": 1, "keep_days": 30, "then": "delete"})

    assert [(k.version, k.why) for k in plan.kept] == [(1, "its validation has not finished (validating)")]
    assert [a.version for a in plan.actions] == [2]  # a failed version is clutter like any other


# --- The run -----------------------------------------------------------------------------------------


def test_a_version_refused_when_the_job_comes_to_it_is_reported_and_the_run_goes_on(owner, registered, monkeypatch):
    upload_versions(owner, [1.0, 2.0, 3.0])
    age(40, 1, 2)
    assert set_rule(owner, {"keep_last": 1, "keep_days": 30}).status_code == 200
    planned = retention.retention_plan

    def plan_then_alias(**kwargs: Any) -> retention.RetentionPlan:
        found = planned(**kwargs)
        assert set_alias(owner, "staging", 1).status_code == 200  # meanwhile, someone points staging at v1
        return found

    monkeypatch.setattr(retention, "retention_plan", plan_then_alias)

    done = run()

    rule = {"keep_last": 1, "keep_days": 30, "then": "archive"}
    assert done == [
        {
            "version": 1,
            "action": "archive",
            "why": why_archived(1, rule),
            "refused": "version 1 of model 'demo' cannot be archived: alias 'staging' points at it",
        },
        {
            "version": 2,
            "action": "archive",
            "why": why_archived(2, rule),
        },
    ]
    assert (version(1).archived_at, version(2).lifecycle) == (None, "archived")


def test_the_periodic_job_applies_every_models_rule(owner, admin, registered):
    create_model(owner, "other")
    create_model(owner, "norule")
    upload_versions(owner, [1.0, 2.0])
    upload_versions(owner, [1.0, 2.0], model="other")
    upload_versions(owner, [1.0, 2.0], model="norule")
    ModelVersion.objects.update(created_at=timezone.now() - timedelta(days=40))
    assert set_rule(owner, {"keep_last": 1, "keep_days": 30}).status_code == 200
    assert (
        admin.put("/api/v1/models/other/retention", {"keep_last": 1, "keep_days": 30, "then": "delete"}).status_code
        == 200
    )

    with TestCase.captureOnCommitCallbacks(execute=True):
        done = apply_retention()

    assert {name: [(a["version"], a["action"]) for a in actions] for name, actions in done.items()} == {
        "demo": [(1, "archive")],
        "other": [(1, "delete")],
    }
    states = ModelVersion.objects.order_by("model__name", "version").values_list("model__name", "version")
    assert [
        (name, number, ModelVersion.objects.get(model__name=name, version=number).lifecycle) for name, number in states
    ] == [
        ("demo", 1, "archived"),
        ("demo", 2, "active"),
        ("norule", 1, "active"),
        ("norule", 2, "active"),
        ("other", 1, "deleted"),
        ("other", 2, "active"),
    ]
    # Nothing left to do: the next run does nothing.
    assert apply_retention() == {}


def test_the_job_is_on_the_beat_schedule_hourly():
    from celery import current_app

    from registry import queueing

    entry = django_settings.CELERY_BEAT_SCHEDULE["apply-retention"]
    assert entry == {"task": "registry.tasks.apply_retention", "schedule": 3600.0}
    assert queueing.task(entry["task"]) is current_app.tasks["registry.tasks.apply_retention"]


def test_the_model_answer_carries_its_rule(owner, registered):
    assert owner.get("/api/v1/models/demo").json()["retention"] is None
    set_rule(owner, {"keep_last": 3, "keep_days": 7})
    assert owner.get("/api/v1/models/demo").json()["retention"] == {"keep_last": 3, "keep_days": 7, "then": "archive"}
    assert [m["retention"] for m in owner.get("/api/v1/models").json()["results"]] == [
        {"keep_last": 3, "keep_days": 7, "then": "archive"}
    ]


def test_the_service_refuses_a_bad_rule_as_the_api_does(owner, registered):
    with pytest.raises(InvalidInput, match=KEEP_LAST):
        retention.retention_set(model=model(), rule={"keep_last": 0, "keep_days": 1}, actor=owner.actor)
    assert model().retention is None


def _bare_versions(model: RegisteredModel, numbers: range, owner: Person) -> None:
    """Ready version rows made directly (no files): what a plan reads of them."""
    user = owner.actor.user
    ModelVersion.objects.bulk_create(
        ModelVersion(
            model=model, version=n, status=VersionStatus.READY, sha256=f"{n:064x}", size_bytes=1, created_by=user
        )
        for n in numbers
    )
    ModelVersion.objects.filter(model=model).update(created_at=timezone.now() - timedelta(days=100))


def test_a_preview_reads_the_same_number_of_queries_for_any_number_of_versions(owner, registered):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    rule = {"keep_last": 1, "keep_days": 1, "then": "delete"}
    small, large = RegisteredModel.objects.create(name="small"), RegisteredModel.objects.create(name="large")
    _bare_versions(small, range(1, 4), owner)
    _bare_versions(large, range(1, 31), owner)
    counts = []
    for model in (small, large):
        with CaptureQueriesContext(connection) as queries:
            plan = retention.retention_plan(model=model, rule=rule)
        counts.append(len(queries.captured_queries))
        assert len(plan.actions) == model.versions.count() - 1
    assert counts[0] == counts[1], counts
