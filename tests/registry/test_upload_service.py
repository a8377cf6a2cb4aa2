"""The upload service itself, without HTTP: every check applies to a local upload as to the API's.

``modelyard demo``, ``bench/`` and the tests upload this way; the API's multipart view and the
coming UI form feed the same service (tests/registry/test_version_upload.py covers the API).
"""

from __future__ import annotations

import hashlib
import io
import math
from datetime import UTC, datetime

import pytest
from django.test import TestCase

from onnxkit.validation import runtime_limits
from registry import tasks
from registry.errors import (
    FormTooLarge,
    InvalidInput,
    NotAnOnnxModel,
    PayloadTooLarge,
    StorageDown,
    TooManyFiles,
    UnsupportedModel,
)
from registry.models import AuditEvent, ModelFile, ModelVersion, RegisteredModel, VersionStatus
from registry.uploads import LocalUpload, version_upload
from storage import get_storage
from storage.base import CHUNK_SIZE
from tests.support.onnx_models import add_model_bytes
from tests.support.s3 import closed_port_url
from tests.support.uploads import stored_keys, upload_local

pytestmark = pytest.mark.django_db


def refused(registered: str, owner, parts, **fields) -> Exception:
    """Upload through the service, expecting a refusal that leaves no version, no file row and no stored object."""
    with pytest.raises(Exception) as caught:
        upload_local(registered, parts, actor=owner.actor, **fields)
    assert ModelVersion.objects.count() == 0
    assert ModelFile.objects.count() == 0
    assert RegisteredModel.objects.get(name=registered).last_version == 0
    assert stored_keys() == []
    return caught.value


def test_a_local_upload_is_stored_recorded_audited_and_validated(owner, registered, tmp_path):
    model = add_model_bytes()
    tokenizer = tmp_path / "vocab.json"
    tokenizer.write_bytes(b'{"v": 1}')

    version = upload_local(
        registered,
        [("model.onnx", model), ("vocab.json", tokenizer)],
        actor=owner.actor,
        description="  first  ",
        metadata={"run": "42"},
    )

    assert (version.version, version.status) == (1, VersionStatus.READY)
    assert (version.description, version.metadata) == ("first", {"run": "42"})
    assert version.sha256 == hashlib.sha256(model).hexdigest()
    assert version.size_bytes == len(model) + 8
    files = {f.name: f for f in version.files.all()}
    assert [(f.name, f.role) for f in version.files.all()] == [("model.onnx", "model"), ("vocab.json", "extra")]
    with get_storage().open(files["model.onnx"].storage_key) as stored:
        assert stored.read() == model
    assert files["model.onnx"].storage_key.startswith(f"artifacts/{registered}/")
    event = AuditEvent.objects.get(action="version.upload")
    assert (event.actor, event.target) == ("owner", f"{registered}/1")


def test_validation_is_queued_once_the_version_is_committed_and_not_for_a_refusal(owner, registered, monkeypatch):
    queued: list[int] = []
    monkeypatch.setattr(tasks, "validation_enqueue", queued.append)
    model = RegisteredModel.objects.get(name=registered)

    with TestCase.captureOnCommitCallbacks(execute=False) as callbacks:
        version = version_upload(model=model, source=LocalUpload([("m.onnx", add_model_bytes())]), actor=owner.actor)
        assert queued == []  # not before the commit
    for callback in callbacks:
        callback()
    assert queued == [version.pk]

    with pytest.raises(InvalidInput):
        version_upload(model=model, source=LocalUpload([("m.bin", b"x")]), actor=owner.actor)
    assert queued == [version.pk]


@pytest.mark.parametrize(
    ("parts", "error"),
    [
        ([("weights.bin", b"1234")], "the first file must be the .onnx model, got 'weights.bin'"),
        ([("model.onnx", add_model_bytes()), ("model.onnx", b"x")], "the file 'model.onnx' was sent twice"),
        (
            [(".hidden.onnx", add_model_bytes())],
            "invalid file name '.hidden.onnx': use letters, digits, '.', '_' and '-', starting with a letter or digit",
        ),
        (
            [("model.onnx", add_model_bytes()), ("../escape.bin", b"x")],
            "invalid file name '../escape.bin': use letters, digits, '.', '_' and '-', starting with a letter or digit",
        ),
        ([], "no files: send the .onnx model as a multipart 'file' part"),
    ],
    ids=["onnx-not-first", "duplicate", "hidden", "path", "none"],
)
def test_file_names_are_checked(owner, registered, parts, error):
    exc = refused(registered, owner, parts)
    assert type(exc) is InvalidInput
    assert exc.message == error


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", "'model.onnx': the file is empty"),
        (b"hello, I am plain text\n", "'model.onnx': the file is not an ONNX model"),
        (add_model_bytes()[:-7], "'model.onnx': the file is truncated"),
    ],
    ids=["empty", "not-onnx", "truncated"],
)
def test_the_model_file_must_be_onnx(owner, registered, data, error):
    exc = refused(registered, owner, [("model.onnx", data), ("tokenizer.json", b"{}")])
    assert isinstance(exc, NotAnOnnxModel)
    assert exc.message.startswith(error)


def test_an_ir_version_newer_than_the_runtime_is_refused(owner, registered):
    limits = runtime_limits()
    too_new = limits.max_ir_version + 1
    exc = refused(registered, owner, [("model.onnx", add_model_bytes(ir_version=too_new))])
    assert isinstance(exc, UnsupportedModel)
    assert exc.message == (
        f"'model.onnx': IR version {too_new} is newer than ONNX Runtime {limits.ort_version} supports "
        f"(IR version {limits.max_ir_version} at most). Save the model with ir_version={limits.max_ir_version} "
        f"or lower, for example onnx.helper.make_model(graph, ir_version={limits.max_ir_version})."
    )


def test_an_opset_newer_than_the_runtime_is_refused_before_the_other_files_are_stored(owner, registered):
    limits = runtime_limits()
    read: list[str] = []

    class Tracked(io.BytesIO):
        def read(self, n: int | None = -1) -> bytes:
            read.append("extra")
            return super().read(n)

    parts = [("model.onnx", add_model_bytes(opset=limits.max_opset + 1)), ("extra.bin", Tracked(b"x"))]
    exc = refused(registered, owner, parts)
    assert isinstance(exc, UnsupportedModel)
    assert exc.message == (
        f"'model.onnx': opset {limits.max_opset + 1} of the default ONNX domain is newer than ONNX Runtime "
        f"{limits.ort_version} supports (opset {limits.max_opset} at most). Export with "
        f"opset_version={limits.max_opset} or lower."
    )
    assert read == []


def test_the_upload_size_limit_counts_every_file(owner, registered, settings):
    settings.MAX_UPLOAD_BYTES = 1000
    exc = refused(registered, owner, [("model.onnx", add_model_bytes()), ("big.bin", b"\0" * 5000)])
    assert type(exc) is PayloadTooLarge
    assert exc.message == "the upload is larger than the limit of 1000 bytes"


def test_the_file_count_limit_applies(owner, registered, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FILES = 2
    parts = [("model.onnx", add_model_bytes()), ("a.bin", b"a"), ("b.bin", b"b")]
    exc = refused(registered, owner, parts)
    assert isinstance(exc, TooManyFiles)
    assert (exc.message, exc.detail) == (
        "too many files: an upload may have at most 2 (MODELYARD_MAX_UPLOAD_FILES)",
        {"limit": 2},
    )


def test_the_form_size_limit_applies_to_description_and_metadata(owner, registered, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    exc = refused(registered, owner, [("model.onnx", add_model_bytes())], metadata={"notes": "n" * 2000})
    assert isinstance(exc, FormTooLarge)
    assert (exc.message, exc.detail) == (
        "the form fields are larger than the limit of 1024 bytes (MODELYARD_MAX_FORM_BYTES)",
        {"limit": 1024},
    )


def deep(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"metadata": [1, 2]}, "metadata: metadata must be a JSON object"),
        ({"metadata": "[1, 2]"}, "metadata: metadata must be a JSON object"),
        ({"metadata": "{"}, "metadata: not valid JSON: Expecting property name enclosed in double quotes"),
        ({"metadata": deep(70)}, "metadata: not valid JSON: nested deeper than 64 levels (MODELYARD_MAX_JSON_DEPTH)"),
        ({"metadata": {"run": "a\x00b"}}, "metadata: not valid JSON: strings may not contain NUL (\\u0000)"),
        ({"metadata": {"loss": math.nan}}, "metadata: not valid JSON: Out of range float values are not JSON"),
        ({"metadata": {"at": datetime(2026, 1, 1, tzinfo=UTC)}}, "metadata: not valid JSON: Object of type datetime"),
        ({"description": "d" * 10_001}, "description: Ensure this field has no more than 10000 characters."),
        ({"description": "a\x00b"}, "description: Null characters are not allowed."),
    ],
    ids=["list", "list-text", "bad-text", "deep", "nul", "nan", "not-json", "long-description", "nul-description"],
)
def test_description_and_metadata_are_checked(owner, registered, fields, error):
    exc = refused(registered, owner, [("model.onnx", add_model_bytes())], **fields)
    assert type(exc) is InvalidInput
    assert exc.message.startswith(error)


def test_metadata_sent_as_json_text_is_parsed(owner, registered):
    version = upload_local(registered, [("model.onnx", add_model_bytes())], actor=owner.actor, metadata='{"run": 7}')
    assert version.metadata == {"run": 7}


def test_storage_that_cannot_be_reached_is_storage_down(owner, registered, s3_settings):
    s3_settings.S3_ENDPOINT_URL = closed_port_url()
    s3_settings.S3_MAX_ATTEMPTS = 1
    s3_settings.S3_CONNECT_TIMEOUT = 0.5
    get_storage.cache_clear()
    with pytest.raises(StorageDown) as caught:
        upload_local(registered, [("model.onnx", add_model_bytes())], actor=owner.actor)
    assert caught.value.message.startswith(
        "artifact storage is unavailable: S3 request failed: Could not connect to the endpoint URL"
    )
    assert ModelVersion.objects.count() == 0


def test_a_source_that_fails_mid_file_leaves_nothing_and_its_error_passes(owner, registered):
    class Failing(io.BytesIO):
        def read(self, n: int | None = -1) -> bytes:
            if self.tell() > 0:
                raise OSError("the disk went away")
            return super().read(4)

    with pytest.raises(OSError, match="the disk went away"):
        upload_local(
            registered, [("model.onnx", add_model_bytes()), ("data.bin", Failing(b"x" * 100))], actor=owner.actor
        )
    assert ModelVersion.objects.count() == 0
    assert stored_keys() == []


def test_files_are_read_in_bounded_pieces_not_whole(owner, registered):
    asked: list[int | None] = []

    class Recording(io.BytesIO):
        def read(self, n: int | None = -1) -> bytes:
            asked.append(n)
            return super().read(n)

    extra = b"e" * (3 * CHUNK_SIZE + 5)
    version = upload_local(
        registered, [("model.onnx", add_model_bytes()), ("extra.bin", Recording(extra))], actor=owner.actor
    )
    assert version.status == VersionStatus.READY
    assert asked and all(n is not None and 0 < n <= CHUNK_SIZE for n in asked)
    with get_storage().open(version.files.get(name="extra.bin").storage_key) as stored:
        assert stored.read() == extra
