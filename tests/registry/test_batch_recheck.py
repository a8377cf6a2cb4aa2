"""Versions validated before the batching check existed get their verdict from a periodic re-check.

Until then the default `auto` serves them one request per run (the safe side). The re-check validates
the stored files again in the sandbox and records only the verdict, with an audit event.
"""

from __future__ import annotations

from typing import Any

import pytest

from registry.models import AuditEvent, ModelVersion, VersionStatus
from registry.tasks import recheck_batching
from tests.support.onnx_models import add_model, first_dim_model
from tests.support.people import Person

pytestmark = pytest.mark.real_validation  # validation itself: no memo (tests/support/validation_memo.py)


def upload(person: Person, model: str, files: list[tuple[str, bytes]]) -> ModelVersion:
    response = person.upload(model, files)
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get(model__name=model, version=response.json()["version"])
    assert version.status == VersionStatus.READY, version.errors
    return version


def validated_before_the_check(version: ModelVersion) -> ModelVersion:
    """As a row written by the release before the check: ready, with no verdict and no note."""
    ModelVersion.objects.filter(pk=version.pk).update(batch_check="unchecked", batch_note="")
    version.refresh_from_db()
    assert version.batching_decision().merges is False
    return version


def test_the_recheck_records_each_verdict_and_audits_it(owner: Person, registered: str) -> None:
    safe = validated_before_the_check(upload(owner, registered, [("model.onnx", add_model().SerializeToString())]))
    unsafe = validated_before_the_check(
        upload(owner, registered, [("model.onnx", first_dim_model("softmax0").SerializeToString())])
    )

    assert recheck_batching() == [safe.pk, unsafe.pk]

    safe.refresh_from_db()
    unsafe.refresh_from_db()
    assert safe.batch_check == "safe" and safe.batching_decision().merges is True
    assert unsafe.batch_check == "unsafe" and unsafe.batching_decision().merges is False
    assert unsafe.batch_note.startswith("output 'y' of two synthetic samples run together differs from each run alone")
    assert (safe.status, unsafe.status) == (VersionStatus.READY, VersionStatus.READY)
    events = AuditEvent.objects.filter(action="version.batch_check").order_by("seq")
    assert [(e.target, e.before, e.after["batch_check"]) for e in events] == [
        (f"{registered}/1", {"batch_check": "unchecked"}, "safe"),
        (f"{registered}/2", {"batch_check": "unchecked"}, "unsafe"),
    ]
    # A second run finds nothing left to check and writes nothing.
    assert recheck_batching() == []
    assert AuditEvent.objects.filter(action="version.batch_check").count() == 2


def test_each_run_takes_at_most_its_setting_and_zero_turns_it_off(
    owner: Person, registered: str, settings: Any
) -> None:
    versions = [
        validated_before_the_check(upload(owner, registered, [("model.onnx", add_model(bias=b).SerializeToString())]))
        for b in (1.0, 2.0, 3.0)
    ]
    settings.BATCH_RECHECK_PER_RUN = 0
    assert recheck_batching() == []
    settings.BATCH_RECHECK_PER_RUN = 2
    assert recheck_batching() == [versions[0].pk, versions[1].pk]
    assert recheck_batching() == [versions[2].pk]
    assert set(ModelVersion.objects.values_list("batch_check", flat=True)) == {"safe"}


def test_a_version_whose_file_is_gone_says_why_it_was_not_checked_and_is_not_taken_again(
    owner: Person, registered: str
) -> None:
    from storage import get_storage

    version = validated_before_the_check(upload(owner, registered, [("model.onnx", add_model().SerializeToString())]))
    get_storage().delete(version.model_file.storage_key)

    assert recheck_batching() == [version.pk]

    version.refresh_from_db()
    assert version.batch_check == "unchecked"
    assert version.batch_note.startswith(
        "the batching check could not run: validation now says: a stored file of this version is missing"
    )
    assert version.batching_decision().merges is False
    assert recheck_batching() == []


@pytest.mark.parametrize("check", ["safe", "unsafe", "no-batch-dimension"])
def test_versions_with_a_verdict_are_left_alone(owner: Person, registered: str, check: str) -> None:
    version = upload(owner, registered, [("model.onnx", add_model().SerializeToString())])
    ModelVersion.objects.filter(pk=version.pk).update(batch_check=check, batch_note="found at upload")
    assert recheck_batching() == []
    version.refresh_from_db()
    assert (version.batch_check, version.batch_note) == (check, "found at upload")
