"""Recompute the audit hash chain and name the first event that does not fit."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from registry.models import AuditChainHead, AuditEvent

GENESIS_HASH = "0" * 64
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
    expected_seq, prev_hash, checked = 1, GENESIS_HASH, 0
    events = AuditEvent.objects.filter(seq__lte=head_seq).order_by("seq").iterator(chunk_size=chunk_size)
    for event in events:
        if event.seq != expected_seq:
            gap = _missing(expected_seq, event.seq - 1)
            return _broken(checked, expected_seq, f"{gap} missing (next is {event.seq})")
        if event.prev_hash != prev_hash:
            link = "the genesis hash" if event.seq == 1 else f"event {event.seq - 1}"
            return _broken(checked, event.seq, f"event {event.seq}: prev_hash does not link to {link}")
        if event.hash != event.compute_hash():
            return _broken(checked, event.seq, f"event {event.seq}: hash does not match its contents")
        prev_hash, expected_seq, checked = event.hash, event.seq + 1, checked + 1
    if checked < head_seq:
        gap = _missing(expected_seq, head_seq)
        return _broken(checked, expected_seq, f"{gap} missing: the chain head says the last event is {head_seq}")
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


def _broken(checked: int, seq: int, reason: str) -> VerifyResult:
    return VerifyResult(ok=False, checked=checked, first_bad_seq=seq, reason=reason)


def _missing(first: int, last: int) -> str:
    return f"event {first} is" if first == last else f"events {first}-{last} are"
