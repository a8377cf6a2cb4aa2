"""The audit hash chain: appending events, recording refused access, and reading events back.

Changes append their event inside their own transaction. Failed logins and denied writes have
no change transaction, so they append in one of their own.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from registry.auth import split_token
from registry.models import AuditChainHead, AuditEvent


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


def actor_from_request(request: Any) -> Actor:
    meta = request.META
    forwarded = meta.get("HTTP_X_FORWARDED_FOR", "")
    ip = forwarded.split(",")[0].strip() if forwarded else meta.get("REMOTE_ADDR", "")
    auth = getattr(request, "auth", None)
    user = getattr(request, "user", None)
    user = user if getattr(user, "is_authenticated", False) else None
    return Actor(
        user=user,
        token_id=getattr(auth, "pk", None),
        ip=(ip or "")[:64],
        user_agent=meta.get("HTTP_USER_AGENT", "")[:512],
        request_id=meta.get("HTTP_X_REQUEST_ID", "")[:64] or uuid.uuid4().hex,
        label="anonymous",
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


# --- Refused access ---------------------------------------------------------------------------


def audit_auth_failed(*, request: Any, target_type: str, target: str, reason: str) -> AuditEvent:
    """Record a failed login or a rejected API token (never the secret itself)."""
    actor = actor_from_request(request) if request is not None else Actor(label="anonymous")
    after = {"reason": reason}
    if request is not None:
        after |= {"method": request.method, "path": request.path[:1024]}
    with transaction.atomic():
        return audit_record(
            actor=Actor(ip=actor.ip, user_agent=actor.user_agent, request_id=actor.request_id, label="anonymous"),
            action="auth.failed",
            target_type=target_type,
            target=target[:255],
            after=after,
        )


def audit_token_rejected(*, request: Any, reason: str) -> AuditEvent:
    """Record a request whose bearer token did not authenticate; the target is the token's public prefix."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, raw = header.partition(" ")
    parts = split_token(raw.strip()) if scheme.lower() == "bearer" else None
    return audit_auth_failed(request=request, target_type="token", target=parts[0] if parts else "", reason=reason)


def audit_access_denied(*, request: Any, reason: str) -> AuditEvent:
    """Record a write the caller was not allowed to make."""
    with transaction.atomic():
        return audit_record(
            actor=actor_from_request(request),
            action="access.denied",
            target_type="request",
            target=f"{request.method} {request.path}"[:255],
            after={"method": request.method, "path": request.path[:1024], "reason": reason},
        )


def on_user_login_failed(sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any) -> None:
    """Receiver of Django's ``user_login_failed`` (admin and session logins)."""
    # Django has already masked secrets in ``credentials``; only the attempted name is kept.
    username = str(credentials.get("username", ""))
    audit_auth_failed(request=request, target_type="user", target=username, reason="wrong username or password")


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
