"""Token checks for /v2 without a database query per request.

A token is looked up once (in a worker thread) and the verdict (allowed; known but without the
inference role, a 403; refused, a 401) is cached for ``TTL_SECONDS``, so a revoked token stops
working on /v2 within that time. The cache is bounded: a flood of distinct
tokens evicts the oldest verdicts instead of growing memory, and a string that is not shaped like
a Modelyard token is refused at once, without a database query and without a cache entry. If the
database is unreachable, a token that was allowed before keeps working until it answers again.
"""

from __future__ import annotations

import hashlib
import threading

from cachetools import LRUCache, TTLCache
from django.conf import settings
from django.db import DatabaseError, close_old_connections

from registry.serving import InferenceAccess, token_inference_access, token_shaped

TTL_SECONDS = 5.0


def token_key(raw: str) -> str | None:
    """The cache key of a well-formed token; None for a string that cannot be a Modelyard token."""
    if not token_shaped(raw):
        return None
    return hashlib.sha256(raw.encode()).hexdigest()


class TokenCache:
    """Verdicts (what may this token do on /v2?) by token hash, bounded in size and age."""

    def __init__(self, *, max_entries: int | None = None, ttl: float = TTL_SECONDS) -> None:
        size = max_entries or settings.V2_TOKEN_CACHE_ENTRIES
        self.ttl = ttl
        self._verdicts: TTLCache[str, InferenceAccess] = TTLCache(maxsize=size, ttl=ttl)
        # Allowed tokens, kept past their TTL for one purpose: serving on while the database is down.
        self._allowed_before: LRUCache[str, bool] = LRUCache(maxsize=size)
        self._lock = threading.Lock()  # cachetools caches are not thread-safe; check() runs in worker threads

    def __len__(self) -> int:
        with self._lock:
            return len(self._verdicts)

    def cached(self, raw: str) -> InferenceAccess | None:
        """The verdict if it is known without the database; None means "ask it" (call :meth:`check`)."""
        key = token_key(raw)
        if key is None:
            return InferenceAccess.REFUSED
        with self._lock:
            return self._verdicts.get(key)

    def check(self, raw: str) -> InferenceAccess:
        """Look the token up; blocking, so call it off the event loop."""
        key = token_key(raw)
        if key is None:
            return InferenceAccess.REFUSED
        try:
            close_old_connections()
            verdict = token_inference_access(raw)
        except DatabaseError:
            with self._lock:
                return InferenceAccess.ALLOWED if self._allowed_before.get(key) else InferenceAccess.REFUSED
        with self._lock:
            self._verdicts[key] = verdict
            if verdict is InferenceAccess.ALLOWED:
                self._allowed_before[key] = True
            else:
                self._allowed_before.pop(key, None)
        return verdict
