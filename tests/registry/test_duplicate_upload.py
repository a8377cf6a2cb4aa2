"""An upload whose files are byte for byte a version's of the same model is refused (409, naming it) unless
``?allow_duplicate=true``, and nothing of it stays in the store: on the local folder and on S3 (moto over HTTP).

The same names and the same bytes make a duplicate (by the digests computed while the files streamed); another
file name, another extra, a deleted version's bytes, or a version the registry derived do not.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import TestCase

from registry import services
from registry.derive.services import derive_claim, derive_request
from registry.errors import Conflict
from registry.lifecycle.lineage import duplicate_of
from registry.models import AuditEvent, ModelVersion, RegisteredModel
from registry.uploads import LocalUpload, version_upload
from storage import get_storage
from tests.support.onnx_models import add_model_bytes
from tests.support.people import Person
from tests.support.registry import create_model
from tests.support.s3 import bucket_objects

pytestmark = pytest.mark.django_db

MODEL = add_model_bytes(bias=1.0)
LABELS = b"cat\ndog\n"
REFUSED = (
    "these bytes are already version 1 of model 'demo' (the same files, byte for byte); "
    "send allow_duplicate=true to upload them again"
)


def upload(person: Person, files: list[tuple[str, bytes]], query: str = "", **fields: Any) -> Any:
    return person.upload("demo", files, query=query, **fields)


def stored_keys() -> list[str]:
    return sorted(obj.key for obj in get_storage().list())


@pytest.fixture
def first(owner: Person) -> ModelVersion:
    create_model(owner)
    response = upload(owner, [("model.onnx", MODEL), ("labels.txt", LABELS)])
    assert response.status_code == 201, response.content
    return ModelVersion.objects.get(version=1)


def check_refused_then_allowed(owner: Person) -> None:
    before = stored_keys()
    refused = upload(owner, [("model.onnx", MODEL), ("labels.txt", LABELS)], description="again")
    assert refused.status_code == 409
    assert refused.json() == {"error": REFUSED, "detail": {"version": 1}}
    assert list(ModelVersion.objects.values_list("version", flat=True)) == [1]
    assert stored_keys() == before  # nothing of the refused upload stayed
    assert AuditEvent.objects.filter(action="version.upload").count() == 1
    assert RegisteredModel.objects.get(name="demo").last_version == 1  # no number was used up

    allowed = upload(owner, [("model.onnx", MODEL), ("labels.txt", LABELS)], query="?allow_duplicate=true")
    assert allowed.status_code == 201, allowed.content
    assert allowed.json()["version"] == 2 and allowed.json()["sha256"] == ModelVersion.objects.get(version=1).sha256
    assert len(stored_keys()) > len(before)


def test_identical_bytes_are_refused_naming_the_version_and_allowed_on_request(owner, first):
    check_refused_then_allowed(owner)


def test_identical_bytes_are_refused_on_s3_and_leave_no_object_behind(owner, s3_settings, s3_client, s3_bucket):
    create_model(owner)
    assert upload(owner, [("model.onnx", MODEL), ("labels.txt", LABELS)]).status_code == 201
    objects = bucket_objects(s3_client, s3_bucket)
    assert len(objects) == 3  # the two files and the registry's signature

    check_refused_then_allowed(owner)

    after = bucket_objects(s3_client, s3_bucket)
    assert len(after) == 6 and set(objects) < set(after)  # version 2's three, and no leftover of the refused one


def test_another_name_another_extra_or_one_file_fewer_is_not_a_duplicate(owner, first):
    for number, files in enumerate(
        (
            [("net.onnx", MODEL), ("labels.txt", LABELS)],
            [("model.onnx", MODEL), ("labels.txt", b"cat\ndog\nbird\n")],
            [("model.onnx", MODEL)],
            [("model.onnx", MODEL), ("labels.txt", LABELS), ("README.md", b"hello")],
        ),
        start=2,
    ):
        response = upload(owner, files)
        assert (response.status_code, response.json().get("version")) == (201, number), response.content


def test_the_oldest_identical_version_is_named(owner, first):
    assert upload(owner, [("model.onnx", MODEL), ("labels.txt", LABELS)], query="?allow_duplicate=1").status_code == 201
    refused = upload(owner, [("model.onnx", MODEL), ("labels.txt", LABELS)])
    assert (refused.status_code, refused.json()["detail"]) == (409, {"version": 1})


def test_a_deleted_versions_bytes_may_be_uploaded_again(owner, first):
    ModelVersion.objects.filter(pk=first.pk).update(deleted_by=first.created_by, delete_reason="mistake")
    ModelVersion.objects.filter(pk=first.pk).update(deleted_at=first.created_at)
    response = upload(owner, [("model.onnx", MODEL), ("labels.txt", LABELS)])
    assert (response.status_code, response.json().get("version")) == (201, 2), response.content


@pytest.mark.parametrize("value", ["", "false", "0", "no"])
def test_allow_duplicate_false_or_sent_empty_refuses(owner, first, value):
    response = upload(owner, [("model.onnx", MODEL), ("labels.txt", LABELS)], query=f"?allow_duplicate={value}")
    assert (response.status_code, response.json()["error"]) == (409, REFUSED)


def test_a_bad_allow_duplicate_is_400_before_anything_is_stored(owner, first):
    before = stored_keys()
    response = upload(owner, [("model.onnx", add_model_bytes(bias=5.0))], query="?allow_duplicate=maybe")
    assert response.status_code == 400
    assert response.json() == {
        "error": "allow_duplicate: must be true or false, got 'maybe'",
        "detail": {"field": "allow_duplicate"},
    }
    assert stored_keys() == before
    assert ModelVersion.objects.count() == 1


def test_the_upload_service_refuses_a_duplicate_for_every_caller(owner, first):
    model = RegisteredModel.objects.get(name="demo")
    before = stored_keys()
    source = LocalUpload([("model.onnx", MODEL), ("labels.txt", LABELS)])
    with pytest.raises(Conflict) as refused:
        version_upload(model=model, source=source, actor=owner.actor)
    assert (refused.value.message, refused.value.detail) == (REFUSED, {"version": 1})
    assert stored_keys() == before
    assert duplicate_of(model, list(first.files.all())) == first


def test_a_derived_version_with_its_parents_bytes_is_kept(owner, first):
    """A derivation the registry ran on request records what an upload would not (parent, recipe, delta): kept."""
    job = derive_request(version=first, recipe="ort-optimized", options={}, actor=owner.actor)
    assert derive_claim(job_id=job.pk)
    derivation = services.Derivation(parent=first, recipe={"recipe": "ort-optimized"}, accuracy={}, job_id=job.pk)
    with TestCase.captureOnCommitCallbacks(execute=True):
        version = version_upload(
            model=first.model,
            source=LocalUpload([("model.onnx", MODEL), ("labels.txt", LABELS)]),
            actor=owner.actor,
            derivation=derivation,
        )
    assert (version.version, version.derived_from_id, version.sha256) == (2, first.pk, first.sha256)
