"""Appending to the audit hash chain. Callers are already inside the transaction of the change."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from registry.models import AuditChainHead, AuditEvent


@dataclass(frozen=True)
class Actor:
    """Who made a change, and from where."""

    user: Any = None
    token_id: int | None = None
    ip: str = ""
    user_agent: str = ""
    request_id: str = ""

    @property
    def name(self) -> str:
        return self.user.get_username() if self.user is not None else "system"


SYSTEM = Actor()


def actor_from_request(request: Any) -> Actor:
    meta = request.META
    forwarded = meta.get("HTTP_X_FORWARDED_FOR", "")
    ip = forwarded.split(",")[0].strip() if forwarded else meta.get("REMOTE_ADDR", "")
    auth = getattr(request, "auth", None)
    user = request.user if getattr(request.user, "is_authenticated", False) else None
    return Actor(
        user=user,
        token_id=getattr(auth, "pk", None),
        ip=ip or "",
        user_agent=meta.get("HTTP_USER_AGENT", "")[:512],
        request_id=meta.get("HTTP_X_REQUEST_ID", "")[:64] or uuid.uuid4().hex,
    )


def audit_record(
    *,
    actor: Actor,
    action: str,
    target_type: str,
    target: str,
    model_name: str = "",
    before: Any = None,
    after: Any = None,
) -> AuditEvent:
    """Append one event; must run inside the transaction that makes the change."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("audit_record() must run inside the transaction of the change it records")
    head = AuditChainHead.objects.select_for_update().filter(pk=1).first()
    if head is None:  # the migration creates it; this covers a truncated table
        AuditChainHead.objects.bulk_create([AuditChainHead(pk=1)], ignore_conflicts=True)
        head = AuditChainHead.objects.select_for_update().get(pk=1)
    event = AuditEvent(
        seq=head.last_seq + 1,
        at=timezone.now(),
        actor=actor.name,
        actor_id=actor.user.pk if actor.user is not None else None,
        token_id=actor.token_id,
        action=action,
        target_type=target_type,
        target=target,
        model_name=model_name,
        before=before,
        after=after,
        ip=actor.ip,
        user_agent=actor.user_agent,
        request_id=actor.request_id,
        prev_hash=head.last_hash,
    )
    event.hash = event.compute_hash()
    event.save()
    head.last_seq, head.last_hash = event.seq, event.hash
    head.save(update_fields=["last_seq", "last_hash"])
    return event
