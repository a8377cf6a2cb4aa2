"""Recompute the audit hash chain and name the first event that does not fit.

Each event's hash is recomputed with :func:`modelyard.auditfile.event_hash`, the one definition that
``modelyard audit verify-offline`` also uses on an exported file.

:func:`audit_verify` walks the whole chain (the API, the UI and ``modelyard manage audit_verify``);
:func:`audit_chain_check_run` is the periodic, incremental check whose verdict ``/metrics`` exports.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from django.utils import timezone

from modelyard.auditfile import GENESIS_HASH, event_hash
from registry.models import AuditChainCheck, AuditChainHead, AuditEvent

logger = logging.getLogger(__name__)

CHUNK_SIZE = 2000


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of a chain check; ``checked`` counts the events that passed before any break."""

    ok: bool
    checked: int
    first_bad_seq: int | None
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def audit_verify(*, chunk_size: int = CHUNK_SIZE) -> VerifyResult:
    """Walk every event in ``seq`` order in constant memory.

    Each event must follow the previous one without a gap, link to its hash, and hash to its own
    contents; the last one must be the one the chain head names, which catches a cut-off tail.
    The head is read first and only events up to it are walked, so appends that commit during
    the walk are neither counted nor mistaken for damage.
    """
    head = AuditChainHead.objects.filter(pk=1).values_list("last_seq", "last_hash").first()
    head_seq, head_hash = head if head is not None else (0, GENESIS_HASH)
    broken, prev_hash, checked = _walk(
        after=0, prev_hash=GENESIS_HASH, upto=head_seq, head_seq=head_seq, chunk_size=chunk_size
    )
    if broken is not None:
        return broken
    if prev_hash != head_hash:
        return _broken(checked, head_seq, f"event {head_seq}: hash does not match the chain head")
    beyond = AuditEvent.objects.filter(seq__gt=head_seq).order_by("seq").values_list("seq", flat=True).first()
    if beyond is not None:
        # An append that committed during the walk moved the head too; a head left behind was rewound.
        now = AuditChainHead.objects.filter(pk=1).values_list("last_seq", flat=True).first()
        if now is None or now < beyond:
            where = "the chain head row is missing" if now is None else f"the chain head says the last is {now}"
            return _broken(checked, beyond, f"event {beyond} lies beyond the chain: {where}")
    return VerifyResult(ok=True, checked=checked, first_bad_seq=None, reason=f"all {checked} events verified")


@dataclass(frozen=True)
class Progress:
    """How far an incremental check got: sound up to ``verified_seq``, which hashes to ``verified_hash``."""

    result: VerifyResult
    verified_seq: int
    verified_hash: str


def audit_verify_from(*, seq: int, prev_hash: str, max_events: int, chunk_size: int = CHUNK_SIZE) -> Progress:
    """Check the events appended after ``seq``, at most ``max_events`` of them, not past the chain head.

    ``seq`` and ``prev_hash`` are where an earlier check stopped (0 and the genesis hash the first
    time). That event must still carry the hash verified then, so a rewrite of the verified part
    that rehashes everything after it is caught at the anchor; the walk then checks the new events
    as :func:`audit_verify` does. The cost is one query for the anchor and the head plus the new
    events, however long the chain. On reaching the head, its hash must match too.
    """
    if seq > 0:
        anchor = AuditEvent.objects.filter(seq=seq).values_list("hash", flat=True).first()
        if anchor != prev_hash:
            what = "is missing" if anchor is None else "no longer has the hash verified before"
            return Progress(_broken(0, seq, f"event {seq} {what}"), seq, prev_hash)
    head = AuditChainHead.objects.filter(pk=1).values_list("last_seq", "last_hash").first()
    head_seq, head_hash = head if head is not None else (0, GENESIS_HASH)
    if head_seq < seq:
        return Progress(
            _broken(0, head_seq, f"the chain head says the last event is {head_seq}, below {seq}"), seq, prev_hash
        )
    upto = min(head_seq, seq + max_events)
    broken, last_hash, checked = _walk(
        after=seq, prev_hash=prev_hash, upto=upto, head_seq=head_seq, chunk_size=chunk_size
    )
    if broken is not None:
        return Progress(broken, seq, prev_hash)
    if upto == head_seq and last_hash != head_hash:
        return Progress(
            _broken(checked, head_seq, f"event {head_seq}: hash does not match the chain head"), seq, prev_hash
        )
    reason = f"events {seq + 1}-{upto} verified" if checked else "no new events"
    return Progress(VerifyResult(ok=True, checked=checked, first_bad_seq=None, reason=reason), upto, last_hash)


def _walk(
    *, after: int, prev_hash: str, upto: int, head_seq: int, chunk_size: int
) -> tuple[VerifyResult | None, str, int]:
    """Check events ``after + 1`` to ``upto`` in order: (the break found or None, the last hash, events checked)."""
    expected_seq, checked = after + 1, 0
    events = AuditEvent.objects.filter(seq__gt=after, seq__lte=upto).order_by("seq").iterator(chunk_size=chunk_size)
    for event in events:
        if event.seq != expected_seq:
            gap = _missing(expected_seq, event.seq - 1)
            return _broken(checked, expected_seq, f"{gap} missing (next is {event.seq})"), prev_hash, checked
        if event.prev_hash != prev_hash:
            link = "the genesis hash" if event.seq == 1 else f"event {event.seq - 1}"
            return (
                _broken(checked, event.seq, f"event {event.seq}: prev_hash does not link to {link}"),
                prev_hash,
                checked,
            )
        if event.hash != event_hash(event.prev_hash, event.canonical()):
            return (
                _broken(checked, event.seq, f"event {event.seq}: hash does not match its contents"),
                prev_hash,
                checked,
            )
        prev_hash, expected_seq, checked = event.hash, event.seq + 1, checked + 1
    if expected_seq <= upto:
        gap = _missing(expected_seq, upto)
        return (
            _broken(checked, expected_seq, f"{gap} missing: the chain head says the last event is {head_seq}"),
            prev_hash,
            checked,
        )
    return None, prev_hash, checked


def _broken(checked: int, seq: int, reason: str) -> VerifyResult:
    return VerifyResult(ok=False, checked=checked, first_bad_seq=seq, reason=reason)


def _missing(first: int, last: int) -> str:
    return f"event {first} is" if first == last else f"events {first}-{last} are"


def audit_chain_check_run(*, max_events: int) -> AuditChainCheck:
    """The periodic verification: check what was appended since the last run, and record the verdict.

    The walk happens outside any transaction; only the verdict is written. A break stays reported on
    every later run, since each run starts again from the last sound event and finds it again.
    """
    check = AuditChainCheck.objects.filter(pk=1).first() or AuditChainCheck(pk=1)
    progress = audit_verify_from(seq=check.verified_seq, prev_hash=check.verified_hash, max_events=max_events)
    result = progress.result
    check.verified_seq, check.verified_hash = progress.verified_seq, progress.verified_hash
    check.ok, check.first_bad_seq, check.reason = result.ok, result.first_bad_seq, result.reason
    check.checked_at = timezone.now()
    check.save()
    if not result.ok:
        logger.error("the audit chain failed verification: %s", result.reason)
    return check
