"""A version's lineage (training run, commit, datasets, parent): set on upload, changed later by its uploader or an
admin, every bad value refused with its own message, every change audited.

A parent its uploader names is their word: the registry signs no derivation statement for it, so it never lends
a signed parent's trust to the child.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.utils import timezone

from registry.models import AuditEvent, ModelVersion, Role, SignatureKind
from storage import get_storage
from tests.support.onnx_models import add_model_bytes
from tests.support.people import Person, make_person
from tests.support.registry import create_model, upload_versions

pytestmark = pytest.mark.django_db

RUN = "https://mlflow.example.com/#/experiments/3/runs/9f1c"
COMMIT = "4F2A9C1D0E8B7A6954321F0E9D8C7B6A5F4E3D2C"
DATASETS = [{"name": "imagenet-1k", "digest": "sha256:0c1d"}, {"name": "extra=labels", "digest": "md5:aa=="}]
URL = "/api/v1/models/demo/versions"


@pytest.fixture
def admin(db: None) -> Person:
    return make_person("root", Role.ADMIN)


@pytest.fixture
def other(db: None) -> Person:
    """A maintainer who did not upload the versions."""
    return make_person("max", Role.MAINTAINER)


def upload(person: Person, bias: float, **fields: Any) -> Any:
    return person.upload("demo", [("model.onnx", add_model_bytes(bias=bias))], **fields)


def audited(action: str) -> list[tuple[str, str, Any, Any]]:
    return [(e.actor, e.target, e.before, e.after) for e in AuditEvent.objects.filter(action=action)]


def delete_row(version: ModelVersion) -> None:
    """A tombstone, as the delete service leaves it (its own tests are tests/registry/test_version_delete*.py)."""
    ModelVersion.objects.filter(pk=version.pk).update(deleted_at=timezone.now(), delete_reason="licence withdrawn")


# --- On upload -------------------------------------------------------------------------------------------


def test_an_upload_records_its_lineage_and_audits_it(owner):
    create_model(owner)
    upload_versions(owner, [1.0])
    response = upload(
        owner,
        2.0,
        source_run_url=f"  {RUN} ",
        source_commit=COMMIT,
        source_datasets=json.dumps(DATASETS),
        parent="1",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["source_run_url"], body["source_commit"], body["source_datasets"], body["derived_from"]) == (
        RUN,
        COMMIT.lower(),
        DATASETS,
        1,
    )
    assert body["recipe"] == {}
    version = ModelVersion.objects.get(version=2)
    assert (version.derived_from.version, version.source_commit, version.status) == (1, COMMIT.lower(), "ready")
    event = AuditEvent.objects.filter(action="version.upload").last()
    assert (event.target, event.after["parent"], event.after["source_run_url"]) == ("demo/2", 1, RUN)
    assert (event.after["source_commit"], event.after["source_datasets"]) == (COMMIT.lower(), DATASETS)


def test_lineage_fields_sent_empty_as_a_browser_sends_them_set_nothing(owner):
    create_model(owner)
    response = upload(owner, 1.0, source_run_url="", source_commit=" ", source_datasets="", parent="")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["source_run_url"], body["source_commit"], body["source_datasets"], body["derived_from"]) == (
        "",
        "",
        [],
        None,
    )
    event = AuditEvent.objects.get(action="version.upload")
    assert not {"source_run_url", "source_commit", "source_datasets", "parent"} & set(event.after)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"source_run_url": "ftp://example.com/run/1"}, "source_run_url: must be an http or https URL"),
        ({"source_run_url": "run 42"}, "source_run_url: must be an http or https URL"),
        ({"source_run_url": "https://"}, "source_run_url: must be an http or https URL"),
        ({"source_run_url": "https://e.com/" + "a" * 2040}, "source_run_url: at most 2048 characters, got 2054"),
        ({"source_commit": "4f2a9c"}, "source_commit: must be a commit hash: 7 to 64 hexadecimal characters"),
        ({"source_commit": "main"}, "source_commit: must be a commit hash: 7 to 64 hexadecimal characters"),
        ({"source_commit": "a" * 65}, "source_commit: must be a commit hash: 7 to 64 hexadecimal characters"),
        (
            {"source_datasets": "[{"},
            "source_datasets: not valid JSON: Expecting property name enclosed in double quotes: "
            "line 1 column 3 (char 2)",
        ),
        (
            {"source_datasets": '{"name": "a", "digest": "b"}'},
            'source_datasets: must be a JSON list of objects {"name": ..., "digest": ...}',
        ),
        (
            {"source_datasets": '[{"name": "a"}]'},
            'source_datasets: item 1 must be an object with a "name" and a "digest", and nothing else',
        ),
        (
            {"source_datasets": '[{"name": "a", "digest": "b"}, {"name": "a", "digest": "b", "size": 3}]'},
            'source_datasets: item 2 must be an object with a "name" and a "digest", and nothing else',
        ),
        (
            {"source_datasets": '[{"name": " ", "digest": "b"}]'},
            'source_datasets: item 1: its "name" and "digest" must be text, not empty',
        ),
        (
            {"source_datasets": '[{"name": 7, "digest": "b"}]'},
            'source_datasets: item 1: its "name" and "digest" must be text, not empty',
        ),
        (
            {"source_datasets": json.dumps([{"name": "n" * 257, "digest": "b"}])},
            'source_datasets: item 1: its "name" and "digest" may have at most 256 characters',
        ),
        (
            {"source_datasets": json.dumps([{"name": f"d{i}", "digest": "x"} for i in range(51)])},
            "source_datasets: at most 50 datasets (MODELYARD_MAX_SOURCE_DATASETS), got 51",
        ),
        ({"parent": "one"}, "parent: must be a version number"),
        ({"parent": "0"}, "parent: must be a version number"),
        ({"parent": "-1"}, "parent: must be a version number"),
        ({"parent": "9"}, "parent: model 'demo' has no version 9"),
        (
            {"source_commit": "xyz", "parent": "1.5"},
            "source_commit: must be a commit hash: 7 to 64 hexadecimal characters; parent: must be a version number",
        ),
        (
            {"metadata": "[]", "source_run_url": "x"},
            "metadata: metadata must be a JSON object; source_run_url: must be an http or https URL",
        ),
    ],
)
def test_a_bad_lineage_value_refuses_the_upload_and_stores_nothing(owner, fields, error):
    create_model(owner)
    upload_versions(owner, [1.0])
    stored = sorted(obj.key for obj in get_storage().list())
    response = upload(owner, 2.0, **fields)
    assert response.status_code == 400
    assert response.json()["error"] == error
    assert list(ModelVersion.objects.values_list("version", flat=True)) == [1]
    assert sorted(obj.key for obj in get_storage().list()) == stored
    assert len(audited("version.upload")) == 1


def test_the_datasets_limit_is_a_setting_named_in_the_refusal(owner, settings):
    settings.MAX_SOURCE_DATASETS = 2
    create_model(owner)
    three = json.dumps([{"name": f"d{i}", "digest": "x"} for i in range(3)])
    response = upload(owner, 1.0, source_datasets=three)
    assert (response.status_code, response.json()["error"]) == (
        400,
        "source_datasets: at most 2 datasets (MODELYARD_MAX_SOURCE_DATASETS), got 3",
    )
    assert response.json()["detail"] == {
        "source_datasets": ["at most 2 datasets (MODELYARD_MAX_SOURCE_DATASETS), got 3"]
    }
    two = json.dumps([{"name": f"d{i}", "digest": "x"} for i in range(2)])
    assert upload(owner, 1.0, source_datasets=two).status_code == 201


def test_a_deleted_version_cannot_be_named_as_a_parent(owner):
    create_model(owner)
    [first] = upload_versions(owner, [1.0])
    delete_row(first)
    response = upload(owner, 2.0, parent="1")
    assert (response.status_code, response.json()["error"]) == (400, "parent: version 1 of model 'demo' is deleted")
    assert ModelVersion.objects.count() == 1


def test_a_named_parent_gets_no_signed_derivation_statement(owner):
    """Only what the registry derived is signed as derived; a parent the uploader names lends the child nothing."""
    create_model(owner)
    upload_versions(owner, [1.0])
    assert upload(owner, 2.0, parent="1").status_code == 201
    child = ModelVersion.objects.get(version=2)
    assert child.status == "ready" and child.derived_from is not None
    assert list(child.signatures.values_list("kind", flat=True)) == [SignatureKind.REGISTRY]
    provenance = owner.get(f"{URL}/2/provenance").json()
    assert provenance["derivation"] is None


# --- Changed later -----------------------------------------------------------------------------------------


@pytest.fixture
def three(owner) -> list[ModelVersion]:
    create_model(owner)
    return upload_versions(owner, [1.0, 2.0, 3.0])


def test_the_uploader_sets_the_lineage_later_and_only_the_changes_are_audited(owner, three):
    response = owner.patch(
        f"{URL}/3",
        {"source_run_url": RUN, "source_commit": COMMIT, "source_datasets": DATASETS, "parent": 2},
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["source_run_url"], body["source_commit"], body["source_datasets"], body["derived_from"]) == (
        RUN,
        COMMIT.lower(),
        DATASETS,
        2,
    )
    assert audited("version.lineage") == [
        (
            "owner",
            "demo/3",
            {"source_run_url": "", "source_commit": "", "source_datasets": [], "parent": None},
            {"source_run_url": RUN, "source_commit": COMMIT.lower(), "source_datasets": DATASETS, "parent": 2},
        )
    ]
    # The same values again, and one changed: only that one is written and audited.
    again = owner.patch(f"{URL}/3", {"source_run_url": RUN, "parent": 1, "description": "fine-tuned"})
    assert again.status_code == 200, again.content
    assert audited("version.lineage")[-1][2:] == ({"parent": 2}, {"parent": 1})
    assert audited("version.update")[-1][2:] == ({"description": ""}, {"description": "fine-tuned"})
    # Cleared: "" for a text, [] for the datasets, null for the parent.
    cleared = owner.patch(
        f"{URL}/3", {"source_run_url": "", "source_commit": "", "source_datasets": [], "parent": None}
    )
    assert cleared.status_code == 200, cleared.content
    version = ModelVersion.objects.get(version=3)
    assert (version.source_run_url, version.source_commit, version.source_datasets, version.derived_from) == (
        "",
        "",
        [],
        None,
    )
    assert audited("version.lineage")[-1][3] == {
        "source_run_url": "",
        "source_commit": "",
        "source_datasets": [],
        "parent": None,
    }
    assert len(audited("version.lineage")) == 3


def test_an_admin_may_change_anyones_lineage(owner, admin, three):
    response = admin.patch(f"{URL}/2", {"parent": 1, "source_commit": "abcdef0"})
    assert response.status_code == 200, response.content
    assert audited("version.lineage") == [
        ("root", "demo/2", {"source_commit": "", "parent": None}, {"source_commit": "abcdef0", "parent": 1})
    ]


def test_another_maintainer_may_not_change_the_lineage_but_still_edits_the_description(owner, other, three):
    response = other.patch(f"{URL}/2", {"parent": 1, "description": "mine now"})
    assert response.status_code == 403
    assert response.json()["error"] == (
        "only its uploader (owner) or an admin may change the lineage of version 2 of model 'demo'"
    )
    version = ModelVersion.objects.get(version=2)
    assert (version.derived_from, version.description) == (None, "")  # nothing of the request was kept
    assert audited("version.lineage") == [] and audited("version.update") == []
    denied = AuditEvent.objects.get(action="access.denied")
    assert (denied.actor, denied.target) == ("max", "PATCH /api/v1/models/demo/versions/2")
    # The description alone is a maintainer's to edit, and lineage sent unchanged changes nothing.
    allowed = other.patch(f"{URL}/2", {"description": "mine now", "parent": None, "source_run_url": ""})
    assert allowed.status_code == 200, allowed.content
    assert audited("version.update")[-1][0] == "max" and audited("version.lineage") == []


def test_a_viewer_may_not_change_the_lineage(owner, outsider, three):
    response = outsider.patch(f"{URL}/2", {"parent": 1})
    assert (response.status_code, response.json()["error"]) == (403, "this action needs the maintainer or admin role")
    assert ModelVersion.objects.get(version=2).derived_from is None


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"parent": 2}, "parent: must be an earlier version than 2, got 2"),
        ({"parent": 3}, "parent: must be an earlier version than 2, got 3"),
        ({"parent": "one"}, "parent: must be a version number"),
        ({"parent": 0}, "parent: must be a version number"),
        ({"parent": True}, "parent: must be a version number"),
        ({"source_run_url": "javascript:alert(1)"}, "source_run_url: must be an http or https URL"),
        ({"source_run_url": ["https://e.com"]}, "source_run_url: Not a valid string."),
        ({"source_commit": "g" * 40}, "source_commit: must be a commit hash: 7 to 64 hexadecimal characters"),
        (
            {"source_datasets": "imagenet"},
            'source_datasets: must be a JSON list of objects {"name": ..., "digest": ...}',
        ),
        (
            {"source_datasets": [{"name": "a", "digest": None}]},
            'source_datasets: item 1: its "name" and "digest" must be text, not empty',
        ),
    ],
)
def test_bad_lineage_edits_are_400_and_change_nothing(owner, three, body, error):
    response = owner.patch(f"{URL}/2", body)
    assert response.status_code == 400, response.content
    assert response.json()["error"] == error
    version = ModelVersion.objects.get(version=2)
    assert (version.derived_from, version.source_run_url, version.source_commit) == (None, "", "")
    assert audited("version.lineage") == []


def test_a_parent_must_exist_and_not_be_deleted(owner, three):
    assert owner.patch(f"{URL}/3", {"parent": 1}).status_code == 200
    delete_row(three[1])
    response = owner.patch(f"{URL}/3", {"parent": 2})
    assert (response.status_code, response.json()["error"]) == (400, "parent: version 2 of model 'demo' is deleted")
    gone = owner.patch("/api/v1/models/demo/versions/9", {"parent": 1})
    assert gone.status_code == 404
    assert ModelVersion.objects.get(version=3).derived_from.version == 1


def test_a_derived_versions_parent_is_the_registrys_record_and_does_not_change(owner, three):
    ModelVersion.objects.filter(version=3).update(derived_from=three[0], recipe={"recipe": "fp16"})
    response = owner.patch(f"{URL}/3", {"parent": 2})
    assert response.status_code == 409
    assert response.json()["error"] == (
        "version 3 of model 'demo' was derived from version 1 by the registry (fp16); its parent does not change"
    )
    # Its other lineage fields are its uploader's to set.
    assert owner.patch(f"{URL}/3", {"source_commit": "abcdef0", "parent": 1}).status_code == 200


def test_the_lineage_of_a_tombstone_does_not_change(owner, three):
    delete_row(three[2])
    response = owner.patch(f"{URL}/3", {"source_commit": "abcdef0"})
    assert (response.status_code, response.json()["error"]) == (
        409,
        "version 3 of model 'demo' is deleted: its lineage no longer changes",
    )


def test_a_form_edit_with_the_lineage_fields_empty_changes_nothing_of_them(owner, three):
    owner.patch(f"{URL}/2", {"parent": 1, "source_datasets": DATASETS})
    response = owner.client.patch(
        f"{URL}/2",
        "source_run_url=&source_commit=&source_datasets=&description=x",
        content_type="application/x-www-form-urlencoded",
        HTTP_AUTHORIZATION=f"Bearer {owner.token}",
    )
    assert response.status_code == 200, response.content
    version = ModelVersion.objects.get(version=2)
    assert (version.derived_from.version, version.source_datasets, version.description) == (1, DATASETS, "x")
