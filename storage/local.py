"""Artifacts in a local folder (the embedded default)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from storage.base import (
    CHUNK_SIZE,
    HashingReader,
    ObjectExists,
    ObjectNotFound,
    StorageUnavailable,
    StoredObject,
    WriteResult,
)

_TMP_PREFIX = ".incoming-"


class LocalStorage:
    """Objects are plain files under ``root``; keys map to relative paths."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in {"", ".", ".."} for p in parts):
            raise ValueError(f"invalid storage key {key!r}")
        return self.root.joinpath(*parts)

    def write(self, key: str, stream: BinaryIO) -> WriteResult:
        path = self._path(key)
        if path.exists():
            raise ObjectExists(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        reader = HashingReader(stream)
        fd, tmp_name = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := reader.read(CHUNK_SIZE):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            # link() fails if the key appeared meanwhile, so an artifact is never replaced.
            try:
                os.link(tmp_name, path)
            except FileExistsError as exc:
                raise ObjectExists(key) from exc
        finally:
            os.unlink(tmp_name)
        return WriteResult(key=key, sha256=reader.sha256, size=reader.size)

    def open(self, key: str) -> BinaryIO:
        try:
            return self._path(key).open("rb")
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass

    def list(self, prefix: str = "") -> Iterator[StoredObject]:
        if not self.root.exists():
            return
        for dirpath, _dirs, files in os.walk(self.root):
            for name in sorted(files):
                if name.startswith(_TMP_PREFIX):
                    continue
                full = Path(dirpath) / name
                key = full.relative_to(self.root).as_posix()
                if not key.startswith(prefix):
                    continue
                stat = full.stat()
                yield StoredObject(
                    key=key, size=stat.st_size, last_modified=datetime.fromtimestamp(stat.st_mtime, tz=UTC)
                )

    def check(self) -> None:
        # Writes would create a missing folder, but a configured folder that has gone (an unmounted
        # volume, a typo) would then fill up an empty one that no other process sees: say so instead.
        if not self.root.is_dir():
            raise StorageUnavailable(f"folder {self.root} does not exist")
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise StorageUnavailable(f"folder {self.root} is not writable")
