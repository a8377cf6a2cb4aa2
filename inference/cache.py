"""A local cache of version bundles keyed by sha256: streamed in, verified before every load, evicted LRU."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from inference.verify import VerificationFailed
from storage import get_storage

logger = logging.getLogger(__name__)
CHUNK = 1024 * 1024
# Bundles are folders named by a sha256; anything else here (the TensorRT engine cache) is never evicted.
_BUNDLE_NAME = re.compile(r"[0-9a-f]{64}")


class HashMismatch(VerificationFailed):
    """A file's bytes do not match the sha256 the registry recorded: changed after validation, so never loaded."""


class BundleFile(Protocol):
    """One file of a bundle: where storage keeps it, and the sha256 the registry recorded (a ``ServedFile``)."""

    @property
    def name(self) -> str: ...
    @property
    def storage_key(self) -> str: ...
    @property
    def sha256(self) -> str: ...
    @property
    def size_bytes(self) -> int: ...


@dataclass(frozen=True)
class CachedFile:
    """A bundle file named by hand (the cache's own tests, tools); the runtime passes the registry's rows."""

    name: str
    storage_key: str
    sha256: str
    size_bytes: int


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class ArtifactCache:
    """Bundles live in ``root/<sha256 of the .onnx>/`` under their upload names."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        root.mkdir(parents=True, exist_ok=True)

    def bundle(self, sha256: str, files: Iterable[BundleFile]) -> Path:
        """Return the bundle folder with every file present and verified, downloading what is missing."""
        return self.bundle_with_digests(sha256, files)[0]

    def bundle_with_digests(self, sha256: str, files: Iterable[BundleFile]) -> tuple[Path, dict[str, str]]:
        """The bundle folder and the sha256 of each file as read now, for its signature to be checked against.

        Every file is read and hashed once per call: a cached copy as it is read from disk, a missing
        one as it streams in from storage. A cached copy that no longer matches (a damaged disk, a
        hand edit) is deleted and downloaded again; bytes fresh from storage that do not match raise
        :class:`HashMismatch`, and are deleted so that they are never used.
        """
        folder = self.root / sha256
        folder.mkdir(parents=True, exist_ok=True)
        digests: dict[str, str] = {}
        for item in files:
            path = folder / item.name
            if path.exists():
                actual = sha256_of(path)
                if actual == item.sha256:
                    digests[item.name] = actual
                    continue
                logger.warning("cached %s is corrupt (sha256 %s); downloading it again", path, actual)
                path.unlink(missing_ok=True)
            actual = self._download(item, path)
            if actual != item.sha256:
                path.unlink(missing_ok=True)  # a corrupt copy is never reused
                raise HashMismatch(
                    f"sha256 mismatch for {item.name}: storage holds {actual}, the registry recorded {item.sha256}"
                )
            digests[item.name] = actual
        # The bundle's mtime is its last use, for LRU eviction. Set it from the fine clock: a bare
        # utime() takes the kernel's coarse one, which gives uses milliseconds apart the same time.
        now = time.time_ns()
        os.utime(folder, ns=(now, now))
        return folder, digests

    def _download(self, item: BundleFile, path: Path) -> str:
        """Stream the object to ``path``, hashing it on the way; its sha256."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.part")
        digest = hashlib.sha256()
        try:
            with get_storage().open(item.storage_key) as source, tmp.open("wb") as out:
                while chunk := source.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return digest.hexdigest()

    def evict(self, *, keep: set[str]) -> list[str]:
        """Delete least-recently-used bundles until under the size limit; never those in ``keep``."""
        with self._lock:
            bundles = []
            for folder in self.root.iterdir():
                try:  # a load may be writing or replacing files in a folder right now
                    if folder.is_dir() and _BUNDLE_NAME.fullmatch(folder.name):
                        size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
                        bundles.append((folder.stat().st_mtime_ns, folder, size))
                except FileNotFoundError:
                    continue
            total = sum(size for _, _, size in bundles)
            removed = []
            for _, folder, size in sorted(bundles, key=lambda b: (b[0], b[1].name)):
                if total <= self.max_bytes:
                    break
                if folder.name in keep:
                    continue
                shutil.rmtree(folder, ignore_errors=True)
                total -= size
                removed.append(folder.name)
            if removed:
                logger.info("evicted %d cached bundles at %s", len(removed), time.strftime("%H:%M:%S"))
            return removed
