"""The multipart adapter also feeds the upload service from a plain Django request, as the coming UI form will."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import RequestFactory

from registry.errors import InvalidInput, NotAnOnnxModel
from registry.http import MultipartUpload
from registry.models import ModelVersion, RegisteredModel
from registry.uploads import version_upload
from tests.support.onnx_models import add_model_bytes
from tests.support.uploads import stored_keys

pytestmark = pytest.mark.django_db


def form_request(files: list[tuple[str, bytes]], **fields: str):
    parts = [SimpleUploadedFile(name, data) for name, data in files]
    return RequestFactory().post("/ui/models/demo/upload", {"file": parts, **fields})


def test_a_django_form_request_uploads_through_the_service(owner, registered):
    request = form_request([("model.onnx", add_model_bytes()), ("vocab.txt", b"a\nb\n")], description="from a form")
    with MultipartUpload(request) as body:
        version = version_upload(model=RegisteredModel.objects.get(name=registered), source=body, actor=owner.actor)
    assert (version.version, version.description) == (1, "from a form")
    assert [f.name for f in version.files.all()] == ["model.onnx", "vocab.txt"]


def test_a_refusal_from_a_django_form_request_leaves_nothing(owner, registered):
    request = form_request([("model.onnx", b"plain text"), ("vocab.txt", b"a\nb\n")])
    with pytest.raises(NotAnOnnxModel) as caught, MultipartUpload(request) as body:
        version_upload(model=RegisteredModel.objects.get(name=registered), source=body, actor=owner.actor)
    assert caught.value.message.startswith("'model.onnx': the file is not an ONNX model")
    assert ModelVersion.objects.count() == 0
    assert stored_keys() == []


def test_a_django_request_without_a_boundary_is_invalid_input(owner, registered):
    request = RequestFactory().post("/ui/models/demo/upload", b"--x\r\n", content_type="multipart/form-data")
    with pytest.raises(InvalidInput) as caught, MultipartUpload(request) as body:
        version_upload(model=RegisteredModel.objects.get(name=registered), source=body, actor=owner.actor)
    assert caught.value.message == "Multipart form parse error - Invalid boundary in multipart: None"
