"""The storage contract, checked on both backends: write-once keys, streaming reads, listing, errors."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from storage import ObjectExists, ObjectNotFound, StorageUnavailable
from storage.s3 import S3Storage
from tests.support.s3 import bucket_objects, closed_port_url


class OneWayStream:
    """A non-seekable stream fed by a generator, like a request body arriving chunk by chunk."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buffer) < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buffer += chunk
        if n < 0:
            data, self._buffer = self._buffer, b""
        else:
            data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def readable(self) -> bool:
        return True


def read_all(backend, key: str) -> bytes:
    with backend.open(key) as stream:
        return stream.read()


def test_write_returns_sha256_and_size(backend):
    data = b"onnx bytes \x00\x01\x02" * 1000
    result = backend.write("a/b/model.onnx", io.BytesIO(data))
    assert result.key == "a/b/model.onnx"
    assert result.sha256 == hashlib.sha256(data).hexdigest()
    assert result.size == len(data)


def test_open_streams_the_same_bytes(backend):
    data = bytes(range(256)) * 5000
    backend.write("x/model.onnx", io.BytesIO(data))
    with backend.open("x/model.onnx") as stream:
        parts = []
        while chunk := stream.read(65536):
            parts.append(chunk)
    assert b"".join(parts) == data


def test_empty_object_round_trips(backend):
    result = backend.write("x/empty.bin", io.BytesIO(b""))
    assert result.size == 0
    assert result.sha256 == hashlib.sha256(b"").hexdigest()
    assert read_all(backend, "x/empty.bin") == b""


def test_exists(backend):
    assert backend.exists("x/model.onnx") is False
    backend.write("x/model.onnx", io.BytesIO(b"data"))
    assert backend.exists("x/model.onnx") is True
    assert backend.exists("x/other.onnx") is False


def test_delete_removes_and_missing_key_is_fine(backend):
    backend.write("x/model.onnx", io.BytesIO(b"data"))
    backend.delete("x/model.onnx")
    assert backend.exists("x/model.onnx") is False
    backend.delete("x/model.onnx")
    backend.delete("never/written.bin")
    with pytest.raises(ObjectNotFound):
        backend.open("x/model.onnx")


def test_list_filters_by_prefix_and_reports_sizes(backend):
    backend.write("artifacts/demo/u1/model.onnx", io.BytesIO(b"12345"))
    backend.write("artifacts/demo/u1/weights.bin", io.BytesIO(b"1234567890"))
    backend.write("artifacts/other/u2/model.onnx", io.BytesIO(b"abc"))
    backend.write("elsewhere/file.txt", io.BytesIO(b"z"))

    everything = {item.key: item.size for item in backend.list()}
    assert everything == {
        "artifacts/demo/u1/model.onnx": 5,
        "artifacts/demo/u1/weights.bin": 10,
        "artifacts/other/u2/model.onnx": 3,
        "elsewhere/file.txt": 1,
    }
    demo = {item.key: item.size for item in backend.list("artifacts/demo/")}
    assert demo == {"artifacts/demo/u1/model.onnx": 5, "artifacts/demo/u1/weights.bin": 10}
    assert list(backend.list("nothing/")) == []
    assert all(item.last_modified.tzinfo is not None for item in backend.list())


def test_writing_an_existing_key_raises_and_keeps_the_original(backend):
    backend.write("x/model.onnx", io.BytesIO(b"original"))
    with pytest.raises(ObjectExists):
        backend.write("x/model.onnx", io.BytesIO(b"replacement"))
    assert read_all(backend, "x/model.onnx") == b"original"
    assert [(item.key, item.size) for item in backend.list()] == [("x/model.onnx", 8)]


@pytest.mark.parametrize("key", ["../x", "/abs", "", "a/../../x"])
def test_invalid_keys_raise_value_error(backend, key):
    with pytest.raises(ValueError, match="invalid storage key"):
        backend.write(key, io.BytesIO(b"data"))
    with pytest.raises(ValueError, match="invalid storage key"):
        backend.open(key)
    with pytest.raises(ValueError, match="invalid storage key"):
        backend.exists(key)
    with pytest.raises(ValueError, match="invalid storage key"):
        backend.delete(key)


def test_open_of_a_missing_key_raises_object_not_found(backend):
    with pytest.raises(ObjectNotFound):
        backend.open("missing/model.onnx")


def test_s3_keys_live_under_the_prefix(s3_endpoint, s3_bucket, s3_client):
    store = S3Storage(bucket=s3_bucket, prefix="/pfx/", endpoint_url=s3_endpoint, addressing_style="path")
    store.write("a/model.onnx", io.BytesIO(b"data"))
    assert bucket_objects(s3_client, s3_bucket) == {"pfx/a/model.onnx": b"data"}
    assert [item.key for item in store.list()] == ["a/model.onnx"]


def test_s3_multipart_write_of_a_non_seekable_stream_stores_exact_bytes(s3_endpoint, s3_bucket, s3_client):
    chunk_bytes = 5 * 1024 * 1024
    store = S3Storage(
        bucket=s3_bucket,
        prefix="pfx",
        endpoint_url=s3_endpoint,
        addressing_style="path",
        multipart_chunk_bytes=chunk_bytes,
        max_concurrency=2,
    )
    # ~12 MB in odd-sized pieces whose content depends on position, so reordered parts would show.
    pieces = [hashlib.sha256(str(i).encode()).digest() * 2048 + bytes([i % 251]) * 333 for i in range(180)]
    data = b"".join(pieces)
    assert 2 * chunk_bytes < len(data) <= 3 * chunk_bytes

    result = store.write("big/weights.bin", OneWayStream(iter(pieces)))  # type: ignore[arg-type]

    assert result.size == len(data)
    assert result.sha256 == hashlib.sha256(data).hexdigest()
    head = s3_client.head_object(Bucket=s3_bucket, Key="pfx/big/weights.bin")
    assert head["ContentLength"] == len(data)
    assert head["ETag"].strip('"').endswith("-3")  # a three-part multipart upload
    assert read_all(store, "big/weights.bin") == data


def test_s3_writes_send_unsigned_payloads_with_a_crc32_of_each_part(s3_endpoint, s3_bucket, s3_client):
    """No SHA-256 of the body for the signature, even over plain HTTP; each part still carries its checksum."""
    chunk_bytes = 5 * 1024 * 1024
    store = S3Storage(
        bucket=s3_bucket,
        prefix="pfx",
        endpoint_url=s3_endpoint,
        addressing_style="path",
        multipart_chunk_bytes=chunk_bytes,
    )
    sent: list[tuple[str, str, bool]] = []

    def record(request: Any, **_: Any) -> None:
        headers = request.headers
        checksum = any(name.lower().startswith("x-amz-checksum-") for name in headers)
        sent.append((request.method, headers.get("X-Amz-Content-SHA256", b"").decode(), checksum))

    store.client.meta.events.register("before-send.s3.PutObject", record)
    store.client.meta.events.register("before-send.s3.UploadPart", record)
    data = os.urandom(2 * chunk_bytes + 10)
    store.write("small.bin", io.BytesIO(b"small"))
    store.write("big.bin", io.BytesIO(data))

    assert sent == [("PUT", "UNSIGNED-PAYLOAD", True)] * 4  # one PutObject, three parts
    assert read_all(store, "small.bin") == b"small"
    assert read_all(store, "big.bin") == data
    # The rule has something to hold: botocore's default signs the body over HTTP.
    default = boto3.session.Session().client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    signed: list[str] = []
    default.meta.events.register(
        "before-send.s3.PutObject", lambda request, **_: signed.append(request.headers["X-Amz-Content-SHA256"].decode())
    )
    default.put_object(Bucket=s3_bucket, Key="pfx/default.bin", Body=b"small")
    assert signed == [hashlib.sha256(b"small").hexdigest()]


@pytest.fixture
def unreachable() -> S3Storage:
    return S3Storage(
        bucket="nowhere", prefix="pfx", endpoint_url=closed_port_url(), max_attempts=1, connect_timeout=0.5
    )


def test_s3_unreachable_write_raises_storage_unavailable(unreachable):
    with pytest.raises(StorageUnavailable, match="S3 request failed"):
        unreachable.write("x/model.onnx", io.BytesIO(b"data"))


def test_s3_unreachable_open_raises_storage_unavailable(unreachable):
    with pytest.raises(StorageUnavailable, match="S3 request failed"):
        unreachable.open("x/model.onnx")


def test_s3_unreachable_exists_raises_storage_unavailable(unreachable):
    with pytest.raises(StorageUnavailable, match="S3 request failed"):
        unreachable.exists("x/model.onnx")


def test_s3_unreachable_list_raises_storage_unavailable(unreachable):
    with pytest.raises(StorageUnavailable, match="S3 request failed"):
        list(unreachable.list("x/"))


def test_s3_unreachable_delete_raises_storage_unavailable(unreachable):
    with pytest.raises(StorageUnavailable, match="S3 request failed"):
        unreachable.delete("x/model.onnx")


def test_s3_write_holds_no_more_parts_in_memory_than_it_uploads_at_once(s3_endpoint, s3_bucket):
    store = S3Storage(bucket=s3_bucket, endpoint_url=s3_endpoint, max_concurrency=3)
    # boto3's default (10 parts) would let a fast reader queue 10 parts of a non-seekable stream.
    assert store.transfer_config.max_in_memory_upload_chunks == 3
    assert store.transfer_config.max_request_concurrency == 3
