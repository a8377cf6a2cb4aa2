"""The /v2 token cache: bounded, never holds strings that are not tokens, forgets a verdict after its TTL."""

from __future__ import annotations

import time

import pytest
from django.db import OperationalError

from inference import auth
from inference.auth import TokenCache
from registry.access import services
from registry.audit.chain import SYSTEM
from registry.models import ApiToken, Role
from registry.serving import InferenceAccess, TokenGrant

ALLOWED, REFUSED = InferenceAccess.ALLOWED, InferenceAccess.REFUSED

pytestmark = pytest.mark.django_db(transaction=True)  # check() closes stale connections, as a server thread would


def inference_token(username: str = "client") -> tuple[ApiToken, str]:
    return services.token_create(username=username, create_user=True, roles=[Role.INFERENCE], actor=SYSTEM)


def test_strings_that_are_not_tokens_cost_no_query_and_no_entry(django_assert_num_queries):
    cache = TokenCache(max_entries=100)
    with django_assert_num_queries(0):
        for i in range(5000):
            bogus = f"bogus-{i}"
            assert cache.cached(bogus) is REFUSED
            assert cache.check(bogus) is REFUSED
    assert len(cache) == 0


def test_well_formed_wrong_tokens_fill_the_cache_only_to_its_bound():
    cache = TokenCache(max_entries=10)
    for i in range(50):
        assert cache.check(f"my_{i:012x}_not-the-secret") is REFUSED
    assert len(cache) == 10


def test_a_verdict_lasts_its_ttl_so_a_revocation_shows_after_it():
    token, raw = inference_token()
    cache = TokenCache(ttl=0.2)
    assert cache.check(raw) is ALLOWED
    services.token_revoke(token=token, actor=SYSTEM)
    assert cache.cached(raw) is ALLOWED  # still cached: revocation shows within the TTL, not at once
    time.sleep(0.3)
    assert cache.cached(raw) is None
    assert cache.check(raw) is REFUSED


def test_the_default_ttl_is_at_most_five_seconds():
    assert TokenCache().ttl == auth.TTL_SECONDS <= 5


def test_a_token_allowed_before_keeps_working_while_the_database_is_down(monkeypatch):
    _, raw = inference_token()
    _, other = inference_token("never-seen")
    cache = TokenCache(ttl=0.01)
    assert cache.check(raw) is ALLOWED
    time.sleep(0.02)

    def database_down(raw: str) -> TokenGrant:
        raise OperationalError("connection refused")

    monkeypatch.setattr(auth, "token_grant", database_down)
    assert cache.check(raw) is ALLOWED
    assert cache.check(other) is REFUSED


def test_a_valid_token_without_the_inference_role_is_known_but_not_allowed():
    _, raw = services.token_create(username="viewer", create_user=True, roles=[Role.VIEWER], actor=SYSTEM)
    cache = TokenCache()
    assert cache.check(raw) is InferenceAccess.NO_ROLE  # a 403, not a 401: the token itself is good
    assert cache.cached(raw) is InferenceAccess.NO_ROLE
