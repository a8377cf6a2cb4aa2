"""Multipart limits of an upload (number of files, bytes of form fields) answer JSON naming the limit."""

from __future__ import annotations

import pytest

from registry.models import ModelVersion
from storage import get_storage
from tests.support.onnx_models import add_model_bytes

pytestmark = pytest.mark.django_db


def test_too_many_files_is_a_json_400_naming_the_limit(owner, registered, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FILES = 3
    files = [("model.onnx", add_model_bytes())] + [(f"extra{i}.bin", b"x") for i in range(3)]
    response = owner.upload(registered, files)
    assert response.status_code == 400
    assert response.json() == {
        "error": "too many files: an upload may have at most 3 (MODELYARD_MAX_UPLOAD_FILES)",
        "detail": {"limit": 3},
    }
    assert response["Connection"] == "close"  # the rest of the body is never read
    assert not ModelVersion.objects.exists()
    assert list(get_storage().list("")) == []  # the files streamed before the refusal are deleted


def test_form_fields_over_the_limit_are_a_json_413_naming_the_limit(owner, registered, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    response = owner.upload(registered, [("model.onnx", add_model_bytes())], description="d" * 2000)
    assert response.status_code == 413
    assert response.json() == {
        "error": "the form fields are larger than the limit of 1024 bytes (MODELYARD_MAX_FORM_BYTES)",
        "detail": {"limit": 1024},
    }
    assert response["Connection"] == "close"
    assert not ModelVersion.objects.exists()
    assert list(get_storage().list("")) == []


def test_uploads_within_the_limits_pass(owner, registered, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FILES = 3
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    files = [("model.onnx", add_model_bytes()), ("a.bin", b"a"), ("b.bin", b"b")]
    response = owner.upload(registered, files, description="d" * 500)
    assert response.status_code == 201, response.content
