"""Models that are well-formed protobuf but fail validation end as `failed` versions with readable errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.models import AuditEvent, ModelVersion
from tests.support.onnx_models import external_data_model, unknown_op_model, unrunnable_model

pytestmark = [pytest.mark.django_db, pytest.mark.real_validation]  # validation itself: no memo


def upload_and_get(person, model, files):
    response = person.upload(model, files)
    assert response.status_code == 201, response.content
    return person.get(f"/api/v1/models/{model}/versions/{response.json()['version']}").json()


def test_unknown_operator_fails_with_the_op_name(owner, registered):
    body = upload_and_get(owner, registered, [("model.onnx", unknown_op_model().SerializeToString())])
    assert body["status"] == "failed"
    assert len(body["errors"]) == 1
    assert body["errors"][0].startswith("onnx.checker rejected the model:")
    assert "FrobnicateTensor" in body["errors"][0]
    event = AuditEvent.objects.get(action="version.validate")
    assert event.after == {"status": "failed", "errors": body["errors"]}


CHECKER_REASON = "onnx.checker rejected the model: No Op registered for FrobnicateTensor with domain_version of 17"
CHECKER_DETAIL = "==> Context: Bad node spec for node. Name:  OpType: FrobnicateTensor"


def test_a_checker_message_of_several_lines_keeps_its_line_breaks(owner, registered):
    """onnx.checker's reason and its "==> Context" line arrive as two lines, not one line with \\x0a escapes."""
    body = upload_and_get(owner, registered, [("model.onnx", unknown_op_model().SerializeToString())])
    assert body["errors"] == [f"{CHECKER_REASON}\n{CHECKER_DETAIL}"]
    listed = owner.get(f"/api/v1/models/{registered}/versions").json()
    assert listed["results"][0]["errors"] == body["errors"]


def test_unknown_domain_fails(owner, registered):
    body = upload_and_get(owner, registered, [("model.onnx", unknown_op_model("com.example.nope").SerializeToString())])
    assert body["status"] == "failed"
    assert body["errors"][0].startswith("ONNX Runtime could not load the model:")
    assert "com.example.nope" in body["errors"][0]


def test_model_that_ort_cannot_run_fails(owner, registered):
    body = upload_and_get(owner, registered, [("model.onnx", unrunnable_model().SerializeToString())])
    assert body["status"] == "failed"
    assert len(body["errors"]) == 1
    assert body["errors"][0].startswith("ONNX Runtime could not run the model on synthetic inputs:")
    assert "Reshape" in body["errors"][0]


def test_external_data_in_its_own_file_is_ready(owner, registered, tmp_path: Path):
    path = external_data_model(tmp_path / "m")
    files = [("model.onnx", path.read_bytes()), ("weights.bin", (tmp_path / "m" / "weights.bin").read_bytes())]
    body = upload_and_get(owner, registered, files)
    assert body["status"] == "ready", body["errors"]
    assert {f["name"]: f["role"] for f in body["files"]} == {"model.onnx": "model", "weights.bin": "external_data"}
    assert body["signature"]["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [4]}]


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("../../etc/passwd", "tensor 'w' stores its data in '../../etc/passwd', which is outside the version's files"),
        ("/etc/passwd", "tensor 'w' stores its data in '/etc/passwd', an absolute path"),
        ("sub/../../weights.bin", "which is outside the version's files"),
    ],
)
def test_external_data_that_leaves_the_bundle_fails(owner, registered, tmp_path: Path, location, message):
    path = external_data_model(tmp_path / "m", location=location)
    files = [("model.onnx", path.read_bytes()), ("weights.bin", (tmp_path / "m" / "weights.bin").read_bytes())]
    body = upload_and_get(owner, registered, files)
    assert body["status"] == "failed"
    assert len(body["errors"]) == 1
    assert message in body["errors"][0]


def test_missing_external_data_file_fails(owner, registered, tmp_path: Path):
    path = external_data_model(tmp_path / "m")
    body = upload_and_get(owner, registered, [("model.onnx", path.read_bytes())])
    assert body["status"] == "failed"
    assert body["errors"] == [
        "tensor 'w' stores its data in 'weights.bin', but no file of that name was uploaded with this version"
    ]


def test_failed_versions_keep_their_rows_and_files(owner, registered):
    upload_and_get(owner, registered, [("model.onnx", unknown_op_model().SerializeToString())])
    version = ModelVersion.objects.get()
    assert version.files.count() == 1
    assert version.validated_at is not None
