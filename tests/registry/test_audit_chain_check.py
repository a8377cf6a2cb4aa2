"""The periodic audit-chain check: incremental from the last verified event, bounded per run, and exported.

``registry.tasks.verify_audit_chain`` runs every 5 minutes (Celery beat, or the embedded scheduler);
``/metrics`` exports its verdict as ``modelyard_audit_chain_ok``, which the audit alert watches.
"""

from __future__ import annotations

import pytest
from django.conf import settings as django_settings
from django.db import connection, transaction

from registry.audit.chain import SYSTEM, audit_record
from registry.audit.verify import audit_chain_check_run
from registry.models import AuditChainCheck, AuditChainHead, AuditEvent
from registry.tasks import verify_audit_chain
from tests.support.audit_factory import trigger_disabled

pytestmark = pytest.mark.django_db


def record(n: int) -> None:
    for i in range(n):
        with transaction.atomic():
            audit_record(actor=SYSTEM, action="test.event", target_type="test", target=f"t{i}", after={"i": i})


def head() -> int:
    return AuditChainHead.objects.get().last_seq


def sql(statement: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement)


def test_each_run_checks_only_the_events_appended_since_the_last():
    record(10)
    first = audit_chain_check_run(max_events=1000)
    assert (first.ok, first.verified_seq, first.reason) == (True, head(), f"events 1-{head()} verified")
    record(5)
    second = audit_chain_check_run(max_events=1000)
    assert (second.ok, second.verified_seq) == (True, head())
    assert second.reason == f"events {head() - 4}-{head()} verified"  # the 5 new ones, not the 15
    assert second.verified_hash == AuditEvent.objects.get(seq=head()).hash
    third = audit_chain_check_run(max_events=1000)
    assert (third.ok, third.reason) == (True, "no new events")


def test_a_run_checks_at_most_the_configured_number_of_events():
    record(10)
    last = head()
    seen = [audit_chain_check_run(max_events=4).verified_seq for _ in range(4)]
    assert seen == [min(4, last), min(8, last), min(12, last), min(16, last)]
    assert AuditChainCheck.objects.get().ok


def test_an_edited_event_fails_the_check_and_stays_failed():
    record(6)
    audit_chain_check_run(max_events=1000)
    verified = head()
    record(4)
    with trigger_disabled():
        sql(f"""UPDATE registry_auditevent SET "after" = '{{"i": 99}}' WHERE seq = {verified + 2}""")
    for _ in range(2):
        check = audit_chain_check_run(max_events=1000)
        assert (check.ok, check.first_bad_seq, check.verified_seq) == (False, verified + 2, verified)
        assert check.reason == f"event {verified + 2}: hash does not match its contents"


def test_rewriting_the_verified_part_is_caught_at_the_anchor():
    record(6)
    verified = audit_chain_check_run(max_events=1000).verified_seq
    with trigger_disabled():
        sql(f"UPDATE registry_auditevent SET hash = repeat('a', 64) WHERE seq = {verified}")
    check = audit_chain_check_run(max_events=1000)
    assert (check.ok, check.first_bad_seq) == (False, verified)
    assert check.reason == f"event {verified} no longer has the hash verified before"


def test_the_task_is_on_the_beat_schedule_and_limited_by_its_setting(settings):
    entry = django_settings.CELERY_BEAT_SCHEDULE["verify-audit-chain"]
    assert (entry["task"], entry["schedule"]) == ("registry.tasks.verify_audit_chain", 300.0)
    record(5)
    settings.AUDIT_VERIFY_MAX_EVENTS = 2
    assert verify_audit_chain.apply().get() is True
    assert AuditChainCheck.objects.get().verified_seq == 2
