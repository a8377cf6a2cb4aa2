"""Uploads against S3 (moto over HTTP): stored keys and bytes, storage outages, orphan collection."""

from __future__ import annotations

import hashlib
import io
import re
import threading
import uuid
from typing import Any

import pytest
from django.conf import settings

from modelyard.provenance import build_trust, verify_bundle
from registry.models import ModelFile, ModelVersion, RegisteredModel, VersionSignature
from registry.tasks import collect_orphaned_artifacts
from storage import get_storage
from tests.support.onnx_models import add_model_bytes, external_data_model
from tests.support.s3 import bucket_objects, closed_port_url

pytestmark = pytest.mark.django_db

UPLOAD_KEY = re.compile(r"^pfx/artifacts/demo/([0-9a-f]{32})/(model\.onnx|weights\.bin|vocab\.json|\.registry\.sig)$")


def test_upload_to_s3_stores_exact_bytes_under_the_prefix_and_ends_ready(
    owner, registered, s3_settings, s3_client, s3_bucket, tmp_path
):
    model_path = external_data_model(tmp_path / "bundle", size=1000)
    model = model_path.read_bytes()
    weights = (tmp_path / "bundle" / "weights.bin").read_bytes()
    tokenizer = b'{"vocab": ["a", "b"]}'

    response = owner.upload(registered, [("model.onnx", model), ("weights.bin", weights), ("vocab.json", tokenizer)])

    assert response.status_code == 201, response.content
    body = owner.get(f"/api/v1/models/{registered}/versions/1").json()
    assert body["status"] == "ready", body["errors"]
    assert body["sha256"] == hashlib.sha256(model).hexdigest()
    assert body["size_bytes"] == len(model) + len(weights) + len(tokenizer)
    assert [(f["name"], f["role"]) for f in body["files"]] == [
        ("model.onnx", "model"),
        ("weights.bin", "external_data"),
        ("vocab.json", "extra"),
    ]

    objects = bucket_objects(s3_client, s3_bucket)
    matches = [UPLOAD_KEY.match(key) for key in objects]
    assert all(matches), sorted(objects)
    upload_ids = {m.group(1) for m in matches if m}
    assert len(upload_ids) == 1
    prefix = f"pfx/artifacts/demo/{upload_ids.pop()}"
    # Beside the files, the registry's signature over all three, made once validation passed.
    bundle = objects.pop(f"{prefix}/.registry.sig")
    assert objects == {
        f"{prefix}/model.onnx": model,
        f"{prefix}/weights.bin": weights,
        f"{prefix}/vocab.json": tokenizer,
    }
    verified = verify_bundle(bundle, build_trust(registry_keys=[settings.SIGNING_KEY]))
    assert verified.signer == "modelyard"
    assert verified.digests == {name: hashlib.sha256(data).hexdigest() for name, data in objects_by_name(objects)}
    stored = {f.name: (f.storage_key, f.sha256, f.size_bytes) for f in ModelFile.objects.all()}
    key_root = prefix.removeprefix("pfx/")
    assert stored == {
        "model.onnx": (f"{key_root}/model.onnx", hashlib.sha256(model).hexdigest(), len(model)),
        "weights.bin": (f"{key_root}/weights.bin", hashlib.sha256(weights).hexdigest(), len(weights)),
        "vocab.json": (f"{key_root}/vocab.json", hashlib.sha256(tokenizer).hexdigest(), len(tokenizer)),
    }

    download = owner.get(f"/api/v1/models/{registered}/versions/1/download")
    assert download.status_code == 200
    assert b"".join(download.streaming_content) == model
    assert download["Content-Length"] == str(len(model))
    assert download["X-Content-SHA256"] == hashlib.sha256(model).hexdigest()


def objects_by_name(objects: dict[str, bytes]) -> list[tuple[str, bytes]]:
    return [(key.rsplit("/", 1)[1], data) for key, data in objects.items()]


def test_upload_while_s3_is_unreachable_is_503_and_leaves_no_version(owner, registered, s3_settings):
    s3_settings.S3_ENDPOINT_URL = closed_port_url()
    s3_settings.S3_MAX_ATTEMPTS = 1
    s3_settings.S3_CONNECT_TIMEOUT = 0.5
    get_storage.cache_clear()

    response = owner.upload(registered, [("model.onnx", add_model_bytes()), ("notes.txt", b"trained on x")])

    assert response.status_code == 503, response.content
    body = response.json()
    assert body["error"].startswith(
        "artifact storage is unavailable: S3 request failed: Could not connect to the endpoint URL"
    ), body
    assert body["detail"] is None
    assert ModelVersion.objects.count() == 0
    assert ModelFile.objects.count() == 0
    assert RegisteredModel.objects.get(name=registered).last_version == 0
    assert owner.get(f"/api/v1/models/{registered}/versions").json()["results"] == []


def test_download_while_s3_is_unreachable_is_503(owner, registered, s3_settings):
    assert owner.upload(registered, [("model.onnx", add_model_bytes())]).status_code == 201
    s3_settings.S3_ENDPOINT_URL = closed_port_url()
    s3_settings.S3_MAX_ATTEMPTS = 1
    s3_settings.S3_CONNECT_TIMEOUT = 0.5
    get_storage.cache_clear()

    response = owner.get(f"/api/v1/models/{registered}/versions/1/download")

    assert response.status_code == 503
    assert response.json()["error"].startswith(
        "artifact storage is unavailable: S3 request failed: Could not connect to the endpoint URL"
    )


def _orphan_and_upload(owner, registered):
    """One real upload plus an object that no version references (a crash before the DB commit)."""
    orphan_key = f"artifacts/demo/{uuid.uuid4().hex}/model.onnx"
    get_storage().write(orphan_key, io.BytesIO(add_model_bytes(bias=9.0)))
    response = owner.upload(registered, [("model.onnx", add_model_bytes()), ("notes.txt", b"trained on x")])
    assert response.status_code == 201, response.content
    referenced = set(ModelFile.objects.values_list("storage_key", flat=True))
    assert len(referenced) == 2
    signatures = set(VersionSignature.objects.values_list("storage_key", flat=True))
    assert [key.rsplit("/", 1)[1] for key in signatures] == [".registry.sig"]  # an object of the version too
    referenced |= signatures
    return orphan_key, referenced


@pytest.fixture(params=["local", "s3"])
def any_storage(request):
    if request.param == "s3":
        request.getfixturevalue("s3_settings")
    return request.param


# The task calls close_old_connections(), as a Celery task should; that would close the connection of a
# test wrapped in a transaction, so these tests run in autocommit mode like a worker does.
@pytest.mark.django_db(transaction=True)
def test_orphans_are_collected_and_referenced_objects_kept(owner, registered, any_storage):
    orphan_key, referenced = _orphan_and_upload(owner, registered)

    deleted = collect_orphaned_artifacts(grace_seconds=0)

    assert deleted == [orphan_key]
    assert {item.key for item in get_storage().list("")} == referenced
    assert not get_storage().exists(orphan_key)
    download = owner.get(f"/api/v1/models/{registered}/versions/1/download")
    assert b"".join(download.streaming_content) == add_model_bytes()


@pytest.mark.django_db(transaction=True)
def test_orphans_younger_than_the_grace_period_are_kept(owner, registered, any_storage):
    orphan_key, referenced = _orphan_and_upload(owner, registered)

    assert collect_orphaned_artifacts(grace_seconds=3600) == []

    assert {item.key for item in get_storage().list("")} == referenced | {orphan_key}


def fed_pipe(pieces: list[bytes]) -> tuple[Any, threading.Thread]:
    """A ChunkPipe that a thread fills with ``pieces``, then closes; join the thread after reading."""
    from registry.http import ChunkPipe

    pipe = ChunkPipe()

    def feed() -> None:
        for piece in pieces:
            pipe.put(piece)
        pipe.close()

    feeder = threading.Thread(target=feed)
    feeder.start()
    return pipe, feeder


@pytest.mark.parametrize("read_size", [1, 7, 1000, 4096, 10_000, -1])
def test_chunk_pipe_reads_return_the_exact_bytes_in_order(read_size):
    pieces = [bytes([i]) * (997 + 13 * i) for i in range(40)]
    pipe, feeder = fed_pipe(pieces)
    got = []
    while chunk := pipe.read(read_size):
        assert read_size < 0 or len(chunk) <= read_size
        got.append(chunk)
    feeder.join()
    assert b"".join(got) == b"".join(pieces)
    if read_size > 0:
        assert all(len(chunk) == read_size for chunk in got[:-1])


def test_a_chunk_pipe_read_larger_than_it_sets_aside_still_returns_every_byte():
    from registry.http import PREALLOCATE_MAX

    mib = 1024 * 1024
    pieces = [bytes([i]) * mib for i in range(20)]
    pipe, feeder = fed_pipe(pieces)
    first = pipe.read(PREALLOCATE_MAX + mib + 3)  # past what the read sets aside: the buffer grows
    rest = pipe.read(PREALLOCATE_MAX + mib + 3)  # the end comes first: a short read
    feeder.join()
    assert (len(first), len(rest)) == (17 * mib + 3, 3 * mib - 3)
    assert first + rest == b"".join(pieces)
    assert pipe.read(10) == b""
