"""An optional rate limit on /v2 inference (``MODELYARD_V2_RATE``): one token bucket per client.

A client is a token (or a client address when /v2 is public). The buckets live in this process's
memory, so N inference processes together allow up to N times the rate. A bucket holds ``count``
requests and refills at ``count`` per period; one that stayed untouched for a whole period is full
again, so it is dropped then, and the number of buckets is bounded besides.
"""

from __future__ import annotations

import math
import time

from cachetools import TTLCache

MAX_CLIENTS = 100_000


class Throttle:
    def __init__(self, count: int, period: float, *, max_clients: int = MAX_CLIENTS) -> None:
        self.setting = (count, period)
        self.capacity = float(count)
        self.per_second = count / period
        # (tokens left, when they were counted); an entry's age restarts with every request of its client.
        self._buckets: TTLCache[str, tuple[float, float]] = TTLCache(maxsize=max_clients, ttl=period)

    def describe(self) -> str:
        count, period = self.setting
        unit = {1.0: "second", 60.0: "minute", 3600.0: "hour"}.get(period, f"{period:g} s")
        return f"{count} requests per {unit}"

    def wait(self, client: str) -> float:
        """Take one request from the client's bucket: 0 if allowed, else the seconds until one is available."""
        now = time.monotonic()
        tokens, then = self._buckets.get(client, (self.capacity, now))
        tokens = min(self.capacity, tokens + (now - then) * self.per_second)
        if tokens >= 1:
            self._buckets[client] = (tokens - 1, now)
            return 0.0
        self._buckets[client] = (tokens, now)
        return (1 - tokens) / self.per_second


def retry_after(seconds: float) -> str:
    """A Retry-After value: whole seconds, at least one."""
    return str(max(1, math.ceil(seconds)))
