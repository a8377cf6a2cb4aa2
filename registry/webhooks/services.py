"""Webhooks: admins register endpoints; changes emit events; deliveries go out signed, after commit, with retries.

How an event travels:

1. A service calls :func:`emit` inside the transaction of the change it makes (a version validated,
   a promotion requested or decided, an alias moved). ``emit`` writes one :class:`WebhookDelivery`
   row per webhook that wants the event, with the exact JSON body, so the event and its change
   commit or roll back together (an outbox).
2. After commit, each delivery is queued: to the Celery task ``registry.tasks.deliver_webhook`` when
   there is a broker, else to the in-process delivery thread. No request ever waits for a receiver.
3. :func:`delivery_attempt` claims the row (so two deliveries of one task send once), POSTs it
   through ``registry.webhooks.outbound`` (address checks, deadline, no redirects) and records the outcome.
   A failed attempt is retried after ``MODELYARD_WEBHOOK_RETRY_SECONDS``, doubling, up to
   ``MODELYARD_WEBHOOK_MAX_ATTEMPTS``; the periodic ``retry_webhook_deliveries`` queues retries that
   are due, and takes back attempts whose worker was lost.

Each delivery is signed: ``Modelyard-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "{t}.{body}"
under the webhook's secret>``. The body is ``{"id", "event", "at", "model", "version", "details"}``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import timedelta
from functools import partial
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from modelyard.crypto import SecretUnreadable
from registry import queueing
from registry.audit.chain import Actor, audit_record
from registry.errors import InvalidInput
from registry.models import DeliveryStatus, RegisteredModel, Webhook, WebhookDelivery, WebhookEvent
from registry.webhooks import outbound

logger = logging.getLogger(__name__)

DELIVER_TASK = "registry.tasks.deliver_webhook"
SIGNATURE_HEADER = "Modelyard-Signature"
MAX_RETRY_DELAY = timedelta(hours=1)
# A claimed delivery whose worker has not recorded an outcome this long after its deadline was lost.
LOST_AFTER = timedelta(seconds=60)
SECRET_MIN_CHARS = 16


def sign(secret: str, timestamp: int, body: str) -> str:
    """The ``Modelyard-Signature`` header value for ``body`` sent at ``timestamp``."""
    digest = hmac.new(secret.encode(), f"{timestamp}.{body}".encode(), hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


# --- Emitting (inside the change's transaction) ------------------------------------------------------


def emit(event: WebhookEvent, *, model: RegisteredModel, version: int | None, details: dict[str, Any]) -> None:
    """Record ``event`` for every active webhook that wants it, and queue the deliveries once the caller commits.

    Call it inside the transaction of the change: if that rolls back, nothing is sent.
    """
    hooks = [
        hook
        # Without the secret: it is decrypted only when a delivery is signed, so a key problem never fails the change.
        for hook in Webhook.objects.filter(Q(model__isnull=True) | Q(model=model), active=True).defer("secret")
        if event in hook.events
    ]
    if not hooks:
        return
    now = timezone.now()
    ids = []
    for hook in hooks:
        delivery_id = uuid.uuid4()
        body = {
            "id": str(delivery_id),
            "event": str(event),
            "at": now.isoformat(),
            "model": model.name,
            "version": version,
            "details": details,
        }
        delivery = WebhookDelivery.objects.create(
            webhook=hook,
            uuid=delivery_id,
            event=event,
            model_name=model.name,
            version=version,
            body=json.dumps(body, sort_keys=True, separators=(",", ":"), default=str),
            next_attempt_at=now,
        )
        ids.append(delivery.pk)
    transaction.on_commit(partial(deliveries_queue, ids))


# --- Queueing ----------------------------------------------------------------------------------------


def _deliver_in_process(delivery_id: int) -> None:
    delivery_attempt(delivery_id=delivery_id)


# Without a broker, deliveries run on this one thread: never on the request's (a slow receiver would
# hold the request), never on the embedded scheduler's (it would hold the schedule).
_delivery_thread = queueing.JobThread(name="modelyard-webhooks", run=_deliver_in_process)


def deliveries_queue(ids: Iterable[int]) -> None:
    """Hand deliveries to a worker; never raises, since what queues them has already committed.

    A delivery that could not be queued stays pending, and the periodic retry queues it later.
    """
    for delivery_id in ids:
        try:
            if current_app.conf.task_always_eager:
                _delivery_thread.submit(delivery_id)
            else:
                current_app.send_task(DELIVER_TASK, args=(delivery_id,))
        except Exception:
            logger.exception("could not queue webhook delivery %s; the periodic retry queues it again", delivery_id)


def deliveries_due() -> list[int]:
    """Pending deliveries whose time has come, after taking back attempts whose worker was lost."""
    now = timezone.now()
    lost_before = now - timedelta(seconds=settings.WEBHOOK_TIMEOUT_SECONDS) - LOST_AFTER
    for delivery in WebhookDelivery.objects.filter(status=DeliveryStatus.SENDING, claimed_at__lt=lost_before):
        _record_failure(delivery, "the attempt was lost (the process sending it stopped)", status_code=None)
    due = WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
    return list(due.order_by("next_attempt_at").values_list("pk", flat=True)[:500])


# --- Attempts ----------------------------------------------------------------------------------------


def _retry_delay(attempts: int) -> timedelta:
    delay = timedelta(seconds=settings.WEBHOOK_RETRY_SECONDS * 2 ** max(0, attempts - 1))
    return min(delay, MAX_RETRY_DELAY)


def _record_failure(delivery: WebhookDelivery, error: str, *, status_code: int | None) -> None:
    """Count a failed attempt: retry later, or fail for good once the attempts are spent."""
    now = timezone.now()
    changes: dict[str, Any] = {"last_error": error[:2000], "last_status_code": status_code, "claimed_at": None}
    if delivery.attempts >= settings.WEBHOOK_MAX_ATTEMPTS:
        changes.update(status=DeliveryStatus.FAILED, next_attempt_at=None)
    else:
        changes.update(status=DeliveryStatus.PENDING, next_attempt_at=now + _retry_delay(delivery.attempts))
    WebhookDelivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.SENDING).update(**changes)


def delivery_attempt(*, delivery_id: int) -> str:
    """Send one pending delivery whose time has come, and record how it went; returns the outcome in a word.

    The claim is a conditional update, so a task delivered twice sends once. The POST happens
    outside any transaction.
    """
    now = timezone.now()
    claimed = WebhookDelivery.objects.filter(
        pk=delivery_id, status=DeliveryStatus.PENDING, next_attempt_at__lte=now
    ).update(status=DeliveryStatus.SENDING, attempts=F("attempts") + 1, claimed_at=now)
    if not claimed:
        return "skipped"
    delivery = WebhookDelivery.objects.select_related("webhook").defer("webhook__secret").get(pk=delivery_id)
    hook = delivery.webhook
    if not hook.active:
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            status=DeliveryStatus.FAILED, last_error="the webhook was disabled", next_attempt_at=None, claimed_at=None
        )
        return "disabled"
    try:
        secret = hook.secret  # decrypted here (modelyard/crypto.py)
    except SecretUnreadable as exc:
        _record_failure(delivery, str(exc), status_code=None)
        return "failed"
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Modelyard-Webhooks/1",
        "Modelyard-Event": delivery.event,
        "Modelyard-Delivery": str(delivery.uuid),
        SIGNATURE_HEADER: sign(secret, int(time.time()), delivery.body),
    }
    try:
        answer = outbound.post(
            hook.url,
            delivery.body.encode(),
            headers,
            timeout=settings.WEBHOOK_TIMEOUT_SECONDS,
            allow_private=settings.WEBHOOK_ALLOW_PRIVATE,
        )
    except (outbound.DeliveryRefused, outbound.DeliveryFailed) as exc:
        _record_failure(delivery, str(exc), status_code=None)
        return "failed"
    if 200 <= answer.status < 300:
        WebhookDelivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.SENDING).update(
            status=DeliveryStatus.DELIVERED,
            delivered_at=timezone.now(),
            last_status_code=answer.status,
            last_error="",
            next_attempt_at=None,
            claimed_at=None,
        )
        return "delivered"
    # The status line only: a receiver's body may echo the request, or anything else, into the log.
    why = " (redirects are not followed)" if 300 <= answer.status < 400 else ""
    error = " ".join(part for part in ("answered", str(answer.status), answer.reason) if part) + why
    _record_failure(delivery, error, status_code=answer.status)
    return "failed"


# --- Registering endpoints (admins) ---------------------------------------------------------------------


def _checked_url(url: str) -> str:
    refusal = outbound.url_refusal(url, allow_private=settings.WEBHOOK_ALLOW_PRIVATE)
    if refusal is not None:
        raise InvalidInput(f"webhook URL refused: {refusal}")
    return url


def _checked_events(events: Sequence[str]) -> list[str]:
    unknown = sorted(set(events) - set(WebhookEvent.values))
    if unknown:
        raise InvalidInput(f"unknown event(s) {', '.join(unknown)}; events are {', '.join(WebhookEvent.values)}")
    if not events:
        raise InvalidInput(f"name at least one event: {', '.join(WebhookEvent.values)}")
    return sorted(set(events), key=WebhookEvent.values.index)


def _checked_secret(secret: str) -> str:
    if len(secret) < SECRET_MIN_CHARS:
        raise InvalidInput(f"a webhook secret needs at least {SECRET_MIN_CHARS} characters")
    return secret


def _recorded_url(url: str) -> str:
    """The URL without its query string, which often carries a receiver's key (``?token=...``)."""
    parts = urlsplit(url)
    if not parts.query and not parts.fragment:
        return url
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")) + ("?(hidden)" if parts.query else "")


def _recorded(hook: Webhook) -> dict[str, Any]:
    """What the audit log keeps of a webhook: never its secret, nor its URL's query string."""
    return {
        "url": _recorded_url(hook.url),
        "events": hook.events,
        "model": hook.model.name if hook.model else None,
        "active": hook.active,
    }


@transaction.atomic(durable=True)
def webhook_create(
    *,
    url: str,
    events: Sequence[str],
    actor: Actor,
    model: RegisteredModel | None = None,
    secret: str = "",
    active: bool = True,
) -> tuple[Webhook, str | None]:
    """Register an endpoint; returns it and the secret when one was generated (shown to the caller once)."""
    generated = None if secret else secrets.token_urlsafe(32)
    hook = Webhook.objects.create(
        url=_checked_url(url),
        events=_checked_events(events),
        model=model,
        secret=generated or _checked_secret(secret),
        active=active,
        created_by=actor.user,
    )
    audit_record(
        actor=actor, action="webhook.create", target_type="webhook", target=str(hook.pk), after=_recorded(hook)
    )
    return hook, generated


@transaction.atomic(durable=True)
def webhook_update(*, webhook: Webhook, actor: Actor, **changes: Any) -> Webhook:
    """Change a webhook's url, events, model filter, active flag or secret."""
    unknown = set(changes) - {"url", "events", "model", "active", "secret"}
    if unknown:
        raise TypeError(f"webhook_update() got unexpected fields {sorted(unknown)}")
    hook = Webhook.objects.select_for_update(of=("self",)).select_related("model").defer("secret").get(pk=webhook.pk)
    before, old_url = _recorded(hook), hook.url
    if "url" in changes:
        hook.url = _checked_url(changes["url"])
    if "events" in changes:
        hook.events = _checked_events(changes["events"])
    if "model" in changes:
        hook.model = changes["model"]
    if "active" in changes:
        hook.active = changes["active"]
    after = _recorded(hook)
    if hook.url != old_url and after["url"] == before["url"]:
        after["url_changed"] = True  # only its hidden query string did
    if "secret" in changes:
        hook.secret = _checked_secret(changes["secret"])
        after["secret_changed"] = True  # that it changed, never what to
    hook.save()
    audit_record(
        actor=actor, action="webhook.update", target_type="webhook", target=str(hook.pk), before=before, after=after
    )
    return hook


@transaction.atomic(durable=True)
def webhook_delete(*, webhook: Webhook, actor: Actor) -> None:
    """Remove a webhook and its delivery log; deliveries not yet sent are dropped."""
    before = _recorded(webhook)
    target = str(webhook.pk)
    webhook.delete()
    audit_record(actor=actor, action="webhook.delete", target_type="webhook", target=target, before=before)
