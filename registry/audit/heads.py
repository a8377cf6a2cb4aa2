"""Signed heads: the registry's signature over the audit chain's hash at a seq, so a copy of the log proves itself.

Every event's hash covers the one before it, so one signature over the hash at ``seq`` pins every
event up to ``seq``. The periodic task (``registry.tasks.sign_audit_head``, every
``MODELYARD_AUDIT_SIGN_HEAD_SECONDS``) and every JSONL export sign the head; the export carries the
signed heads, and ``modelyard audit verify-offline`` checks them against the registry's public keys
with no server and no database (``modelyard/auditfile.py``).

Signing writes no audit event: it would move the head it signs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from django.db import transaction

from modelyard.auditfile import GENESIS_HASH, HEAD_BUNDLE_NAME, head_digests
from modelyard.provenance import Signer
from registry.audit.verify import audit_verify_from
from registry.models import AuditChainCheck, AuditChainHead, AuditHeadSignature
from registry.provenance.services import registry_signer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeadSnapshot:
    """The chain's head as one reader saw it, and the signature covering it (or the part of it verified)."""

    seq: int
    signature: AuditHeadSignature | None


def audit_head_sign(*, max_events: int) -> HeadSnapshot:
    """Sign the chain's head, unless a signature by the current key already covers it.

    Only what verifies is signed: the events appended since the last signed head (or since the
    periodic check's last verified event, when that is later) are walked first, at most
    ``max_events`` of them. When the head is further away, the last event reached is signed and the
    next call goes on from there. A broken chain is not signed; the break is logged, and the periodic
    check reports it on ``/metrics``.
    """
    signer = registry_signer()
    anchor_seq, anchor_hash = _anchor()
    # Read after the anchor: the head only moves forward, so it is at or past it.
    head = AuditChainHead.objects.filter(pk=1).values_list("last_seq", "last_hash").first()
    head_seq, head_hash = head if head is not None else (0, GENESIS_HASH)
    if head_seq == 0:
        return HeadSnapshot(seq=0, signature=None)
    walk = max(0, min(max_events, head_seq - anchor_seq))
    progress = audit_verify_from(seq=anchor_seq, prev_hash=anchor_hash, max_events=walk)
    problem = "" if progress.result.ok else progress.result.reason
    if not problem and progress.verified_seq == head_seq and progress.verified_hash != head_hash:
        problem = f"event {head_seq}: hash does not match the chain head"
    if problem:
        logger.error("the audit chain's head is not signed: %s", problem)
        return HeadSnapshot(seq=head_seq, signature=None)
    if progress.verified_seq == 0:
        return HeadSnapshot(seq=head_seq, signature=None)
    signed = _signature(signer, seq=progress.verified_seq, chain_hash=progress.verified_hash)
    return HeadSnapshot(seq=head_seq, signature=signed)


def _anchor() -> tuple[int, str]:
    """Where the chain is already known sound: the last signed head, or the periodic check's point if later."""
    last = AuditHeadSignature.objects.order_by("-seq", "-id").values_list("seq", "hash").first()
    seq, chain_hash = last if last is not None else (0, GENESIS_HASH)
    check = AuditChainCheck.objects.filter(pk=1, ok=True).values_list("verified_seq", "verified_hash").first()
    if check is not None and check[0] > seq:
        seq, chain_hash = check
    return seq, chain_hash


def _signature(signer: Signer, *, seq: int, chain_hash: str) -> AuditHeadSignature:
    existing = AuditHeadSignature.objects.filter(seq=seq, key_id=signer.key_id).first()
    if existing is not None:
        return existing
    bundle = signer.sign(head_digests(seq, chain_hash), name=HEAD_BUNDLE_NAME)
    return audit_head_signature_store(seq=seq, chain_hash=chain_hash, key_id=signer.key_id, bundle=bundle.decode())


@transaction.atomic(durable=True)
def audit_head_signature_store(*, seq: int, chain_hash: str, key_id: str, bundle: str) -> AuditHeadSignature:
    """Keep one signed head; a process that signed the same head with the same key first wins."""
    row = AuditHeadSignature(seq=seq, hash=chain_hash, key_id=key_id, bundle=bundle)
    AuditHeadSignature.objects.bulk_create([row], ignore_conflicts=True)
    return AuditHeadSignature.objects.get(seq=seq, key_id=key_id)


def audit_head_signature_list(*, first: int, last: int) -> Iterator[AuditHeadSignature]:
    """The signed heads at seqs ``first`` to ``last`` in seq order, read in chunks."""
    heads = AuditHeadSignature.objects.filter(seq__gte=first, seq__lte=last).order_by("seq", "id")
    return heads.iterator(chunk_size=200)
