"""S3 server-side encryption (MODELYARD_S3_SSE, MODELYARD_S3_SSE_KMS_KEY_ID) on every object the registry writes.

Against moto over HTTP: each object's encryption is read back with head_object, for single PutObject
writes and multipart uploads, artifacts and the registry's signature bundle alike.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest

from registry.models import ModelFile, VersionSignature
from storage import get_storage
from storage.s3 import S3Storage
from tests.support.onnx_models import external_data_model

ROOT = Path(__file__).resolve().parent.parent.parent
CHUNK = 5 * 1024 * 1024  # the smallest part S3 takes; anything larger goes up in parts


@pytest.fixture
def kms_key_arn(s3_endpoint: str) -> str:
    """A KMS key in moto (the same server answers KMS)."""
    kms = boto3.session.Session().client("kms", endpoint_url=s3_endpoint, region_name="us-east-1")
    return str(kms.create_key(Description="modelyard artifacts")["KeyMetadata"]["Arn"])


def encryption_of(client: Any, bucket: str, key: str) -> tuple[str | None, str | None]:
    head = client.head_object(Bucket=bucket, Key=key)
    return head.get("ServerSideEncryption"), head.get("SSEKMSKeyId")


def storage(endpoint: str, bucket: str, **kwargs: Any) -> S3Storage:
    return S3Storage(
        bucket=bucket,
        prefix="pfx",
        endpoint_url=endpoint,
        region="us-east-1",
        addressing_style="path",
        multipart_chunk_bytes=CHUNK,
        **kwargs,
    )


@pytest.mark.parametrize(("sse", "with_key"), [(None, False), ("AES256", False), ("aws:kms", False), ("aws:kms", True)])
def test_single_and_multipart_writes_carry_the_configured_encryption(
    s3_endpoint, s3_client, s3_bucket, kms_key_arn, sse, with_key
):
    key_id = kms_key_arn if with_key else None
    backend = storage(s3_endpoint, s3_bucket, sse=sse, sse_kms_key_id=key_id)
    small, large = os.urandom(1000), os.urandom(CHUNK + 1024)

    backend.write("a/small.bin", io.BytesIO(small))
    backend.write("a/large.bin", io.BytesIO(large))

    # The large one really went up in parts (a multipart ETag ends in -<parts>).
    assert s3_client.head_object(Bucket=s3_bucket, Key="pfx/a/large.bin")["ETag"].endswith('-2"')
    for key, data in (("a/small.bin", small), ("a/large.bin", large)):
        assert encryption_of(s3_client, s3_bucket, f"pfx/{key}") == (sse, key_id), key
        assert backend.open(key).read() == data  # and it reads back as written


def test_a_bad_encryption_is_refused_by_the_backend(s3_endpoint, s3_bucket):
    with pytest.raises(ValueError, match=r"^server-side encryption must be AES256 or aws:kms, got 'aes'$"):
        storage(s3_endpoint, s3_bucket, sse="aes")
    with pytest.raises(ValueError, match=r"^a KMS key id is only used with server-side encryption aws:kms$"):
        storage(s3_endpoint, s3_bucket, sse="AES256", sse_kms_key_id="alias/k")


@pytest.mark.django_db
@pytest.mark.parametrize("mode", ["AES256", "aws:kms"])
def test_every_object_of_an_uploaded_version_is_encrypted(
    owner, registered, s3_settings, s3_client, s3_bucket, kms_key_arn, tmp_path, mode
):
    key_id = kms_key_arn if mode == "aws:kms" else None
    s3_settings.S3_SSE = mode
    s3_settings.S3_SSE_KMS_KEY_ID = key_id
    s3_settings.S3_MULTIPART_CHUNK_MB = 5
    get_storage.cache_clear()
    # weights.bin is larger than a part, so it goes up as a multipart upload; the others in one PutObject.
    model_path = external_data_model(tmp_path / "bundle", size=(CHUNK + 4096) // 4)
    weights = (tmp_path / "bundle" / "weights.bin").read_bytes()
    assert len(weights) > CHUNK

    response = owner.upload(
        registered,
        [("model.onnx", model_path.read_bytes()), ("weights.bin", weights), ("vocab.json", b'{"vocab": ["a"]}')],
    )

    assert response.status_code == 201, response.content
    body = owner.get(f"/api/v1/models/{registered}/versions/1").json()
    assert body["status"] == "ready", body["errors"]
    stored = {item["Key"] for item in s3_client.list_objects_v2(Bucket=s3_bucket)["Contents"]}
    names = sorted(key.rsplit("/", 1)[1] for key in stored)
    assert names == [".registry.sig", "model.onnx", "vocab.json", "weights.bin"]
    assert {f"pfx/{f.storage_key}" for f in ModelFile.objects.all()} < stored
    assert VersionSignature.objects.count() == 1
    for key in stored:
        assert encryption_of(s3_client, s3_bucket, key) == (mode, key_id), key
    [weights_key] = [key for key in stored if key.endswith("/weights.bin")]
    assert s3_client.head_object(Bucket=s3_bucket, Key=weights_key)["ETag"].endswith('-2"')
    download = owner.get(f"/api/v1/models/{registered}/versions/1/download")
    assert download.status_code == 200
    assert b"".join(download.streaming_content) == model_path.read_bytes()


def test_only_the_s3_backend_writes_objects():
    """Every write goes through S3Storage.write, so its encryption covers everything the registry stores."""
    writes = re.compile(
        r"\.(put_object|upload_fileobj|upload_file|create_multipart_upload|copy_object|upload_part_copy)\("
    )
    found = {}
    for package in ("modelyard", "onnxkit", "registry", "storage", "inference"):
        for path in sorted((ROOT / package).rglob("*.py")):
            lines = [n for n, line in enumerate(path.read_text().splitlines(), 1) if writes.search(line)]
            if lines:
                found[path.relative_to(ROOT).as_posix()] = lines
    assert set(found) == {"storage/s3.py"}, found
    assert "generate_presigned" not in "".join(
        path.read_text() for package in ("modelyard", "registry", "storage") for path in (ROOT / package).rglob("*.py")
    )


def run_check(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MODELYARD_DATA_DIR": str(tmp_path), **extra}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, "-m", "modelyard.cli", "manage", "check"], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_bad_setting_stops_startup_with_a_clear_error(tmp_path):
    result = run_check(tmp_path, MODELYARD_S3_SSE="aes")
    assert result.returncode != 0
    assert "MODELYARD_S3_SSE: expected one of AES256, aws:kms, got 'aes'" in result.stderr

    result = run_check(tmp_path, MODELYARD_S3_SSE="AES256", MODELYARD_S3_SSE_KMS_KEY_ID="alias/k")
    assert result.returncode != 0
    assert (
        "MODELYARD_S3_SSE_KMS_KEY_ID: only used with MODELYARD_S3_SSE=aws:kms, and MODELYARD_S3_SSE is AES256"
        in result.stderr
    )

    result = run_check(tmp_path, MODELYARD_S3_SSE_KMS_KEY_ID="alias/k")
    assert "MODELYARD_S3_SSE_KMS_KEY_ID: only used with MODELYARD_S3_SSE=aws:kms, and MODELYARD_S3_SSE is unset" in (
        result.stderr
    )

    result = run_check(tmp_path, MODELYARD_S3_SSE="aws:KMS", MODELYARD_S3_SSE_KMS_KEY_ID="alias/k")
    assert result.returncode == 0, result.stderr
