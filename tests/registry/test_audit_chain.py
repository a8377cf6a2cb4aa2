"""The audit hash chain: gapless under concurrency, append-only in PostgreSQL, tampering found by verify."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from registry.audit.chain import SYSTEM, audit_record
from registry.audit.verify import VerifyResult, audit_verify
from registry.models import AuditChainHead, AuditEvent
from tests.support.audit_factory import append_bulk_events, trigger_disabled

pytestmark = pytest.mark.django_db


def _record(n: int, *, action: str = "test.event") -> None:
    for i in range(n):
        with transaction.atomic():
            audit_record(actor=SYSTEM, action=action, target_type="test", target=f"t{i}", after={"i": i})


@pytest.fixture
def ten_events(db):
    _record(10)
    assert list(AuditEvent.objects.values_list("seq", flat=True)) == list(range(1, 11))


def _sql(statement: str, params: list[str] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def _broken(seq: int, reason: str, checked: int) -> VerifyResult:
    return VerifyResult(ok=False, checked=checked, first_bad_seq=seq, reason=reason)


# --- Concurrency ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_make_one_gapless_chain():
    threads_count, per_thread = 8, 25
    start = threading.Barrier(threads_count)
    errors: list[BaseException] = []

    def append(thread: int) -> None:
        try:
            start.wait()
            for i in range(per_thread):
                with transaction.atomic():
                    audit_record(actor=SYSTEM, action="test.concurrent", target_type="test", target=f"{thread}/{i}")
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=append, args=(t,)) for t in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    total = threads_count * per_thread
    assert list(AuditEvent.objects.order_by("seq").values_list("seq", flat=True)) == list(range(1, total + 1))
    assert AuditEvent.objects.filter(action="test.concurrent").count() == total
    assert audit_verify() == VerifyResult(
        ok=True, checked=total, first_bad_seq=None, reason=f"all {total} events verified"
    )


# --- Append-only in PostgreSQL ----------------------------------------------------------------


def test_update_of_an_audit_event_is_refused(ten_events):
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(seq=5).update(actor="someone-else")
    assert AuditEvent.objects.get(seq=5).actor == "system"


def test_delete_of_an_audit_event_is_refused(ten_events):
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        _sql("DELETE FROM registry_auditevent WHERE seq = 5")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.all().delete()
    assert AuditEvent.objects.count() == 10


def test_appending_still_works_with_the_trigger(ten_events):
    _record(1)
    assert audit_verify().ok


# --- Tampering -------------------------------------------------------------------------------


def test_intact_chain_verifies(ten_events):
    assert audit_verify() == VerifyResult(ok=True, checked=10, first_bad_seq=None, reason="all 10 events verified")


def test_empty_chain_verifies(db):
    assert audit_verify() == VerifyResult(ok=True, checked=0, first_bad_seq=None, reason="all 0 events verified")


def test_edited_contents_are_found(ten_events):
    with trigger_disabled():
        _sql("""UPDATE registry_auditevent SET "after" = '{"i": 99}' WHERE seq = 5""")
    assert audit_verify() == _broken(5, "event 5: hash does not match its contents", checked=4)


def test_deleted_event_is_found(ten_events):
    with trigger_disabled():
        _sql("DELETE FROM registry_auditevent WHERE seq = 5")
    assert audit_verify() == _broken(5, "event 5 is missing (next is 6)", checked=4)


def test_several_deleted_events_are_named_as_a_range(ten_events):
    with trigger_disabled():
        _sql("DELETE FROM registry_auditevent WHERE seq BETWEEN 4 AND 6")
    assert audit_verify() == _broken(4, "events 4-6 are missing (next is 7)", checked=3)


def test_swapped_events_are_found_at_the_first(ten_events):
    with trigger_disabled():
        _sql(
            """UPDATE registry_auditevent AS e SET action = o.action, target = o.target
               FROM registry_auditevent AS o WHERE (e.seq, o.seq) IN ((3, 4), (4, 3))"""
        )
    assert list(AuditEvent.objects.filter(seq__in=[3, 4]).values_list("target", flat=True)) == ["t3", "t2"]
    assert audit_verify() == _broken(3, "event 3: hash does not match its contents", checked=2)


def test_rehashed_edit_breaks_the_next_link(ten_events):
    forged = AuditEvent.objects.get(seq=5)
    forged.after = {"i": 99}
    forged.hash = forged.compute_hash()
    with trigger_disabled():
        _sql('UPDATE registry_auditevent SET "after" = %s, hash = %s WHERE seq = 5', ['{"i": 99}', forged.hash])
    assert audit_verify() == _broken(6, "event 6: prev_hash does not link to event 5", checked=5)


def test_forged_first_event_does_not_start_from_genesis(ten_events):
    with trigger_disabled():
        _sql("UPDATE registry_auditevent SET prev_hash = %s WHERE seq = 1", ["1" * 64])
    assert audit_verify() == _broken(1, "event 1: prev_hash does not link to the genesis hash", checked=0)


def test_cut_off_tail_is_found_through_the_chain_head(ten_events):
    with trigger_disabled():
        _sql("DELETE FROM registry_auditevent WHERE seq >= 9")
    assert audit_verify() == _broken(9, "events 9-10 are missing: the chain head says the last event is 10", checked=8)


def test_rewound_chain_head_is_found(ten_events):
    eighth = AuditEvent.objects.get(seq=8)
    AuditChainHead.objects.filter(pk=1).update(last_seq=8, last_hash=eighth.hash)
    assert audit_verify() == _broken(9, "event 9 lies beyond the chain: the chain head says the last is 8", checked=8)


def test_chain_head_with_a_wrong_hash_is_found(ten_events):
    AuditChainHead.objects.filter(pk=1).update(last_hash="f" * 64)
    assert audit_verify() == _broken(10, "event 10: hash does not match the chain head", checked=10)


def test_missing_chain_head_is_found(ten_events):
    AuditChainHead.objects.all().delete()
    assert audit_verify() == _broken(1, "event 1 lies beyond the chain: the chain head row is missing", checked=0)


def test_long_chain_verifies_across_chunks(db):
    append_bulk_events(5003)
    assert audit_verify(chunk_size=1000) == VerifyResult(
        ok=True, checked=5003, first_bad_seq=None, reason="all 5003 events verified"
    )


def test_verify_reads_in_small_chunks(ten_events):
    with trigger_disabled():
        _sql("DELETE FROM registry_auditevent WHERE seq = 7")
    assert audit_verify(chunk_size=2) == _broken(7, "event 7 is missing (next is 8)", checked=6)


# --- The command ---------------------------------------------------------------------------------


def test_command_prints_ok(ten_events):
    out = io.StringIO()
    call_command("audit_verify", stdout=out)
    assert out.getvalue() == "audit chain ok: 10 events verified\n"


def test_command_fails_on_a_broken_chain(ten_events):
    with trigger_disabled():
        _sql("DELETE FROM registry_auditevent WHERE seq = 3")
    with pytest.raises(CommandError, match=r"^audit chain BROKEN at event 3: event 3 is missing \(next is 4\)$") as exc:
        call_command("audit_verify")
    assert exc.value.returncode == 1


@pytest.mark.django_db(transaction=True)
def test_modelyard_manage_audit_verify_exits_1_when_broken():
    _record(4)

    def run() -> subprocess.CompletedProcess[str]:
        db = connection.settings_dict
        # The installed command with the project's settings (this process's tests.settings is not importable there).
        env = os.environ | {
            "MODELYARD_DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "DJANGO_SETTINGS_MODULE": "modelyard.settings",
        }
        modelyard = Path(sys.executable).with_name("modelyard")
        return subprocess.run(
            [str(modelyard), "manage", "audit_verify"], env=env, capture_output=True, text=True, timeout=60
        )

    intact = run()
    assert (intact.returncode, intact.stdout) == (0, "audit chain ok: 4 events verified\n"), intact.stderr
    with trigger_disabled():
        _sql("""UPDATE registry_auditevent SET actor = 'mallory' WHERE seq = 2""")
    broken = run()
    assert broken.returncode == 1
    assert "audit chain BROKEN at event 2: event 2: hash does not match its contents" in broken.stderr
