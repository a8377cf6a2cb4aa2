"""Token checks for /v2 without a database query per request.

A token is looked up once (in a worker thread) and its grant (allowed, and to which models; known
but without the inference role, a 403; refused, a 401) is cached for ``TTL_SECONDS``, so a revoked
token, or one whose user lost the role, stops working on /v2 within that time. The grant keeps the
token's model patterns, so the verdict for each model is decided in memory
(``registry.serving.TokenGrant``): one entry per token, whatever models it calls. The cache is
bounded: a flood of distinct tokens evicts the oldest verdicts instead of growing memory, and a
string that is not shaped like a Modelyard token is refused at once, without a database query and
without a cache entry. If the database is unreachable, a token that was allowed before keeps
working until it answers again.
"""

from __future__ import annotations

import hashlib
import threading

from cachetools import LRUCache, TTLCache
from django.conf import settings
from django.db import DatabaseError, close_old_connections

from registry.serving import REFUSED_GRANT, InferenceAccess, TokenGrant, token_grant, token_shaped

TTL_SECONDS = 5.0


def token_key(raw: str) -> str | None:
    """The cache key of a well-formed token; None for a string that cannot be a Modelyard token."""
    if not token_shaped(raw):
        return None
    return hashlib.sha256(raw.encode()).hexdigest()


class TokenCache:
    """Grants (what may this token do on /v2?) by token hash, bounded in size and age."""

    def __init__(self, *, max_entries: int | None = None, ttl: float = TTL_SECONDS) -> None:
        size = max_entries or settings.V2_TOKEN_CACHE_ENTRIES
        self.ttl = ttl
        self._grants: TTLCache[str, TokenGrant] = TTLCache(maxsize=size, ttl=ttl)
        # Allowed tokens' grants, kept past their TTL for one purpose: serving on while the database is down.
        self._allowed_before: LRUCache[str, TokenGrant] = LRUCache(maxsize=size)
        self._lock = threading.Lock()  # cachetools caches are not thread-safe; check() runs in worker threads

    def __len__(self) -> int:
        with self._lock:
            return len(self._grants)

    def cached_grant(self, raw: str) -> TokenGrant | None:
        """The grant if it is known without the database; None means "ask it" (call :meth:`check_grant`)."""
        key = token_key(raw)
        if key is None:
            return REFUSED_GRANT
        with self._lock:
            return self._grants.get(key)

    def check_grant(self, raw: str) -> TokenGrant:
        """Look the token up; blocking, so call it off the event loop."""
        key = token_key(raw)
        if key is None:
            return REFUSED_GRANT
        try:
            close_old_connections()
            grant = token_grant(raw)
        except DatabaseError:
            with self._lock:
                return self._allowed_before.get(key) or REFUSED_GRANT
        with self._lock:
            self._grants[key] = grant
            if grant.access is InferenceAccess.ALLOWED:
                self._allowed_before[key] = grant
            else:
                self._allowed_before.pop(key, None)
        return grant

    def cached(self, raw: str, model: str | None = None) -> InferenceAccess | None:
        """The verdict (for ``model``, when named) if it is known without the database; None means "ask it"."""
        grant = self.cached_grant(raw)
        return None if grant is None else grant.on(model)

    def check(self, raw: str, model: str | None = None) -> InferenceAccess:
        """The verdict (for ``model``, when named), looked up; blocking, so call it off the event loop."""
        return self.check_grant(raw).on(model)
