"""The artifact storage interface.

Artifacts are written once under a key and never overwritten. Writes take a readable stream
and never hold an object whole in memory; reads return streams.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import BinaryIO, Protocol

CHUNK_SIZE = 1024 * 1024


class StorageError(Exception):
    """Base class for storage failures."""


class StorageUnavailable(StorageError):
    """The backend could not be reached or failed transiently; the caller may retry later."""


class ObjectExists(StorageError):
    """A write targeted a key that already holds an artifact."""


class ObjectNotFound(StorageError):
    """A read or delete targeted a key that holds nothing."""


@dataclass(frozen=True)
class WriteResult:
    key: str
    sha256: str
    size: int


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    last_modified: datetime


class ArtifactStorage(Protocol):
    def write(self, key: str, stream: BinaryIO) -> WriteResult:
        """Store ``stream`` under ``key``; raise ObjectExists if the key is taken."""

    def open(self, key: str) -> BinaryIO:
        """Return a readable stream of the object's bytes."""

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None:
        """Delete the object; deleting a missing key is not an error."""

    def list(self, prefix: str = "") -> Iterator[StoredObject]: ...

    def check(self) -> None:
        """Raise StorageUnavailable, saying why, when the folder or bucket cannot be used now (for /readyz)."""


class HashingReader:
    """A read-only, forward-only stream that hashes and counts what passes through it.

    It deliberately has no ``seek``, so consumers such as boto3 read it once, in order.
    """

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._hash = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        if data:
            self._hash.update(data)
            self.size += len(data)
        return data

    def readable(self) -> bool:
        return True

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()


def copy_stream(source: BinaryIO, target: BinaryIO) -> None:
    while chunk := source.read(CHUNK_SIZE):
        target.write(chunk)
