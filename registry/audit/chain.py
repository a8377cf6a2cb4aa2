"""The audit hash chain: appending events, and reading them back.

Changes append their event inside their own transaction (:func:`audit_record`), with the
:class:`Actor` who made them. Failed logins and denied writes have no change transaction, so they
append in one of their own (``registry/access/refusals.py``). ``registry/audit/verify.py``
recomputes the chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from modelyard.auditfile import event_hash
from registry.models import AuditChainHead, AuditEvent, ModelVersion


@dataclass(frozen=True)
class Actor:
    """Who made a change, and from where."""

    user: Any = None
    token_id: int | None = None
    ip: str = ""
    user_agent: str = ""
    request_id: str = ""
    # The recorded name when there is no user: "system" for the registry itself, "anonymous" for a caller.
    label: str = "system"

    @property
    def name(self) -> str:
        return self.user.get_username() if self.user is not None else self.label


SYSTEM = Actor()


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
    event.hash = event_hash(event.prev_hash, event.canonical())
    event.save()
    head.last_seq, head.last_hash = event.seq, event.hash
    head.save(update_fields=["last_seq", "last_hash"])
    return event


def audit_version(
    version: ModelVersion, *, actor: Actor, action: str, before: Any = None, after: Any = None
) -> AuditEvent:
    """Append one event about ``version``: its target is ``model/number``, filed under its model."""
    return audit_record(
        actor=actor,
        action=action,
        target_type="version",
        target=f"{version.model.name}/{version.version}",
        model_name=version.model.name,
        before=before,
        after=after,
    )


# --- Reading -------------------------------------------------------------------------------------


def audit_event_list(
    *,
    actor: str = "",
    action: str = "",
    model: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditEvent]:
    """Events matching the filters, unordered. ``action`` ending in "." matches every action under it.

    ``since`` is inclusive and ``until`` exclusive, so consecutive windows never overlap.
    """
    events = AuditEvent.objects.all()
    if actor:
        events = events.filter(actor=actor)
    if action:
        events = events.filter(action__startswith=action) if action.endswith(".") else events.filter(action=action)
    if model:
        events = events.filter(model_name=model)
    if since is not None:
        events = events.filter(at__gte=since)
    if until is not None:
        events = events.filter(at__lt=until)
    return events
