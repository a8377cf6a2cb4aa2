"""Artifacts in an S3-compatible bucket: AWS S3, Alibaba OSS, MinIO, Ceph.

OSS speaks S3 through its S3-compatible endpoint and wants virtual-host addressing
(``MODELYARD_S3_ADDRESSING_STYLE=virtual``). Credentials come from boto3's usual chain.

Every object is written by :meth:`S3Storage.write` alone (``upload_fileobj``: one PutObject, or
CreateMultipartUpload and its parts), so the server-side encryption asked for there
(``MODELYARD_S3_SSE``, ``MODELYARD_S3_SSE_KMS_KEY_ID``) covers every artifact, signature bundle and
derived file. The registry copies no object and hands out no presigned upload URL.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from storage.base import HashingReader, ObjectExists, ObjectNotFound, StorageUnavailable, StoredObject, WriteResult

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

_MISSING_CODES = {"404", "NoSuchKey", "NotFound"}


def _unavailable(exc: Exception) -> StorageUnavailable:
    return StorageUnavailable(f"S3 request failed: {exc}")


class S3Storage:
    """Objects live under ``prefix`` in ``bucket``; keys are relative to the prefix."""

    def __init__(
        self,
        *,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        addressing_style: str = "auto",
        max_attempts: int = 3,
        connect_timeout: float = 5.0,
        multipart_chunk_bytes: int = 8 * 1024 * 1024,
        max_concurrency: int = 4,
        sse: str | None = None,
        sse_kms_key_id: str | None = None,
    ) -> None:
        if sse not in {None, "AES256", "aws:kms"}:
            raise ValueError(f"server-side encryption must be AES256 or aws:kms, got {sse!r}")
        if sse_kms_key_id and sse != "aws:kms":
            raise ValueError("a KMS key id is only used with server-side encryption aws:kms")
        self.bucket = bucket
        # Sent with every write: on a single PutObject and on CreateMultipartUpload (the parts inherit it).
        self.extra_args: dict[str, str] = {}
        if sse:
            self.extra_args["ServerSideEncryption"] = sse
        if sse_kms_key_id:
            self.extra_args["SSEKMSKeyId"] = sse_kms_key_id
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        config = Config(
            region_name=region,
            # No SHA-256 of every part's body for its signature: botocore leaves it out over HTTPS already
            # (the part's CRC32 checksum stands in), and over plain HTTP (a store on loopback or a private
            # network) it cost an upload 16% of the server's CPU. The headers stay signed, each part
            # carries its CRC32, and every file's sha256, taken once as it streams in, is checked before
            # every load.
            s3={"addressing_style": addressing_style, "payload_signing_enabled": False},  # type: ignore[arg-type]
            retries={"max_attempts": max_attempts, "mode": "standard"},
            connect_timeout=connect_timeout,
            read_timeout=60,
            max_pool_connections=max(10, max_concurrency * 2),
        )
        self.client: S3Client = boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)
        self.transfer_config = TransferConfig(
            multipart_threshold=multipart_chunk_bytes,
            multipart_chunksize=multipart_chunk_bytes,
            max_concurrency=max_concurrency,
            use_threads=True,
        )
        # A write reads a non-seekable stream, so boto3 holds every part in memory until it is sent.
        # This bounds the parts held (queued or uploading) to the parts that can upload at once; one
        # more is being read. Memory per write is about (max_concurrency + 2) * multipart_chunk_bytes.
        # (max_io_queue, often mistaken for this bound, only applies to downloads; the default here
        # is 10 parts whatever the concurrency.)
        self.transfer_config.max_in_memory_upload_chunks = max_concurrency

    def _full(self, key: str) -> str:
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"invalid storage key {key!r}")
        return self.prefix + key

    def write(self, key: str, stream: BinaryIO) -> WriteResult:
        if self.exists(key):
            raise ObjectExists(key)
        reader = HashingReader(stream)
        try:
            # A reader without seek() makes boto3 read the stream once, in order, part by part.
            self.client.upload_fileobj(
                cast(Any, reader),
                self.bucket,
                self._full(key),
                ExtraArgs=cast(Any, self.extra_args),
                Config=self.transfer_config,
            )
        except (BotoCoreError, ClientError) as exc:
            raise _unavailable(exc) from exc
        return WriteResult(key=key, sha256=reader.sha256, size=reader.size)

    def open(self, key: str) -> BinaryIO:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._full(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING_CODES:
                raise ObjectNotFound(key) from exc
            raise _unavailable(exc) from exc
        except BotoCoreError as exc:
            raise _unavailable(exc) from exc
        return cast(BinaryIO, response["Body"])

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._full(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING_CODES:
                return False
            raise _unavailable(exc) from exc
        except BotoCoreError as exc:
            raise _unavailable(exc) from exc
        return True

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._full(key))
        except (BotoCoreError, ClientError) as exc:
            raise _unavailable(exc) from exc

    def list(self, prefix: str = "") -> Iterator[StoredObject]:
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                for item in page.get("Contents", []):
                    yield StoredObject(
                        key=item["Key"][len(self.prefix) :], size=item["Size"], last_modified=item["LastModified"]
                    )
        except (BotoCoreError, ClientError) as exc:
            raise _unavailable(exc) from exc

    def check(self) -> None:
        # The same request list() makes (the garbage collector needs it anyway), so it works with
        # the permissions and on the S3-compatible stores that already work.
        try:
            self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code == "NoSuchBucket":
                raise StorageUnavailable(f"bucket {self.bucket} does not exist") from exc
            raise _unavailable(exc) from exc
        except BotoCoreError as exc:
            raise _unavailable(exc) from exc
