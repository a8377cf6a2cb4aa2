"""The response cache: an alias that opted in answers a repeated request without running the model.

Embedding and scoring workloads send the same inputs again and again. An alias with a ``cache``
setting (``registry.serving.CacheSpec``: ``max_bytes``, ``ttl_seconds``) keeps the outputs its
version computed, keyed by

- the served version's digests (its bundle's sha256 and every file's), so an entry never crosses
  versions: once the alias moves, the new version's requests make other keys, and nothing the old
  version computed can answer them; its entries are also dropped when it is released;
- a blake2b hash of every input tensor's name, datatype, shape and bytes.

What is cached is the model's computed output tensors, before the response is shaped: every output,
before classification, before encoding. The rest of a request (which outputs, binary or JSON, gRPC
or HTTP, top-N classification, priority, timeout, id) changes only how the answer is written, so
all of them share one entry and none needs to be in the key. A failed run is never cached.

Entries live in this process's memory (:class:`MemoryStore`: least recently used first out, bounded
by the alias's ``max_bytes``, each entry expiring after ``ttl_seconds``), or in Redis when
``MODELYARD_RESPONSE_CACHE_REDIS_URL`` is set (:class:`RedisStore`: shared by the fleet, expiry by
Redis's ``EX``, its total bounded by Redis's own ``maxmemory``). Either way an answer larger than a
quarter of ``max_bytes`` or than ``MODELYARD_RESPONSE_CACHE_MAX_ENTRY_BYTES`` is not kept, so that
one huge answer cannot push everything else out.

A Redis that does not answer makes a miss, never a failed request.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import orjson
from django.conf import settings
from redis.exceptions import RedisError

from inference.metrics import CacheMetrics
from registry.serving import PRODUCTION, CacheSpec, CacheTotals, VersionSpec

__all__ = ["AliasCache", "MemoryStore", "RedisStore", "ResponseCaches", "inputs_digest", "version_digest"]

logger = logging.getLogger(__name__)

Outputs = Mapping[str, np.ndarray]
ENTRY_OVERHEAD = 256  # bytes counted per entry beyond its arrays: the key, the dictionary, the bookkeeping
REDIS_PREFIX = "modelyard:response:"
REDIS_TIMEOUT_SECONDS = 0.5


def version_digest(spec: VersionSpec) -> str:
    """What identifies the bytes a version computes with: its bundle's digest and each of its files'."""
    digest = hashlib.blake2b(spec.sha256.encode(), digest_size=16)
    for served in sorted(spec.files, key=lambda f: f.name):
        digest.update(f"\0{served.name}\0{served.sha256}".encode())
    return digest.hexdigest()


def inputs_digest(inputs: Mapping[str, np.ndarray]) -> str:
    """A blake2b hash of every input's name, datatype, shape and bytes (BYTES elements length-prefixed)."""
    digest = hashlib.blake2b(digest_size=32)
    for name in sorted(inputs):
        array = inputs[name]
        digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        if array.dtype == object:
            for item in array.reshape(-1):
                raw = item if isinstance(item, bytes) else str(item).encode()
                digest.update(struct.pack("<Q", len(raw)))
                digest.update(raw)
        else:
            digest.update(np.ascontiguousarray(array).data)
    return digest.hexdigest()


def answer_bytes(outputs: Outputs) -> int:
    """What an answer costs the memory bound: its arrays plus a fixed overhead."""
    return ENTRY_OVERHEAD + sum(int(array.nbytes) for array in outputs.values())


def frozen(outputs: Outputs) -> dict[str, np.ndarray]:
    """Read-only copies: a batch's outputs are views of the whole batch, which must not stay alive with them."""
    kept = {}
    for name, array in outputs.items():
        copy = np.array(array, copy=True, order="C")
        copy.setflags(write=False)
        kept[name] = copy
    return kept


class VersionCounts:
    """One loaded version's response cache counts in this process: the fleet page's and ``/metrics``'s."""

    __slots__ = ("evictions", "hits", "metrics", "misses")

    def __init__(self, model: str, version: str) -> None:
        self.metrics = CacheMetrics(model, version)
        self.hits = self.misses = self.evictions = 0

    def hit(self) -> None:
        self.hits += 1
        self.metrics.hits.inc()

    def miss(self) -> None:
        self.misses += 1
        self.metrics.misses.inc()

    def evicted(self) -> None:
        self.evictions += 1
        self.metrics.evictions.inc()

    def totals(self) -> CacheTotals:
        return CacheTotals(self.hits, self.misses, self.evictions, self.metrics.nbytes)


class Store(Protocol):
    async def get(self, key: str) -> dict[str, np.ndarray] | None: ...

    async def put(self, key: str, outputs: Outputs, counts: VersionCounts) -> bool: ...

    def drop_version(self, digest: str) -> None: ...

    def clear(self) -> None: ...

    def resize(self, spec: CacheSpec) -> None: ...


class MemoryStore:
    """Answers in this process's memory: at most ``max_bytes`` of them, least recently used out first.

    Keys are ``version digest:inputs digest``. The loop thread reads and writes; the reconcile thread
    drops a released version's entries and resizes: one lock, never held across an await.
    """

    def __init__(self, spec: CacheSpec, max_entry_bytes: int) -> None:
        self.spec = spec
        self.max_entry_bytes = max_entry_bytes
        self.nbytes = 0
        # key -> (expires at, outputs, bytes, whose counts)
        self._entries: OrderedDict[str, tuple[float, dict[str, np.ndarray], int, VersionCounts]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def entry_limit(self) -> int:
        return min(self.max_entry_bytes, self.spec.max_bytes // 4)

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: str) -> dict[str, np.ndarray] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry[0] <= time.monotonic():
                self._remove(key)
                return None
            self._entries.move_to_end(key)
            return entry[1]

    async def put(self, key: str, outputs: Outputs, counts: VersionCounts) -> bool:
        size = answer_bytes(outputs)
        if size > self.entry_limit:
            return False
        kept = frozen(outputs)
        with self._lock:
            if key in self._entries:
                self._remove(key)
            self._make_room(size)
            self._entries[key] = (time.monotonic() + self.spec.ttl_seconds, kept, size, counts)
            self.nbytes += size
            counts.metrics.held(size)
        return True

    def _make_room(self, size: int) -> None:
        now = time.monotonic()
        while self._entries and self.nbytes + size > self.spec.max_bytes:
            key, (expires, _, _, counts) = next(iter(self._entries.items()))
            self._remove(key)
            if expires > now:  # pushed out by the bound, not by its age
                counts.evicted()

    def _remove(self, key: str) -> None:
        _, _, size, counts = self._entries.pop(key)
        self.nbytes -= size
        counts.metrics.held(-size)

    def drop_version(self, digest: str) -> None:
        prefix = digest + ":"
        with self._lock:
            for key in [k for k in self._entries if k.startswith(prefix)]:
                self._remove(key)

    def clear(self) -> None:
        with self._lock:
            for key in list(self._entries):
                self._remove(key)

    def resize(self, spec: CacheSpec) -> None:
        with self._lock:
            self.spec = spec
            self._make_room(0)


class RedisStore:
    """Answers in Redis, shared by every inference process: ``EX`` the alias's TTL, one key per answer.

    An entry is a JSON header (each output's name, dtype and shape) and the arrays' bytes; BYTES
    outputs are not kept (they would need pickle, and nothing read from Redis is unpickled).
    """

    def __init__(self, url: str, spec: CacheSpec, max_entry_bytes: int) -> None:
        self.url = url
        self.spec = spec
        self.max_entry_bytes = max_entry_bytes
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._warned = 0.0

    @property
    def entry_limit(self) -> int:
        return min(self.max_entry_bytes, self.spec.max_bytes // 4)

    def _async_client(self) -> Any:
        import redis.asyncio

        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:  # a client is bound to the loop it first ran on
            self._client = redis.asyncio.Redis.from_url(
                self.url, socket_timeout=REDIS_TIMEOUT_SECONDS, socket_connect_timeout=REDIS_TIMEOUT_SECONDS
            )
            self._loop = loop
        return self._client

    def _failed(self, what: str, exc: Exception) -> None:
        if time.monotonic() - self._warned > 60:  # once a minute at most: a down Redis must not flood the log
            self._warned = time.monotonic()
            logger.warning("response cache: Redis %s failed, answering without it: %s", what, exc)

    async def get(self, key: str) -> dict[str, np.ndarray] | None:
        try:
            raw = await self._async_client().get(REDIS_PREFIX + key)
        except (RedisError, OSError) as exc:
            self._failed("read", exc)
            return None
        return None if raw is None else _unpack(raw)

    async def put(self, key: str, outputs: Outputs, counts: VersionCounts) -> bool:
        if answer_bytes(outputs) > self.entry_limit or any(a.dtype == object for a in outputs.values()):
            return False
        try:
            await self._async_client().set(REDIS_PREFIX + key, _pack(outputs), ex=self.spec.ttl_seconds)
        except (RedisError, OSError) as exc:
            self._failed("write", exc)
            return False
        return True

    def drop_version(self, digest: str) -> None:
        import redis

        try:
            client = redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=2)
            with client:
                batch = []
                for key in client.scan_iter(match=f"{REDIS_PREFIX}{digest}:*", count=1000):
                    batch.append(key)
                    if len(batch) >= 1000:
                        client.delete(*batch)
                        batch.clear()
                if batch:
                    client.delete(*batch)
        except (RedisError, OSError) as exc:
            self._failed("drop", exc)

    def clear(self) -> None:
        pass  # shared with the fleet: entries stay until their TTL (they are keyed by version, so never wrong)

    def resize(self, spec: CacheSpec) -> None:
        self.spec = spec


def _pack(outputs: Outputs) -> bytes:
    header = [{"name": n, "dtype": a.dtype.str, "shape": list(a.shape)} for n, a in outputs.items()]
    head = orjson.dumps(header)
    return b"".join(
        [struct.pack("<I", len(head)), head, *(np.ascontiguousarray(a).tobytes() for a in outputs.values())]
    )


def _unpack(raw: bytes) -> dict[str, np.ndarray] | None:
    try:
        (length,) = struct.unpack_from("<I", raw)
        header = orjson.loads(raw[4 : 4 + length])
        offset = 4 + length
        outputs = {}
        for item in header:
            dtype = np.dtype(item["dtype"])
            if dtype.hasobject:
                return None
            count = int(np.prod(item["shape"], dtype=np.int64))
            array = np.frombuffer(raw, dtype=dtype, count=count, offset=offset).reshape(item["shape"])
            offset += array.nbytes
            outputs[item["name"]] = array  # read-only: a view of the bytes Redis sent
        return outputs
    except (ValueError, TypeError, KeyError, struct.error, orjson.JSONDecodeError):
        return None  # not ours, or cut short: a miss


class AliasCache:
    """One alias's response cache: its store and setting."""

    __slots__ = ("alias", "model", "spec", "store")

    def __init__(self, model: str, alias: str, spec: CacheSpec, store: Store) -> None:
        self.model = model
        self.alias = alias
        self.spec = spec
        self.store = store


class ResponseCaches:
    """Every alias's response cache in this process, set from the desired state on each reconcile pass."""

    def __init__(self, *, redis_url: str | None = None, max_entry_bytes: int | None = None) -> None:
        self.redis_url = redis_url if redis_url is not None else settings.RESPONSE_CACHE_REDIS_URL
        self.max_entry_bytes = max_entry_bytes or settings.RESPONSE_CACHE_MAX_ENTRY_BYTES
        self.by_alias: dict[tuple[str, str], AliasCache] = {}  # replaced whole: the loop reads it without a lock
        self._digests: dict[int, str] = {}  # version id -> version_digest (a version's files never change)
        self._counts: dict[int, VersionCounts] = {}
        self._lock = threading.Lock()

    def _store(self, spec: CacheSpec) -> Store:
        if self.redis_url:
            return RedisStore(self.redis_url, spec, self.max_entry_bytes)
        return MemoryStore(spec, self.max_entry_bytes)

    def configure(self, caches: Mapping[str, Mapping[str, CacheSpec]]) -> None:
        """Take the aliases' settings: new caches start empty, a changed one is resized, a dropped one goes."""
        with self._lock:
            fresh: dict[tuple[str, str], AliasCache] = {}
            for model, by_alias in caches.items():
                for alias, spec in by_alias.items():
                    cache = self.by_alias.get((model, alias))
                    if cache is None:
                        cache = AliasCache(model, alias, spec, self._store(spec))
                    elif cache.spec != spec:
                        cache.store.resize(spec)
                        cache.spec = spec
                    fresh[(model, alias)] = cache
            gone = [cache for key, cache in self.by_alias.items() if key not in fresh]
            self.by_alias = fresh
        for cache in gone:
            cache.store.clear()

    def lookup(self, model: str, ref: str | None) -> AliasCache | None:
        """The cache of the alias ``ref`` names (production for None); none for a version number."""
        if not self.by_alias or (ref is not None and ref.isdigit()):
            return None
        return self.by_alias.get((model, ref or PRODUCTION))

    def key(self, spec: VersionSpec, inputs: Mapping[str, np.ndarray]) -> str:
        digest = self._digests.get(spec.version_id)
        if digest is None:
            digest = self._digests[spec.version_id] = version_digest(spec)
        return f"{digest}:{inputs_digest(inputs)}"

    def counts(self, spec: VersionSpec, version_label: str) -> VersionCounts:
        counts = self._counts.get(spec.version_id)
        if counts is None:
            counts = self._counts[spec.version_id] = VersionCounts(spec.model, version_label)
        return counts

    def totals(self, version_id: int) -> CacheTotals | None:
        """The version's counts for the fleet page; None when no caching alias ever reached it here."""
        counts = self._counts.get(version_id)
        return None if counts is None else counts.totals()

    def release(self, spec: VersionSpec) -> None:
        """The version is released: drop its entries from every alias's store, and its counts."""
        digest = self._digests.pop(spec.version_id, None) or version_digest(spec)
        for cache in list(self.by_alias.values()):
            cache.store.drop_version(digest)
        counts = self._counts.pop(spec.version_id, None)
        if counts is not None:
            counts.metrics.retire()
