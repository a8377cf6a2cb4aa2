"""``GET .../versions/{n}/download?file=NAME``: every file of a bundle on its own, with its sha256."""

from __future__ import annotations

import hashlib
import io

import pytest

from tests.support.onnx_models import add_model_bytes

pytestmark = pytest.mark.django_db


def test_each_file_of_a_version_downloads_by_name_with_its_sha256(owner, outsider, registered):
    model, extra = add_model_bytes(), b'{"vocab": {"a": 0}}'
    assert owner.upload(registered, [("model.onnx", model), ("tokenizer.json", extra)]).status_code == 201

    for name, data in (("model.onnx", model), ("tokenizer.json", extra)):
        response = outsider.get(f"/api/v1/models/{registered}/versions/1/download?file={name}")  # any reader
        assert response.status_code == 200
        assert b"".join(response.streaming_content) == data
        assert response["Content-Length"] == str(len(data))
        assert response["X-Content-SHA256"] == hashlib.sha256(data).hexdigest()
        assert f'filename="{name}"' in response["Content-Disposition"]


def test_a_file_the_version_does_not_have_is_404_naming_it(owner, registered):
    owner.upload(registered, [("model.onnx", add_model_bytes())])
    response = owner.get(f"/api/v1/models/{registered}/versions/1/download?file=weights.bin")
    assert response.status_code == 404
    assert response.json() == {"error": "version 1 of model 'demo' has no file 'weights.bin'", "detail": None}


def test_download_by_name_needs_credentials(owner, registered, client):
    owner.upload(registered, [("model.onnx", add_model_bytes())])
    response = client.get(f"/api/v1/models/{registered}/versions/1/download?file=model.onnx")
    assert response.status_code == 401


def test_a_download_streams_block_by_block_under_asgi():
    """Django's ASGI path reads a whole FileResponse into memory before its first byte; a model can be gigabytes."""
    from asgiref.sync import async_to_sync

    from registry.api.responses import StreamingFileResponse

    block = StreamingFileResponse.block_size
    log = []

    class Stored(io.BytesIO):
        def read(self, size=-1):
            data = super().read(size)
            log.append(f"read {len(data)}")
            return data

    async def consume():
        async for part in StreamingFileResponse(Stored(b"x" * (2 * block + 10))):
            log.append(f"sent {len(part)}")

    async_to_sync(consume)()
    assert log == [f"read {block}", f"sent {block}", f"read {block}", f"sent {block}", "read 10", "sent 10", "read 0"]
