"""API rate limits: per token, per client address for requests without valid credentials, shared through Redis."""

from __future__ import annotations

import os
import socket
import uuid

import pytest
from django.core.cache import caches
from django.test import Client

from registry.access.throttling import RateLimited, TokenRateThrottle
from registry.models import ApiToken, AuditEvent, AuthFailureWindow, RegisteredModel
from tests.support.people import make_person

pytestmark = pytest.mark.django_db

# Rates are per day in these tests: windows are aligned to the clock, and a per-minute window could
# roll over in the middle of a test.

MODELS = "/api/v1/models"
REDIS_URL = f"redis://127.0.0.1:6379/{os.environ.get('MODELYARD_TEST_REDIS_DB', '0')}"


def test_token_over_its_rate_gets_429_naming_the_limit(owner, settings):
    settings.API_RATE_USER = "3/day"
    assert [owner.get(MODELS).status_code for _ in range(3)] == [200, 200, 200]
    refused = owner.get(MODELS)
    assert refused.status_code == 429
    wait = int(refused["Retry-After"])
    assert 1 <= wait <= 86400
    assert refused.json() == {
        "error": f"rate limit exceeded: 3 requests per day per API token (MODELYARD_API_RATE_USER); retry in {wait} s",
        "detail": {"retry_after": wait},
    }


def test_each_token_has_its_own_count(owner, outsider, settings):
    settings.API_RATE_USER = "2/day"
    for _ in range(2):
        owner.get(MODELS)
    assert owner.get(MODELS).status_code == 429
    assert outsider.get(MODELS).status_code == 200
    # A second token of the same user is counted apart too.
    second = make_person("owner2")
    assert second.get(MODELS).status_code == 200


def test_writes_count_too_and_are_refused_before_they_run(owner, settings):
    settings.API_RATE_USER = "1/day"
    assert owner.post(MODELS, {"name": "first"}).status_code == 201
    assert owner.post(MODELS, {"name": "second"}).status_code == 429
    assert not AuditEvent.objects.filter(action="model.create", target="second").exists()


def test_bad_tokens_count_per_address_and_stop_being_audited(db, settings):
    settings.API_RATE_ANON = "2/day"
    guesser = Client(REMOTE_ADDR="10.1.1.1")
    # X-Forwarded-For from the client is ignored: it cannot pick a fresh identity per request.
    statuses = [
        guesser.get(MODELS, HTTP_AUTHORIZATION=f"Bearer my_guess{i}_x", HTTP_X_FORWARDED_FOR=f"192.0.2.{i}").status_code
        for i in range(4)
    ]
    assert statuses == [401, 401, 429, 429]
    # Both refused tokens were counted in the address's failure window; the throttled ones were not.
    assert AuditEvent.objects.filter(action="auth.failed").count() == 1
    assert AuthFailureWindow.objects.get(source="10.1.1.1").count == 2
    refused = guesser.get(MODELS, HTTP_AUTHORIZATION="Bearer my_guess9_x")
    assert refused.json()["error"].startswith(
        "rate limit exceeded: 2 requests per day per client address without valid credentials "
        "(MODELYARD_API_RATE_ANON); retry in "
    )
    assert Client(REMOTE_ADDR="10.1.1.2").get(MODELS, HTTP_AUTHORIZATION="Bearer my_guess_x").status_code == 401


def test_requests_without_any_credentials_count_per_address(db, settings):
    settings.API_RATE_ANON = "2/day"
    stranger = Client(REMOTE_ADDR="10.1.1.3")
    # Refused by a permission (401) or not, each counts; past the rate it is 429 before any permission is asked.
    statuses = [stranger.get(MODELS).status_code, stranger.post(MODELS, {"name": "m"}).status_code]
    statuses += [stranger.get(MODELS).status_code, stranger.get("/api/v1/me").status_code]
    assert statuses == [401, 401, 429, 429]
    refused = stranger.get(MODELS)
    wait = int(refused["Retry-After"])
    assert refused.json() == {
        "error": "rate limit exceeded: 2 requests per day per client address without valid credentials "
        f"(MODELYARD_API_RATE_ANON); retry in {wait} s",
        "detail": {"retry_after": wait},
    }
    assert not RegisteredModel.objects.exists()
    assert Client(REMOTE_ADDR="10.1.1.4").get(MODELS).status_code == 401  # another address counts apart


def test_a_request_without_credentials_is_counted_once(db, settings):
    settings.API_RATE_ANON = "2/day"
    stranger = Client(REMOTE_ADDR="10.1.1.5")
    assert [stranger.get("/api/schema/").status_code for _ in range(3)] == [200, 200, 429]


def test_a_valid_token_is_not_held_back_by_its_address(owner, settings):
    settings.API_RATE_ANON = "1/day"
    Client().get(MODELS, HTTP_AUTHORIZATION="Bearer my_bad_token")
    assert Client().get(MODELS, HTTP_AUTHORIZATION="Bearer my_bad_token").status_code == 429
    assert owner.get(MODELS).status_code == 200  # same address (127.0.0.1), valid credentials


def test_anonymous_schema_requests_are_limited_per_address(db, settings):
    settings.API_RATE_ANON = "1/day"
    assert Client().get("/api/schema/").status_code == 200
    assert Client().get("/api/schema/").status_code == 429


def test_off_disables_a_limit(owner, settings):
    settings.API_RATE_USER = None  # what MODELYARD_API_RATE_USER=off gives
    assert {owner.get(MODELS).status_code for _ in range(5)} == {200}


def _redis_caches(prefix: str) -> dict[str, dict[str, object]]:
    redis: dict[str, object] = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": prefix,
    }
    return {"default": redis, "second": dict(redis)}


def test_redis_cache_shares_counts_between_clients(owner, settings):
    settings.CACHES = _redis_caches(f"test-{uuid.uuid4().hex}")
    settings.API_RATE_USER = "3/day"
    assert caches["default"] is not caches["second"]  # two clients, each with its own connection pool
    assert owner.get(MODELS).status_code == 200
    assert owner.get(MODELS).status_code == 200  # counted through the "default" client
    token_id = ApiToken.objects.get(prefix=owner.token.split("_")[1]).pk
    other_process = TokenRateThrottle(cache=caches["second"])
    other_process.consume(f"token:{token_id}")  # the third request, counted through the other client
    with pytest.raises(RateLimited):
        other_process.consume(f"token:{token_id}")
    assert owner.get(MODELS).status_code == 429


def test_unreachable_redis_lets_requests_through(owner, settings):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{port}/0",
            "OPTIONS": {"socket_connect_timeout": 0.5},
        }
    }
    settings.API_RATE_USER = "1/day"
    assert [owner.get(MODELS).status_code for _ in range(3)] == [200, 200, 200]
