"""Refused access in the audit log: failed logins, rejected API tokens and denied writes.

These have no change transaction, so each appends its event in one of its own. What a request tells
about itself is recorded only as far as a client cannot forge it or break the insert with it: the
address is the direct peer's unless that peer is a trusted proxy (``MODELYARD_TRUSTED_PROXIES``),
X-Request-ID is taken only from such a proxy, NUL characters (which PostgreSQL cannot store) are
replaced, and lengths are capped (``registry/access/clients.py``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from registry.access.auth import bearer_token, split_token
from registry.access.clients import actor_from_request, clean_text
from registry.audit.chain import SYSTEM, Actor, audit_record
from registry.models import AuditEvent, AuthFailureWindow

# Failed authentications are counted per source address in windows of this length.
AUTH_FAILURE_WINDOW = timedelta(minutes=1)
# A window is summarised this long after it ends, so that a failure counted at its last moment is in it.
AUTH_FAILURE_GRACE = timedelta(seconds=5)
# Windows summarised per transaction.
AUTH_FAILURE_BATCH = 500
# Unauthenticated callers choose their path and user agent: record enough to recognise them, no more.
AUTH_FAILED_TEXT_LIMIT = 256


def audit_auth_failed(*, request: Any, target_type: str, target: str, reason: str) -> AuditEvent | None:
    """Record a failed login or a rejected API token (never the secret itself), once per source and minute.

    Failing costs an unauthenticated client nothing: with one audit row per failure, a single
    client wrote about 160 rows/s (21 GB a day), and every append waits for the chain-head lock.
    Audit rows cannot be updated, so the counting happens beside the chain, in
    ``AuthFailureWindow`` (one row per source address and minute):

    - the first failure from a source in a minute appends an ``auth.failed`` event with its
      details, as before, and returns it;
    - later failures in that minute only add one to the window's count and return None;
    - after the minute, :func:`audit_auth_failures_summarise` (a periodic task) appends one
      ``auth.failed.summary`` event with the window's final count and the seq of its first event,
      then drops the window. A window that counted one failure needs no summary.

    So the chain stays append-only and verifiable, and a flood from one source costs two events a minute.
    """
    actor = actor_from_request(request) if request is not None else Actor(label="anonymous")
    after = {"reason": reason}
    if request is not None:
        after |= {
            "method": clean_text(request.method or "", 16),
            "path": clean_text(request.path, AUTH_FAILED_TEXT_LIMIT),
        }
    start = timezone.now().replace(second=0, microsecond=0)
    with transaction.atomic():
        window = _count_auth_failure(source=actor.ip, start=start)
        if window is None:
            return None
        event = audit_record(
            actor=Actor(
                ip=actor.ip,
                user_agent=actor.user_agent[:AUTH_FAILED_TEXT_LIMIT],
                request_id=actor.request_id,
                label="anonymous",
            ),
            action="auth.failed",
            target_type=target_type,
            target=clean_text(target, 255),
            after=after,
        )
        AuthFailureWindow.objects.filter(pk=window.pk).update(first_seq=event.seq)
        return event


def _count_auth_failure(*, source: str, start: datetime) -> AuthFailureWindow | None:
    """Count one failure; return the window only when this failure opened it."""
    windows = AuthFailureWindow.objects.filter(source=source, window_start=start)
    if windows.update(count=F("count") + 1):
        return None
    try:
        with transaction.atomic():
            return AuthFailureWindow.objects.create(source=source, window_start=start)
    except IntegrityError:  # a concurrent failure from the same source opened it first
        windows.update(count=F("count") + 1)
        return None


@transaction.atomic(durable=True)
def audit_auth_failures_summarise(*, now: datetime | None = None, limit: int = AUTH_FAILURE_BATCH) -> int:
    """Append an ``auth.failed.summary`` event for each finished window that counted more than one failure.

    Finished windows are dropped. Returns how many were handled (at most ``limit``), so the caller
    can go on while batches come back full.
    """
    finished_before = (now or timezone.now()) - AUTH_FAILURE_WINDOW - AUTH_FAILURE_GRACE
    windows = list(
        AuthFailureWindow.objects.select_for_update()
        .filter(window_start__lte=finished_before)
        .order_by("window_start", "source")[:limit]
    )
    for window in windows:
        if window.count > 1:
            audit_record(
                actor=SYSTEM,
                action="auth.failed.summary",
                target_type="source",
                target=window.source,
                after={
                    "count": window.count,
                    "first_seq": window.first_seq,
                    "from": window.window_start.isoformat(),
                    "until": (window.window_start + AUTH_FAILURE_WINDOW).isoformat(),
                },
            )
    AuthFailureWindow.objects.filter(pk__in=[window.pk for window in windows]).delete()
    return len(windows)


def audit_token_rejected(*, request: Any, reason: str) -> AuditEvent | None:
    """Record a request whose bearer token did not authenticate; the target is the token's public prefix."""
    raw = bearer_token(request.META.get("HTTP_AUTHORIZATION", ""))
    parts = split_token(raw) if raw is not None else None
    return audit_auth_failed(request=request, target_type="token", target=parts[0] if parts else "", reason=reason)


def audit_access_denied(*, request: Any, reason: str) -> AuditEvent:
    """Record something the caller was not allowed to do."""
    method, path = clean_text(request.method or "", 16), clean_text(request.path, 1024)
    with transaction.atomic():
        return audit_record(
            actor=actor_from_request(request),
            action="access.denied",
            target_type="request",
            target=f"{method} {path}"[:255],
            after={"method": method, "path": path, "reason": reason},
        )


def on_user_login_failed(sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any) -> None:
    """Receiver of Django's ``user_login_failed`` (admin and session logins)."""
    # Django has already masked secrets in ``credentials``; only the attempted name is kept.
    username = str(credentials.get("username", ""))
    audit_auth_failed(request=request, target_type="user", target=username, reason="wrong username or password")
