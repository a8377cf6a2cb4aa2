"""Token checks for /v2 without a database query per request.

A token is looked up once (in a worker thread) and the answer is cached for a minute. If the
database is unreachable, a token seen before keeps working until the database answers again.
"""

from __future__ import annotations

import hashlib
import threading
import time

from django.db import DatabaseError, close_old_connections

from registry.auth import authenticate_token, has_role
from registry.models import Role

TTL_SECONDS = 60.0


class TokenCache:
    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, bool]] = {}
        self._lock = threading.Lock()

    def cached(self, raw: str) -> bool | None:
        """The cached verdict if still fresh; None means "ask the database" (call :meth:`check`)."""
        entry = self._entries.get(hashlib.sha256(raw.encode()).hexdigest())
        if entry is not None and entry[0] > time.monotonic():
            return entry[1]
        return None

    def check(self, raw: str) -> bool:
        """Look the token up; blocking, so call it off the event loop."""
        key = hashlib.sha256(raw.encode()).hexdigest()
        try:
            close_old_connections()
            token = authenticate_token(raw)
            allowed = token is not None and has_role(token.user, Role.INFERENCE)
        except DatabaseError:
            previous = self._entries.get(key)
            return bool(previous and previous[1])
        with self._lock:
            self._entries[key] = (time.monotonic() + TTL_SECONDS, allowed)
        return allowed
