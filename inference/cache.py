"""A local cache of version bundles keyed by sha256: streamed in, verified before every load, evicted LRU."""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prometheus_client import Counter

from inference.verify import VerificationFailed
from modelyard import metrics as exposition
from storage import get_storage

logger = logging.getLogger(__name__)
CHUNK = 1024 * 1024
# Bundles are folders named by a sha256; anything else here (the TensorRT engine cache, the optimised
# models of OptimizedModels, bounded on their own) is never evicted by ArtifactCache.evict.
_BUNDLE_NAME = re.compile(r"[0-9a-f]{64}")
OPTIMIZED_DIR = "optimized"

OPTIMIZED_MODELS = Counter(
    "modelyard_optimized_models",
    "ONNX Runtime's saved optimised models: hit (loaded from the cache), saved (optimised and written), "
    "rejected (its bytes or record did not check out: deleted and optimised again), failed (could not be saved)",
    ["event"],
    registry=exposition.REGISTRY,
)


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
        self._optimized: OptimizedModels | None = None
        root.mkdir(parents=True, exist_ok=True)

    @property
    def optimized(self) -> OptimizedModels:
        """The optimised models saved beside the bundles (``root/optimized/``), bounded on their own."""
        if self._optimized is None:
            from django.conf import settings

            self._optimized = OptimizedModels(
                self.root / OPTIMIZED_DIR, settings.ORT_OPTIMIZED_CACHE_MAX_BYTES, settings.SECRET_KEY
            )
        return self._optimized

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


class OptimizedModels:
    """ONNX Runtime's optimised graphs of versions, ``root/<key>-<tag>.onnx``, each with a record ``.json``.

    The key (``inference.sessions.optimized_key``) names the version's file digests, the ONNX Runtime
    build, the provider, the optimisation level and the CPU, so a file is only ever loaded where it
    was made for; the tag names the secret key. The record holds the file's sha256 and an HMAC of
    (key, sha256) under the secret key: a file whose bytes changed, or whose record was rewritten
    without the secret, is deleted (counted as ``rejected``) and made again, never loaded. Writes go
    to a temporary file, renamed into place, under a lock per key, so the host's other processes wait
    for the first one's file instead of optimising too. At most ``max_bytes`` in all: least recently
    used files go first.
    """

    def __init__(self, root: Path, max_bytes: int, secret: str) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._secret = hashlib.sha256(b"modelyard optimized model\0" + secret.encode()).digest()
        self._tag = hmac.new(self._secret, b"name", hashlib.sha256).hexdigest()[:16]
        # Files this process checked, by what a write would change (inode, size, mtime and ctime, which no
        # one but the clock's owner sets): those are not read and hashed again.
        self._checked: dict[str, tuple[int, int, int, int, int]] = {}
        root.mkdir(parents=True, exist_ok=True)

    def _name(self, key: str) -> str:
        # Processes with another secret key cannot check this one's graphs: they keep their own, beside these,
        # instead of rejecting and replacing each other's in turn.
        return f"{key}-{self._tag}"

    def _paths(self, key: str) -> tuple[Path, Path]:
        return self.root / f"{self._name(key)}.onnx", self.root / f"{self._name(key)}.json"

    def _mac(self, key: str, sha256: str) -> str:
        return hmac.new(self._secret, f"{key}\0{sha256}".encode(), hashlib.sha256).hexdigest()

    def get(self, key: str) -> Path | None:
        """The verified optimised model for ``key``, or None (absent, or rejected and deleted)."""
        model, record = self._paths(key)
        if not model.exists() or not record.exists():
            return None
        if self._checked.get(key) == _identity(model):
            self._touch(key, model)
            OPTIMIZED_MODELS.labels("hit").inc()
            return model
        try:
            recorded = json.loads(record.read_text())
            sha256, mac = str(recorded["sha256"]), str(recorded["mac"])
        except (OSError, ValueError, KeyError, TypeError):
            sha256, mac = "", ""
        actual = sha256_of(model)
        if not (hmac.compare_digest(actual, sha256) and hmac.compare_digest(self._mac(key, sha256), mac)):
            logger.warning("optimised model %s does not match its record: deleted, it is optimised again", model)
            OPTIMIZED_MODELS.labels("rejected").inc()
            model.unlink(missing_ok=True)
            record.unlink(missing_ok=True)
            self._checked.pop(key, None)
            return None
        self._touch(key, model)
        OPTIMIZED_MODELS.labels("hit").inc()
        return model

    def _touch(self, key: str, model: Path) -> None:
        """Its last use, for LRU eviction; and what this process knows it checked."""
        now = time.time_ns()
        os.utime(model, ns=(now, now))
        self._checked[key] = _identity(model)

    def get_or_make(self, key: str, make: Callable[[Path], object]) -> Path | None:
        """The optimised model for ``key``, made with ``make(path)`` if no verified one exists; None if it can't be.

        ``make`` writes the file at the path it is given. One process of the host makes a key at a time.
        """
        if self.max_bytes <= 0:
            return None
        with (self.root / f".{self._name(key)}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                found = self.get(key)
                if found is not None:
                    return found
                return self._make(key, make)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _make(self, key: str, make: Callable[[Path], object]) -> Path | None:
        model, record = self._paths(key)
        tmp = self.root / f".{key}.{os.getpid()}.{threading.get_ident()}.part.onnx"
        tmp_record = tmp.with_suffix(".json")
        try:
            make(tmp)
            size = tmp.stat().st_size
            if size > self.max_bytes:
                logger.info("optimised model %s (%d bytes) is over MODELYARD_ORT_OPTIMIZED_CACHE_MAX_BYTES", key, size)
                return None
            sha256 = sha256_of(tmp)
            tmp_record.write_text(json.dumps({"sha256": sha256, "mac": self._mac(key, sha256)}))
            os.replace(tmp, model)
            os.replace(tmp_record, record)
            self._touch(key, model)
        except Exception as exc:  # noqa: BLE001 - a model too large to save, a full disk: loaded as before
            logger.warning("could not save the optimised model %s: %s", key, exc)
            OPTIMIZED_MODELS.labels("failed").inc()
            record.unlink(missing_ok=True)
            return None
        finally:
            tmp.unlink(missing_ok=True)
            tmp_record.unlink(missing_ok=True)
        OPTIMIZED_MODELS.labels("saved").inc()
        self.evict(keep={key})
        return model

    def evict(self, *, keep: set[str]) -> list[str]:
        """Delete least-recently-used optimised models (of any process) until under ``max_bytes``; never ``keep``'s."""
        kept = {self._name(key) for key in keep}
        entries = []
        for path in self.root.glob("*.onnx"):
            if path.name.startswith("."):
                continue
            try:
                entries.append((path.stat().st_mtime_ns, path.stem, path.stat().st_size))
            except FileNotFoundError:
                continue
        total = sum(size for _, _, size in entries)
        removed = []
        for _, name, size in sorted(entries):
            if total <= self.max_bytes:
                break
            if name in kept:
                continue
            (self.root / f"{name}.json").unlink(missing_ok=True)
            (self.root / f"{name}.onnx").unlink(missing_ok=True)
            total -= size
            removed.append(name)
        return removed


def _identity(path: Path) -> tuple[int, int, int, int, int]:
    stat = path.stat()
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
