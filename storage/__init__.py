"""Artifact storage backends: a local folder and S3-compatible object stores."""

from __future__ import annotations

from functools import cache

from storage.base import (
    ArtifactStorage,
    ObjectExists,
    ObjectNotFound,
    StorageError,
    StorageUnavailable,
    StoredObject,
    WriteResult,
)

__all__ = [
    "ArtifactStorage",
    "ObjectExists",
    "ObjectNotFound",
    "StorageError",
    "StorageUnavailable",
    "StoredObject",
    "WriteResult",
    "get_storage",
]


@cache
def get_storage() -> ArtifactStorage:
    """The configured backend, built once per process (tests call ``get_storage.cache_clear()``)."""
    from django.conf import settings

    config = settings.STORAGE
    if config.kind == "file":
        from storage.local import LocalStorage

        return LocalStorage(config.path)
    from storage.s3 import S3Storage

    return S3Storage(
        bucket=config.bucket,
        prefix=config.prefix,
        endpoint_url=settings.S3_ENDPOINT_URL,
        region=settings.S3_REGION,
        addressing_style=settings.S3_ADDRESSING_STYLE or "auto",
        max_attempts=settings.S3_MAX_ATTEMPTS,
        connect_timeout=settings.S3_CONNECT_TIMEOUT,
        multipart_chunk_bytes=settings.S3_MULTIPART_CHUNK_MB * 1024 * 1024,
        max_concurrency=settings.S3_MAX_CONCURRENCY,
        sse=settings.S3_SSE,
        sse_kms_key_id=settings.S3_SSE_KMS_KEY_ID,
    )
