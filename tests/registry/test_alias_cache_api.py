"""An alias's response cache setting: ``PATCH /api/v1/models/{m}/aliases/{a}`` with ``cache``, admins only, audited."""

from __future__ import annotations

from typing import Any

import pytest

from registry import serving
from registry.models import Alias, AuditEvent, Role
from tests.support.people import Person, make_person
from tests.support.registry import create_model, set_alias, upload_versions

pytestmark = pytest.mark.django_db

PRODUCTION = "/api/v1/models/demo/aliases/production"
STAGING = "/api/v1/models/demo/aliases/staging"


@pytest.fixture
def admin() -> Person:
    return make_person("root", Role.ADMIN)


@pytest.fixture
def registered(owner: Person) -> None:
    create_model(owner)
    upload_versions(owner, [1.0])


def cache_of(alias: str = "staging") -> Any:
    return Alias.objects.get(model__name="demo", name=alias).cache


def test_admin_turns_an_aliases_cache_on_and_off(admin, owner, registered):
    assert set_alias(owner, "staging", 1).status_code == 200
    response = admin.patch(STAGING, {"cache": {"max_bytes": 1048576, "ttl_seconds": 300}})

    assert response.status_code == 200, response.content
    assert response.json()["cache"] == {"max_bytes": 1048576, "ttl_seconds": 300}
    assert cache_of() == {"max_bytes": 1048576, "ttl_seconds": 300}
    event = AuditEvent.objects.get(action="alias.cache")
    assert (event.actor, event.target, event.before, event.after) == (
        "root",
        "demo@staging",
        None,
        {"max_bytes": 1048576, "ttl_seconds": 300},
    )
    # Every alias answer carries it; one that caches nothing says null.
    assert admin.get(STAGING).json()["cache"] == {"max_bytes": 1048576, "ttl_seconds": 300}

    # The inference processes read it in the desired state, for a served alias only.
    assert "demo" not in serving.desired_state().caches
    assert admin.patch(STAGING, {"served": True}).status_code == 200
    assert serving.desired_state().caches == {"demo": {"staging": serving.CacheSpec(1048576, 300)}}

    off = admin.patch(STAGING, {"cache": None})
    assert off.status_code == 200 and off.json()["cache"] is None
    assert cache_of() is None
    assert serving.desired_state().caches == {}
    assert AuditEvent.objects.filter(action="alias.cache").count() == 2


def test_only_an_admin_sets_the_cache(owner, outsider, registered):
    refused = owner.patch(STAGING, {"cache": {"max_bytes": 4096, "ttl_seconds": 60}})
    assert refused.status_code == 403
    assert refused.json()["error"] == "changing an alias's response cache needs the admin role"
    viewer = outsider.patch(STAGING, {"cache": {"max_bytes": 4096, "ttl_seconds": 60}})
    assert viewer.status_code == 403
    assert viewer.json()["error"] == "this action needs the maintainer or admin role"
    assert not Alias.objects.filter(name="staging").exists()
    assert not AuditEvent.objects.filter(action="alias.cache").exists()


@pytest.mark.parametrize(
    ("cache", "field", "error"),
    [
        ({"max_bytes": 1023, "ttl_seconds": 60}, "max_bytes", "Ensure this value is greater than or equal to 1024."),
        (
            {"max_bytes": 2**40 + 1, "ttl_seconds": 60},
            "max_bytes",
            "Ensure this value is less than or equal to 1099511627776.",
        ),
        ({"max_bytes": 4096, "ttl_seconds": 0}, "ttl_seconds", "Ensure this value is greater than or equal to 1."),
        (
            {"max_bytes": 4096, "ttl_seconds": 604801},
            "ttl_seconds",
            "Ensure this value is less than or equal to 604800.",
        ),
        ({"max_bytes": 4096}, "ttl_seconds", "This field is required."),
        ({"max_bytes": "lots", "ttl_seconds": 60}, "max_bytes", "A valid integer is required."),
    ],
)
def test_a_bad_cache_setting_is_refused_with_its_reason(admin, registered, cache, field, error):
    response = admin.patch(STAGING, {"cache": cache})
    assert response.status_code == 400, response.content
    assert response.json() == {"error": f"cache: {field}: {error}", "detail": {"cache": {field: [error]}}}
    assert not Alias.objects.filter(name="staging").exists()
    assert not AuditEvent.objects.filter(action="alias.cache").exists()


def test_the_cache_is_not_sent_with_protected_or_served(admin, registered):
    response = admin.patch(STAGING, {"cache": {"max_bytes": 4096, "ttl_seconds": 60}, "served": True})
    assert response.status_code == 400
    assert response.json()["error"] == (
        "send the policy (max_slowdown_percent, min_cosine, max_abs_diff), the signature requirement "
        "(require_signature, trusted_signers) and the cache without protected or served"
    )


def test_the_service_refuses_half_a_setting(admin, registered):
    from django.contrib.auth import get_user_model

    from registry import promotions
    from registry.audit.chain import Actor
    from registry.errors import InvalidInput
    from registry.models import RegisteredModel

    model = RegisteredModel.objects.get(name="demo")
    actor = Actor(user=get_user_model().objects.get(username="root"))
    with pytest.raises(InvalidInput) as caught:
        promotions.alias_set_cache(model=model, alias_name="staging", actor=actor, max_bytes=4096, ttl_seconds=None)
    assert str(caught.value) == "send the cache's max_bytes and ttl_seconds together, or null to turn it off"
    with pytest.raises(InvalidInput) as caught:
        promotions.alias_set_cache(model=model, alias_name="staging", actor=actor, max_bytes=10, ttl_seconds=5)
    assert str(caught.value) == "cache max_bytes must be between 1024 and 1099511627776, not 10"


def test_a_versions_cache_figures_travel_in_the_heartbeat():
    row = serving.LoadedRow(
        model="demo", version=1, state=serving.LoadState.READY, cache=serving.CacheTotals(3, 1, 2, 512)
    )
    assert row.as_json()["cache"] == {"hits": 3, "misses": 1, "evictions": 2, "bytes": 512}
    back = serving.LoadedRow.from_json(row.as_json())
    assert back.cache == serving.CacheTotals(3, 1, 2, 512) and back.cache.hit_rate == 0.75
    plain = serving.LoadedRow(model="demo", version=1, state=serving.LoadState.READY)
    assert "cache" not in plain.as_json() and serving.LoadedRow.from_json(plain.as_json()).cache is None
