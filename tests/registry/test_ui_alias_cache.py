"""The response cache in the web UI: an alias's setting on the model page (admins), hit rates on the fleet page."""

from __future__ import annotations

import pytest
from django.utils import timezone

from registry import serving
from registry.models import Alias, AuditEvent, Role
from registry.serving import CacheTotals, LoadedRow, LoadState, WorkerReport
from tests.support.people import Person, login_person
from tests.support.registry import create_model

pytestmark = pytest.mark.django_db

CACHE_FORM = "/ui/models/demo/aliases/production/cache"


@pytest.fixture
def root() -> Person:
    return login_person("root", Role.ADMIN)


@pytest.fixture
def mia() -> Person:
    return login_person("mia", Role.MAINTAINER)


def production() -> Alias:
    return Alias.objects.get(model__name="demo", name="production")


def test_an_admin_turns_an_aliases_cache_on_and_off_from_the_model_page(root):
    create_model(root)

    response = root.client.post(CACHE_FORM, {"max_bytes": "65536", "ttl_seconds": "120"})

    assert (response.status_code, response["Location"]) == (302, "/ui/models/demo")
    assert production().cache == {"max_bytes": 65536, "ttl_seconds": 120}
    page = root.client.get("/ui/models/demo").content.decode()
    assert "&#x27;production&#x27; caches responses: up to 65536 bytes per process, each for 120 s." in page
    assert 'name="max_bytes" min="1024" value="65536"' in page and 'value="120"' in page

    # As a browser sends it with both boxes emptied.
    off = root.client.post(CACHE_FORM, {"max_bytes": "", "ttl_seconds": ""})
    assert off.status_code == 302 and production().cache is None
    assert "&#x27;production&#x27; caches no responses." in root.client.get("/ui/models/demo").content.decode()
    assert AuditEvent.objects.filter(action="alias.cache").count() == 2


def test_the_cache_form_refuses_half_a_setting_a_bad_bound_and_a_non_admin(root, mia):
    create_model(root)

    half = root.client.post(CACHE_FORM, {"max_bytes": "65536", "ttl_seconds": ""})
    assert half.status_code == 400
    assert "send the cache&#x27;s max_bytes and ttl_seconds together, or null to turn it off" in half.content.decode()
    small = root.client.post(CACHE_FORM, {"max_bytes": "10", "ttl_seconds": "5"})
    assert small.status_code == 400
    assert "cache max_bytes must be between 1024 and 1099511627776, not 10" in small.content.decode()
    refused = mia.client.post(CACHE_FORM, {"max_bytes": "65536", "ttl_seconds": "5"})
    assert refused.status_code == 403
    assert "changing an alias&#x27;s response cache needs the admin role" in refused.content.decode()
    assert production().cache is None
    assert not AuditEvent.objects.filter(action="alias.cache").exists()
    assert 'id="alias-caches"' not in mia.client.get("/ui/models/demo").content.decode()  # admins only


def test_the_fleet_page_shows_each_versions_cache_hit_rate():
    serving.worker_heartbeat(
        WorkerReport(
            worker_id="w1",
            host="h",
            pid=1,
            device="cpu",
            provider="CPU",
            started_at=timezone.now(),
            loaded=(
                LoadedRow(
                    model="demo",
                    version=2,
                    state=LoadState.READY,
                    aliases=("production",),
                    cache=CacheTotals(hits=30, misses=10, evictions=4, bytes=2048),
                ),
                LoadedRow(model="demo", version=3, state=LoadState.READY, aliases=("staging",)),
            ),
        )
    )
    html = login_person("vic", Role.VIEWER).client.get("/ui/fleet").content.decode()
    assert (
        '<div class="small" data-cache="30/40">response cache: 75% hits <span class="muted">(30 of 40, 4 evicted, '
        "2.0\xa0KB held)</span></div>"
    ) in html
    assert html.count("data-cache=") == 1  # v3 caches nothing
