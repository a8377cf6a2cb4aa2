"""Request rate limits for the registry API: per token (or browser session), and per client address.

Requests without valid credentials are counted per address while they are authenticated
(``registry.access.auth``), so that the permission that refuses them (401) cannot skip the count.

Counts are fixed one-period windows kept in Django's cache with an atomic increment, so every
server process sharing a Redis cache counts together (DRF's own throttles read, append and write
back a list, which loses counts between processes). A window allows at most twice the rate across
its boundary; that is the price of one counter per caller.

Rates are read from Django settings on every request, so an operator's value (and a test's
``settings`` override) always applies. When Redis does not answer, requests go through: a
throttle must not take the registry down with it.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from django.conf import settings
from django.core.cache import BaseCache, caches
from redis.exceptions import RedisError
from rest_framework import exceptions
from rest_framework.throttling import BaseThrottle

from modelyard.env import parse_rate
from registry.access import clients

logger = logging.getLogger(__name__)


def client_address(request: Any) -> str:
    """The caller's address as the audit log records it (X-Forwarded-For only via a trusted proxy)."""
    return clients.client_address(request.META)[0]


class RateLimited(exceptions.Throttled):
    """429 naming the limit that was hit; DRF adds ``Retry-After`` from ``wait``."""

    def __init__(self, *, wait: int, message: str) -> None:
        super().__init__(wait=wait)
        self.detail = exceptions.ErrorDetail(message, code=self.default_code)  # without DRF's generic sentence


class _WindowThrottle(BaseThrottle):
    scope = ""
    setting = ""  # the Django setting holding the rate, e.g. API_RATE_USER
    per = ""  # how the message names the counted caller

    def __init__(self, cache: BaseCache | None = None) -> None:
        self.cache = cache

    def identity(self, request: Any) -> str | None:
        raise NotImplementedError

    def allow_request(self, request: Any, view: Any) -> bool:
        ident = self.identity(request)
        if ident is not None:
            self.consume(ident)
        return True

    def consume(self, ident: str) -> None:
        """Count one request for ``ident``; raises RateLimited past the rate."""
        text = getattr(settings, self.setting)
        rate = parse_rate(text) if text else None
        if rate is None:
            return
        limit, period = rate
        now = time.time()
        window = int(now // period)
        key = f"throttle:{self.scope}:{ident}:{period}:{window}"
        try:
            used = _increment(self.cache or caches["default"], key, timeout=period + 1)
        except (RedisError, OSError) as exc:
            logger.warning("rate limit not checked, the cache did not answer: %s", exc)
            return
        if used > limit:
            wait = max(1, math.ceil((window + 1) * period - now))
            raise RateLimited(
                wait=wait,
                message=f"rate limit exceeded: {limit} requests per {_period_words(period)} {self.per} "
                f"(MODELYARD_{self.setting}); retry in {wait} s",
            )


def _increment(cache: BaseCache, key: str, *, timeout: int) -> int:
    try:
        return int(cache.incr(key))
    except ValueError:  # no counter yet in this window (or it expired a moment ago)
        if cache.add(key, 1, timeout=timeout):
            return 1
        return int(cache.incr(key))  # another process created it first


def _period_words(seconds: int) -> str:
    return {1: "second", 60: "minute", 3600: "hour", 86400: "day"}.get(seconds, f"{seconds} s")


class TokenRateThrottle(_WindowThrottle):
    """Authenticated callers: counted per API token, or per user for a browser session."""

    scope = "user"
    setting = "API_RATE_USER"
    per = "per API token"

    def identity(self, request: Any) -> str | None:
        if not request.user.is_authenticated:
            return None
        token_id = getattr(request.auth, "pk", None)
        return f"token:{token_id}" if token_id is not None else f"session-user:{request.user.pk}"


class ClientAddressThrottle(_WindowThrottle):
    """Callers without valid credentials, counted per client address as they are authenticated.

    Not a DRF throttle class: DRF runs those after the permissions, which refuse a request without
    credentials first. ``registry.access.auth`` counts a bad token (``BearerTokenAuthentication``) and a
    request with no credentials at all (``AddressCount``) with :meth:`consume`.
    """

    scope = "anon"
    setting = "API_RATE_ANON"
    per = "per client address without valid credentials"
