"""An audit log that outlives the database: signed chain heads, carried by the JSONL export, checked offline.

The registry signs the chain's head periodically (``registry.tasks.sign_audit_head``) and at every
JSONL export; ``modelyard audit verify-offline FILE --key PUB.pem`` checks the exported file alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection

from modelyard.auditfile import event_hash
from modelyard.cli import main
from modelyard.provenance import Signer, generate_private_key
from registry.audit.heads import audit_head_sign
from registry.models import AuditChainHead, AuditEvent, AuditHeadSignature, Role
from registry.tasks import sign_audit_head
from tests.support.audit_factory import trigger_disabled
from tests.support.people import Person, make_person

pytestmark = pytest.mark.django_db

PREFIX = "modelyard audit verify-offline: "


@pytest.fixture
def auditor(db: None) -> Person:
    return make_person("auditor", Role.AUDITOR)


@pytest.fixture
def registry_key(settings: Any, tmp_path: Path) -> Path:
    """This test's registry signing key; the public half as a PEM file, as an auditor would be given it."""
    private = generate_private_key()
    settings.SIGNING_KEY = private
    return public_file(tmp_path / "registry.pub.pem", private)


def public_file(path: Path, private_pem: bytes) -> Path:
    path.write_bytes(Signer(private_pem).public_pem)
    return path


def create_models(person: Person, *names: str) -> None:
    for name in names:
        assert person.post("/api/v1/models", {"name": name}).status_code == 201


def export(auditor: Person, path: Path, query: str = "") -> list[dict[str, Any]]:
    response = auditor.get(f"/api/v1/audit/export?format=jsonl{query}")
    assert response.status_code == 200, response.content
    path.write_bytes(b"".join(response.streaming_content))
    return [json.loads(line) for line in path.read_text().splitlines()]


def write(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in records))


def verify_offline(capsys: pytest.CaptureFixture[str], path: Path, *keys: Path) -> tuple[int, str, str]:
    args = ["audit", "verify-offline", str(path)]
    for key in keys:
        args += ["--key", str(key)]
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def head() -> tuple[int, str]:
    row = AuditChainHead.objects.get()
    return row.last_seq, row.last_hash


# --- The export carries its signed head ------------------------------------------------------------


def test_an_exported_log_verifies_offline(owner, auditor, registry_key, tmp_path, capsys):
    create_models(owner, "m1", "m2")
    seq, chain_hash = head()
    records = export(auditor, tmp_path / "audit.jsonl")

    *events, signed = records
    assert [e["seq"] for e in events] == list(range(1, seq + 1))
    assert {k: signed[k] for k in ("type", "seq", "hash", "key_id")} == {
        "type": "signed_head",
        "seq": seq,
        "hash": chain_hash,
        "key_id": Signer(django_settings.SIGNING_KEY).key_id,
    }
    # Signing wrote no audit event: the head it signed is still the head.
    assert head() == (seq, chain_hash)
    assert AuditHeadSignature.objects.count() == 1

    assert verify_offline(capsys, tmp_path / "audit.jsonl", registry_key) == (
        0,
        f"{seq} events, chain ok, 1 signed head verified, last signed seq {seq}\n",
        "",
    )


def test_an_edited_event_fails_naming_it(owner, auditor, registry_key, tmp_path, capsys):
    create_models(owner, "m1", "m2")
    path = tmp_path / "audit.jsonl"
    records = export(auditor, path)
    edited = next(r for r in records if r.get("action") == "model.create")
    edited["target"] = "m9"
    write(path, records)
    assert verify_offline(capsys, path, registry_key) == (
        1,
        "",
        f"{PREFIX}event seq {edited['seq']}: hash does not match its content\n",
    )


def test_a_rewritten_tail_with_recomputed_hashes_fails_on_the_signed_head(
    owner, auditor, registry_key, tmp_path, capsys
):
    create_models(owner, "m1", "m2")
    path = tmp_path / "audit.jsonl"
    *events, signed = export(auditor, path)
    first = next(i for i, e in enumerate(events) if e["action"] == "model.create")
    events[first]["target"] = "m9"
    for i in range(first, len(events)):  # a forger who can hash, but not sign
        events[i]["prev_hash"] = events[i - 1]["hash"]
        fields = {k: v for k, v in events[i].items() if k not in ("prev_hash", "hash")}
        events[i]["hash"] = event_hash(events[i]["prev_hash"], fields)
    write(path, [*events, signed])
    assert verify_offline(capsys, path, registry_key) == (
        1,
        "",
        f"{PREFIX}signed head seq {signed['seq']}: hash does not match the chain's hash at seq {signed['seq']}\n",
    )


def test_a_deleted_event_fails_as_a_gap(owner, auditor, registry_key, tmp_path, capsys):
    create_models(owner, "m1", "m2")
    path = tmp_path / "audit.jsonl"
    records = export(auditor, path)
    gone = next(i for i, r in enumerate(records) if r.get("action") == "model.create")
    seq = records.pop(gone)["seq"]
    write(path, records)
    assert verify_offline(capsys, path, registry_key) == (
        1,
        "",
        f"{PREFIX}event seq {seq} is missing (the next event in the file is seq {seq + 1})\n",
    )


def test_a_cut_off_tail_fails_on_the_signed_head(owner, auditor, registry_key, tmp_path, capsys):
    create_models(owner, "m1")
    path = tmp_path / "audit.jsonl"
    *events, signed = export(auditor, path)
    write(path, [*events[:-1], signed])
    last = signed["seq"]
    assert verify_offline(capsys, path, registry_key) == (
        1,
        "",
        f"{PREFIX}signed head seq {last}: the file has no event seq {last} (its events are seq 1-{last - 1})\n",
    )


def test_a_head_signed_by_a_key_not_given_fails(owner, auditor, registry_key, tmp_path, capsys):
    create_models(owner, "m1")
    path = tmp_path / "audit.jsonl"
    *_, signed = export(auditor, path)
    stranger = public_file(tmp_path / "stranger.pub.pem", generate_private_key())
    key = Signer(django_settings.SIGNING_KEY).key_id
    assert verify_offline(capsys, path, stranger) == (
        1,
        "",
        f"{PREFIX}signed head seq {signed['seq']}: signed by key {key[:16]}, which is not trusted here\n",
    )


def test_a_file_stripped_of_its_signed_heads_says_nothing_is_covered(owner, auditor, registry_key, tmp_path, capsys):
    create_models(owner, "m1")
    path = tmp_path / "audit.jsonl"
    *events, _ = export(auditor, path)
    write(path, events)
    last = events[-1]["seq"]
    assert verify_offline(capsys, path, registry_key) == (
        0,
        f"{last} events, chain ok, 0 signed heads verified, last signed seq none\n"
        f"events seq 1-{last} are not covered by a signature\n",
        "",
    )


def test_events_beyond_the_signed_head_are_reported_as_not_covered(
    owner, auditor, registry_key, settings, tmp_path, capsys
):
    create_models(owner, "m1", "m2")
    # A first signing walks at most AUDIT_VERIFY_MAX_EVENTS events, and signs as far as it got.
    settings.AUDIT_VERIFY_MAX_EVENTS = 3
    path = tmp_path / "audit.jsonl"
    *events, signed = export(auditor, path)
    last = events[-1]["seq"]
    assert (signed["seq"], last > 4) == (3, True)
    assert verify_offline(capsys, path, registry_key) == (
        0,
        f"{last} events, chain ok, 1 signed head verified, last signed seq 3\n"
        f"events seq 4-{last} are not covered by a signature\n",
        "",
    )


def test_an_export_since_a_time_verifies_from_its_first_event(owner, auditor, registry_key, tmp_path, capsys):
    create_models(owner, "m1")
    since = AuditEvent.objects.get(action="model.create").at
    create_models(owner, "m2")
    path = tmp_path / "audit.jsonl"
    query = "&since=" + since.isoformat().replace("+", "%2B")
    *events, signed = export(auditor, path, query)
    first, last = events[0]["seq"], events[-1]["seq"]
    assert (events[0]["action"], signed["seq"]) == ("model.create", last)
    assert verify_offline(capsys, path, registry_key) == (
        0,
        f"{last - first + 1} events, chain ok, 1 signed head verified, last signed seq {last}\n"
        f"the file starts at event seq {first}: the events before it are not in the file\n",
        "",
    )


def test_an_export_with_a_broken_chain_carries_no_new_signature(owner, auditor, registry_key, tmp_path, capsys):
    create_models(owner, "m1")
    edited = AuditEvent.objects.get(action="model.create").seq
    with trigger_disabled(), connection.cursor() as cursor:
        cursor.execute("UPDATE registry_auditevent SET target = 'm9' WHERE seq = %s", [edited])
    path = tmp_path / "audit.jsonl"
    records = export(auditor, path)
    assert [r for r in records if "type" in r] == []
    assert AuditHeadSignature.objects.count() == 0
    assert verify_offline(capsys, path, registry_key) == (
        1,
        "",
        f"{PREFIX}event seq {edited}: hash does not match its content\n",
    )


# --- Periodic signing, and key rotation -------------------------------------------------------------


def test_the_periodic_task_signs_the_head_once_until_it_moves(owner, registry_key):
    create_models(owner, "m1")
    seq, chain_hash = head()
    assert sign_audit_head.apply().get() == seq
    assert sign_audit_head.apply().get() == seq  # the head has not moved: nothing new is signed
    assert list(AuditHeadSignature.objects.values_list("seq", "hash")) == [(seq, chain_hash)]
    assert head() == (seq, chain_hash)  # signing wrote no audit event

    create_models(owner, "m2")
    moved, moved_hash = head()
    assert sign_audit_head.apply().get() == moved
    assert list(AuditHeadSignature.objects.values_list("seq", "hash")) == [(seq, chain_hash), (moved, moved_hash)]


def test_the_periodic_task_is_on_the_beat_schedule():
    entry = django_settings.CELERY_BEAT_SCHEDULE["sign-audit-head"]
    assert entry == {"task": "registry.tasks.sign_audit_head", "schedule": 3600.0}
    assert django_settings.AUDIT_SIGN_HEAD_SECONDS == 3600


def test_an_empty_chain_is_not_signed(db, registry_key):
    assert not AuditEvent.objects.exists()
    snapshot = audit_head_sign(max_events=100)
    assert (snapshot.seq, snapshot.signature) == (0, None)


def test_a_log_signed_under_a_rotated_key_verifies_with_the_old_and_new_keys(
    owner, auditor, settings, tmp_path, capsys
):
    old, new = generate_private_key(), generate_private_key()
    old_pem, new_pem = public_file(tmp_path / "old.pub.pem", old), public_file(tmp_path / "new.pub.pem", new)
    settings.SIGNING_KEY = old
    create_models(owner, "m1")
    signed_old = sign_audit_head.apply().get()
    settings.SIGNING_KEY = new  # rotated: the registry signs with the new key from now on
    create_models(owner, "m2")
    path = tmp_path / "audit.jsonl"
    records = export(auditor, path)
    last = [r for r in records if "type" not in r][-1]["seq"]
    heads = [(r["seq"], r["key_id"]) for r in records if r.get("type") == "signed_head"]
    old_id = Signer(old).key_id
    assert heads == [(signed_old, old_id), (last, Signer(new).key_id)]

    assert verify_offline(capsys, path, new_pem) == (
        1,
        "",
        f"{PREFIX}signed head seq {signed_old}: signed by key {old_id[:16]}, which is not trusted here\n",
    )
    assert verify_offline(capsys, path, old_pem, new_pem) == (
        0,
        f"{last} events, chain ok, 2 signed heads verified, last signed seq {last}\n",
        "",
    )


# --- One hash for the registry and the offline check ------------------------------------------------


def test_the_registry_and_the_offline_check_hash_an_event_alike(owner):
    create_models(owner, "m1")
    for event in AuditEvent.objects.all():
        assert event.hash == event_hash(event.prev_hash, event.canonical()) == event.compute_hash()
