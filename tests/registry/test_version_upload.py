"""Uploading versions through the API: the happy path, the stored bytes, and every refusal."""

from __future__ import annotations

import hashlib

import pytest

from registry.models import AuditEvent, ModelFile, ModelVersion
from storage import get_storage
from tests.support.onnx_models import add_model_bytes
from tests.support.uploads import stored_keys

pytestmark = pytest.mark.django_db


def test_upload_stores_bytes_and_ends_ready_with_signature(owner, registered):
    data = add_model_bytes()
    response = owner.upload(registered, [("model.onnx", data), ("vocab.json", b'{"v": 1}')], description="first")

    assert response.status_code == 201, response.content
    assert response.json()["version"] == 1
    assert response.json()["status"] in {"pending", "ready"}  # ready when tasks run in-process
    body = owner.get(f"/api/v1/models/{registered}/versions/1").json()
    assert body["status"] == "ready"
    assert body["sha256"] == hashlib.sha256(data).hexdigest()
    assert body["size_bytes"] == len(data) + 8
    assert body["signature"] == {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
    }
    assert body["ir_version"] == 10
    assert body["opset"] == [{"domain": "ai.onnx", "version": 17}]
    assert body["producer"] == {"name": "modelyard-tests", "version": ""}
    assert [(f["name"], f["role"]) for f in body["files"]] == [("model.onnx", "model"), ("vocab.json", "extra")]
    assert body["created_by"] == "owner"

    model_file = ModelFile.objects.get(version__version=1, name="model.onnx")
    with get_storage().open(model_file.storage_key) as stored:
        assert stored.read() == data
    actions = list(AuditEvent.objects.values_list("action", flat=True))
    assert actions[-3:] == ["model.create", "version.upload", "version.validate"]


def test_versions_number_from_one_per_model(owner, registered):
    owner.post("/api/v1/models", {"name": "other"})
    assert owner.upload(registered, [("m.onnx", add_model_bytes())]).json()["version"] == 1
    assert owner.upload(registered, [("m.onnx", add_model_bytes(bias=2.0))]).json()["version"] == 2
    assert owner.upload("other", [("m.onnx", add_model_bytes())]).json()["version"] == 1


def test_download_returns_the_onnx_bytes(owner, registered):
    data = add_model_bytes()
    owner.upload(registered, [("model.onnx", data)])
    response = owner.get(f"/api/v1/models/{registered}/versions/1/download")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == data
    assert response["X-Content-SHA256"] == hashlib.sha256(data).hexdigest()


def test_download_names_any_file_of_the_version(owner, outsider, registered):
    data = add_model_bytes()
    tokenizer = b'{"vocab": {}}'
    owner.upload(registered, [("model.onnx", data), ("tokenizer.json", tokenizer)])
    for name, content in (("tokenizer.json", tokenizer), ("model.onnx", data)):
        response = outsider.get(f"/api/v1/models/{registered}/versions/1/download?file={name}")  # any reader
        assert response.status_code == 200
        assert b"".join(response.streaming_content) == content
        assert response["X-Content-SHA256"] == hashlib.sha256(content).hexdigest()
        assert response["Content-Length"] == str(len(content))
        assert response["Content-Disposition"] == f'attachment; filename="{name}"'
    response = outsider.get(f"/api/v1/models/{registered}/versions/1/download?file=vocab.txt")
    assert response.status_code == 404
    assert response.json() == {"error": "version 1 of model 'demo' has no file 'vocab.txt'", "detail": None}


def test_viewer_cannot_upload(outsider, registered):
    response = outsider.upload(registered, [("model.onnx", add_model_bytes())])
    assert response.status_code == 403
    assert response.json() == {"error": "this action needs the maintainer or admin role", "detail": None}
    assert ModelVersion.objects.count() == 0
    assert stored_keys() == []


def test_anonymous_cannot_upload(client, registered):
    response = client.post(f"/api/v1/models/{registered}/versions", {})
    assert response.status_code == 401
    assert ModelVersion.objects.count() == 0


def test_upload_to_unknown_model_is_404(owner, db):
    response = owner.upload("nope", [("model.onnx", add_model_bytes())])
    assert response.status_code == 404
    assert stored_keys() == []


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ([("model.onnx", b"")], "'model.onnx': the file is empty"),
        ([("model.onnx", b"hello, I am plain text\n")], "'model.onnx': the file is not an ONNX model"),
        ([("model.onnx", add_model_bytes()[:-7])], "'model.onnx': the file is truncated"),
        ([("weights.bin", b"1234")], "the first file must be the .onnx model, got 'weights.bin'"),
        ([("model.onnx", add_model_bytes()), ("model.onnx", b"x")], "the file 'model.onnx' was sent twice"),
        ([(".hidden.onnx", add_model_bytes())], "invalid file name '.hidden.onnx'"),
    ],
    ids=["empty", "not-onnx", "truncated", "not-first", "duplicate", "bad-name"],
)
def test_bad_files_are_refused_and_leave_nothing(owner, registered, files, message):
    response = owner.upload(registered, files)
    assert response.status_code == 400, response.content
    assert response.json()["error"].startswith(message)
    assert ModelVersion.objects.count() == 0
    assert stored_keys() == []


def test_no_file_part_is_refused(owner, registered):
    response = owner.client.post(
        f"/api/v1/models/{registered}/versions", {"description": "x"}, HTTP_AUTHORIZATION=f"Bearer {owner.token}"
    )
    assert response.status_code == 400
    assert response.json()["error"] == "no files: send the .onnx model as a multipart 'file' part"


def test_json_body_is_refused(owner, registered):
    response = owner.post(f"/api/v1/models/{registered}/versions", {"file": "x"})
    assert response.status_code == 415 or response.status_code == 400
    assert "error" in response.json()
    assert ModelVersion.objects.count() == 0


def test_upload_over_the_size_limit_is_413(owner, registered, settings):
    settings.MAX_UPLOAD_BYTES = 1000
    response = owner.upload(registered, [("model.onnx", add_model_bytes()), ("big.bin", b"\0" * 5000)])
    assert response.status_code == 413
    assert response.json()["error"] == "the upload is larger than the limit of 1000 bytes"
    assert ModelVersion.objects.count() == 0
    assert stored_keys() == []


def test_bad_metadata_is_refused(owner, registered):
    response = owner.upload(registered, [("model.onnx", add_model_bytes())], metadata="[1, 2]")
    assert response.status_code == 400
    assert response.json()["error"] == "metadata: metadata must be a JSON object"
    assert ModelVersion.objects.count() == 0
    assert stored_keys() == []


def test_metadata_and_description_are_kept(owner, registered):
    response = owner.upload(registered, [("model.onnx", add_model_bytes())], metadata='{"run": "abc"}')
    assert response.status_code == 201
    assert response.json()["metadata"] == {"run": "abc"}


@pytest.mark.parametrize("blank", ["", "  \r\n "], ids=["empty", "whitespace"])
def test_empty_optional_fields_mean_none(owner, registered, blank):
    """``curl -F metadata= -F description=``, as a form sends the fields left empty."""
    response = owner.upload(registered, [("model.onnx", add_model_bytes())], metadata=blank, description=blank)
    assert response.status_code == 201, response.content
    assert (response.json()["metadata"], response.json()["description"]) == ({}, "")
    version = ModelVersion.objects.get()
    assert (version.status, version.metadata, version.description) == ("ready", {}, "")
    assert AuditEvent.objects.filter(action="version.upload", target=f"{registered}/1").exists()


def test_ir_version_newer_than_runtime_is_refused_outright(owner, registered):
    from onnxkit.validation import runtime_limits

    limits = runtime_limits()
    too_new = limits.max_ir_version + 1
    response = owner.upload(registered, [("model.onnx", add_model_bytes(ir_version=too_new))])
    assert response.status_code == 400
    assert response.json()["error"] == (
        f"'model.onnx': IR version {too_new} is newer than ONNX Runtime {limits.ort_version} supports "
        f"(IR version {limits.max_ir_version} at most). Save the model with ir_version={limits.max_ir_version} "
        f"or lower, for example onnx.helper.make_model(graph, ir_version={limits.max_ir_version})."
    )
    assert ModelVersion.objects.count() == 0
    assert stored_keys() == []


def test_opset_newer_than_runtime_is_refused_outright(owner, registered):
    from onnxkit.validation import runtime_limits

    limits = runtime_limits()
    response = owner.upload(registered, [("model.onnx", add_model_bytes(opset=limits.max_opset + 1))])
    assert response.status_code == 400
    assert (
        f"opset {limits.max_opset + 1} of the default ONNX domain is newer than ONNX Runtime {limits.ort_version}"
        in response.json()["error"]
    )
    assert ModelVersion.objects.count() == 0


def test_a_file_part_not_named_file_is_refused_and_leaves_nothing(owner, registered):
    from django.core.files.uploadedfile import SimpleUploadedFile

    response = owner.client.post(
        f"/api/v1/models/{registered}/versions",
        {"file": SimpleUploadedFile("model.onnx", add_model_bytes()), "weights": SimpleUploadedFile("w.bin", b"w")},
        HTTP_AUTHORIZATION=f"Bearer {owner.token}",
    )
    assert response.status_code == 400
    assert response.json() == {
        "error": "unexpected file field 'weights'; send every file as a 'file' part",
        "detail": None,
    }
    assert ModelVersion.objects.count() == 0
    assert stored_keys() == []


def test_a_multipart_body_without_a_boundary_is_400(owner, registered):
    response = owner.client.post(
        f"/api/v1/models/{registered}/versions",
        b"--x\r\n",
        content_type="multipart/form-data",
        HTTP_AUTHORIZATION=f"Bearer {owner.token}",
    )
    assert response.status_code == 400
    assert response.json()["error"] == "Multipart form parse error - Invalid boundary in multipart: None"
    assert ModelVersion.objects.count() == 0


def test_no_upload_thread_outlives_its_request(owner, registered):
    import threading

    refused = owner.upload(registered, [("model.onnx", b"not onnx"), ("extra.bin", b"x" * 100_000)])
    accepted = owner.upload(registered, [("model.onnx", add_model_bytes()), ("extra.bin", b"x" * 100_000)])
    assert (refused.status_code, accepted.status_code) == (400, 201)
    assert [t.name for t in threading.enumerate() if t.name.startswith("upload-")] == []
