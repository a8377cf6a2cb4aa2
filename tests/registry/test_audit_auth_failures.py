"""Failed authentications are counted per source and minute: a flood costs two audit events, not one per request."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from registry.access import refusals as audit
from registry.audit.verify import audit_verify
from registry.models import AuditEvent, AuthFailureWindow
from registry.tasks import summarise_auth_failures

pytestmark = pytest.mark.django_db

NOON = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _no_address_rate_limit(settings):
    """These tests count audit rows for floods of bad tokens; the per-address API limit would cut the floods short."""
    settings.API_RATE_ANON = None


@pytest.fixture
def clock(monkeypatch):
    """Stops the wall clock at 12:00:30, so that a test's requests all fall in one minute; ``clock[0] = t`` moves it."""
    now = [NOON]
    monkeypatch.setattr(timezone, "now", lambda: now[0])
    return now


def _bogus(client: Client, n: int, source: str = "198.51.100.1") -> None:
    for _ in range(n):
        response = client.get("/api/v1/models", HTTP_AUTHORIZATION="Bearer my_feed_nope", REMOTE_ADDR=source)
        assert response.status_code == 401


def _auth_events() -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action__startswith="auth.").order_by("seq"))


def test_500_bogus_tokens_from_one_source_in_a_minute_write_two_events(client, clock):
    _bogus(client, 500)
    [first] = _auth_events()
    assert (first.action, first.ip, first.target, first.after["path"]) == (
        "auth.failed",
        "198.51.100.1",
        "feed",
        "/api/v1/models",
    )
    assert AuthFailureWindow.objects.get().count == 500

    # Not yet: a failure counted in the minute's last moment may still be on its way.
    assert audit.audit_auth_failures_summarise(now=NOON + timedelta(seconds=34)) == 0
    assert audit.audit_auth_failures_summarise(now=NOON + timedelta(seconds=35)) == 1

    first_again, summary = _auth_events()
    assert first_again == first
    assert (summary.action, summary.actor, summary.target_type, summary.target) == (
        "auth.failed.summary",
        "system",
        "source",
        "198.51.100.1",
    )
    assert summary.after == {
        "count": 500,
        "first_seq": first.seq,
        "from": "2026-03-01T12:00:00+00:00",
        "until": "2026-03-01T12:01:00+00:00",
    }
    assert not AuthFailureWindow.objects.exists()
    assert audit_verify().ok


def test_two_sources_are_counted_apart(client, clock):
    _bogus(client, 3, source="198.51.100.1")
    _bogus(client, 2, source="198.51.100.2")
    assert [(e.action, e.ip) for e in _auth_events()] == [
        ("auth.failed", "198.51.100.1"),
        ("auth.failed", "198.51.100.2"),
    ]
    assert audit.audit_auth_failures_summarise(now=NOON + timedelta(minutes=2)) == 2
    summaries = [(e.target, e.after["count"]) for e in _auth_events() if e.action == "auth.failed.summary"]
    assert summaries == [("198.51.100.1", 3), ("198.51.100.2", 2)]
    assert audit_verify().ok


def test_a_new_minute_opens_a_new_window(client, clock):
    _bogus(client, 2)
    clock[0] = NOON + timedelta(seconds=40)  # 12:01:10
    _bogus(client, 1)
    assert [e.at for e in _auth_events()] == [NOON, NOON + timedelta(seconds=40)]
    assert sorted(AuthFailureWindow.objects.values_list("count", flat=True)) == [1, 2]


def test_a_single_failure_needs_no_summary(client, clock):
    _bogus(client, 1)
    assert audit.audit_auth_failures_summarise(now=NOON + timedelta(minutes=2)) == 1
    assert [e.action for e in _auth_events()] == ["auth.failed"]
    assert not AuthFailureWindow.objects.exists()


def test_failed_logins_and_bad_tokens_share_the_source_count(client, clock):
    _bogus(client, 1, source="127.0.0.1")
    response = client.post("/accounts/login/", {"username": "nobody", "password": "x"})
    assert response.status_code == 200
    assert [e.target_type for e in _auth_events()] == ["token"]
    assert AuthFailureWindow.objects.get(source="127.0.0.1").count == 2


def test_the_periodic_task_summarises_every_finished_window_in_batches(client, clock, monkeypatch, settings):
    assert settings.CELERY_BEAT_SCHEDULE["summarise-auth-failures"] == {
        "task": "registry.tasks.summarise_auth_failures",
        "schedule": 60.0,
    }
    monkeypatch.setattr(audit, "AUTH_FAILURE_BATCH", 2)
    for source in range(5):
        _bogus(client, 2, source=f"198.51.100.{source}")
    clock[0] = NOON + timedelta(minutes=2)
    assert summarise_auth_failures.apply().get() == 5
    assert AuditEvent.objects.filter(action="auth.failed.summary").count() == 5
    assert not AuthFailureWindow.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_failures_open_one_window(clock):
    """Several failures from one source at once: one event, every one of them counted."""
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []

    def fail() -> None:
        try:
            barrier.wait()
            audit.audit_auth_failed(request=None, target_type="user", target="x", reason="wrong username or password")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=fail) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert AuditEvent.objects.filter(action="auth.failed").count() == 1
    assert AuthFailureWindow.objects.get().count == 6
    assert audit_verify().ok
