"""/v2 tokens: a revocation shows within the cache's TTL; an optional per-client rate limit (MODELYARD_V2_RATE)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from registry.access import services
from registry.audit.chain import SYSTEM
from registry.models import ApiToken, Role
from tests.support.v2server import V2Server

ADDER = "/v2/models/adder/infer"
BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).encode()


def make_token(django_db_blocker: Any) -> tuple[ApiToken, str]:
    with django_db_blocker.unblock():
        return services.token_create(
            username=f"client-{uuid.uuid4().hex[:8]}", create_user=True, roles=[Role.INFERENCE], actor=SYSTEM
        )


def bearer(raw: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {raw}"}


def test_a_revoked_token_is_refused_once_its_cached_verdict_expires(v2: V2Server, settings, django_db_blocker):
    settings.INFERENCE_PUBLIC = False
    token, raw = make_token(django_db_blocker)
    assert v2.request("GET", "/v2/models/adder", headers=bearer(raw)).status == 200  # the verdict is now cached
    with django_db_blocker.unblock():
        services.token_revoke(token=token, actor=SYSTEM)
    deadline = time.monotonic() + 15  # the TTL is 5 s; the old cache kept verdicts for 60 s
    while (status := v2.request("GET", "/v2/models/adder", headers=bearer(raw)).status) == 200:
        assert time.monotonic() < deadline, "the revoked token still works"
        time.sleep(0.2)
    assert status == 401
    assert v2.request("POST", ADDER, BODY, bearer(raw)).status == 401


def test_rate_limit_is_per_token(v2: V2Server, settings, django_db_blocker):
    settings.INFERENCE_PUBLIC = False
    settings.V2_RATE = (2, 60.0)
    _, first = make_token(django_db_blocker)
    _, second = make_token(django_db_blocker)
    assert [v2.request("POST", ADDER, BODY, bearer(first)).status for _ in range(2)] == [200, 200]
    refused = v2.request("POST", ADDER, BODY, bearer(first))
    assert refused.status == 429
    assert refused.json() == {"error": "rate limit of 2 requests per minute passed (MODELYARD_V2_RATE); retry in 30 s"}
    assert refused.headers["retry-after"] == "30"
    assert v2.request("POST", ADDER, BODY, bearer(second)).status == 200  # a bucket of its own


def test_rate_limit_is_per_address_when_inference_is_public(v2: V2Server, settings):
    settings.V2_RATE = (3, 1.0)
    statuses = [v2.request("POST", ADDER, BODY).status for _ in range(4)]
    assert statuses == [200, 200, 200, 429]


def test_no_rate_limit_unless_set(v2: V2Server, settings):
    assert settings.V2_RATE is None
    assert {v2.request("POST", ADDER, BODY).status for _ in range(30)} == {200}


def test_without_a_token_inference_is_refused_before_the_rate_limit(v2: V2Server, settings, django_db_blocker):
    settings.INFERENCE_PUBLIC = False
    settings.V2_RATE = (1, 60.0)
    assert {v2.request("POST", ADDER, BODY).status for _ in range(5)} == {401}  # refused at once, counted nowhere
    _, raw = make_token(django_db_blocker)
    assert [v2.request("POST", ADDER, BODY, bearer(raw)).status for _ in range(2)] == [200, 429]
