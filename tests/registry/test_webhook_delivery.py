"""Webhook deliveries: signed, sent after commit off the request thread, retried with backoff, logged.

The receiver is a real HTTP server on 127.0.0.1 that checks each signature as a receiver should.
"""

from __future__ import annotations

import socket
import threading
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from registry import promotions, tasks
from registry.models import DeliveryStatus, RegisteredModel, Webhook, WebhookDelivery, WebhookEvent
from registry.webhooks import services as webhooks
from tests.support.onnx_models import unrunnable_model
from tests.support.polling import eventually
from tests.support.registry import create_model, set_alias, upload_versions
from tests.support.webhooks import Received, webhook_receiver

SECRET = "a-long-enough-webhook-secret"


@pytest.fixture(autouse=True)
def _private_allowed(settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True  # the receiver listens on 127.0.0.1


def hook_for(person, receiver, events=tuple(WebhookEvent.values), **kwargs) -> Webhook:
    hook, _ = webhooks.webhook_create(
        url=receiver.url, events=list(events), secret=SECRET, actor=person.actor, **kwargs
    )
    return hook


def only_delivery() -> WebhookDelivery:
    [delivery] = WebhookDelivery.objects.all()
    return delivery


@pytest.mark.django_db(transaction=True)
def test_every_event_arrives_signed_after_commit_from_the_delivery_thread(owner, approver, receiver):
    create_model(owner)
    hook_for(owner, receiver)
    receiver.hold = threading.Event()  # the receiver keeps each answer until the test lets it go

    upload_versions(owner, [1.0])  # validated in-process: version.ready
    # The upload answered while the receiver still held the delivery: nobody's request waits on it.
    eventually(lambda: receiver.received, what="no delivery arrived")
    assert WebhookDelivery.objects.get().status == DeliveryStatus.SENDING
    receiver.hold.set()

    assert owner.upload("demo", [("model.onnx", unrunnable_model().SerializeToString())]).status_code == 201
    requested = set_alias(owner, "production", 1).json()
    approved = approver.post(f"/api/v1/promotions/{requested['id']}/approve", {"reason": "ship it"})
    assert approved.status_code == 200
    upload_versions(owner, [2.0])
    second = set_alias(owner, "production", 3).json()
    assert approver.post(f"/api/v1/promotions/{second['id']}/reject", {"reason": "not yet"}).status_code == 200

    expected = [
        "version.ready",
        "version.failed",
        "promotion.requested",
        "promotion.approved",
        "alias.moved",
        "version.ready",
        "promotion.requested",
        "promotion.rejected",
    ]
    eventually(lambda: len(receiver.received) == len(expected), what=lambda: receiver.events())
    assert sorted(receiver.events()) == sorted(expected)
    assert all(request.signature_ok(SECRET) for request in receiver.received)
    assert not any(request.signature_ok("another-secret-of-some-length") for request in receiver.received)
    eventually(lambda: set(WebhookDelivery.objects.values_list("status", flat=True)) == {DeliveryStatus.DELIVERED})

    by_event: dict[str, list[Received]] = {}
    for request in receiver.received:
        by_event.setdefault(request.json["event"], []).append(request)
    [moved] = by_event["alias.moved"]
    assert moved.path == "/hooks/modelyard"
    assert moved.headers["content-type"] == "application/json"
    assert moved.headers["modelyard-event"] == "alias.moved"
    body = moved.json
    assert body["id"] == moved.headers["modelyard-delivery"]
    assert (body["model"], body["version"]) == ("demo", 1)
    assert body["details"] == {
        "alias": "production",
        "from_version": None,
        "to_version": 1,
        "kind": "approval",
        "reason": "test",  # the request's reason (tests.support.registry.set_alias)
        "forced": False,
        "moved_by": "approver",
        "promotion": requested["id"],
    }
    [failed] = by_event["version.failed"]
    assert (failed.json["version"], failed.json["details"]["status"]) == (2, "failed")
    assert failed.json["details"]["errors"]
    rejected = by_event["promotion.rejected"][0].json
    assert (rejected["version"], rejected["details"]["decided_by"], rejected["details"]["reason"]) == (
        3,
        "approver",
        "not yet",
    )
    ready = by_event["version.ready"][0].json
    assert ready["details"]["signature"]["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]


@pytest.mark.django_db
def test_only_the_events_and_the_model_a_webhook_names_are_delivered(owner, receiver, queued):
    create_model(owner)
    create_model(owner, "other")
    hook_for(owner, receiver, events=["version.ready"], model=RegisteredModel.objects.get(name="demo"))
    upload_versions(owner, [1.0])
    upload_versions(owner, [1.0], model="other")
    assert set_alias(owner, "staging", 1).status_code == 200  # alias.moved: not asked for
    assert [(d.event, d.model_name, d.version) for d in WebhookDelivery.objects.all()] == [("version.ready", "demo", 1)]
    assert queued == [only_delivery().pk]


@pytest.mark.django_db
def test_an_inactive_webhook_gets_nothing_and_a_rolled_back_change_sends_nothing(owner, receiver, queued):
    create_model(owner)
    upload_versions(owner, [1.0])
    hook = hook_for(owner, receiver, active=False)
    assert set_alias(owner, "staging", 1).status_code == 200
    assert not WebhookDelivery.objects.exists()

    Webhook.objects.filter(pk=hook.pk).update(active=True)
    with pytest.raises(RuntimeError), transaction.atomic():
        webhooks.emit(WebhookEvent.ALIAS_MOVED, model=RegisteredModel.objects.get(), version=1, details={})
        raise RuntimeError("the change fails after emitting")
    assert not WebhookDelivery.objects.exists()


@pytest.mark.django_db
def test_a_failed_attempt_is_retried_with_doubling_backoff_then_delivered(owner, receiver, queued, settings):
    settings.WEBHOOK_RETRY_SECONDS = 30
    create_model(owner)
    hook_for(owner, receiver, events=["version.ready"])
    upload_versions(owner, [1.0])
    receiver.statuses = [500, 503]

    assert webhooks.delivery_attempt(delivery_id=queued[0]) == "failed"
    delivery = only_delivery()
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("pending", 1, 500)
    # The status line only: the receiver's body ("boom") stays out of the log.
    assert delivery.last_error == "answered 500 Internal Server Error"
    wait = delivery.next_attempt_at - timezone.now()
    assert timedelta(seconds=25) < wait <= timedelta(seconds=30)
    assert webhooks.delivery_attempt(delivery_id=delivery.pk) == "skipped"  # not due yet
    assert tasks.retry_webhook_deliveries() == []

    WebhookDelivery.objects.update(next_attempt_at=timezone.now())
    assert tasks.retry_webhook_deliveries() == [delivery.pk]  # due: queued again
    assert webhooks.delivery_attempt(delivery_id=delivery.pk) == "failed"
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.last_status_code) == (2, 503)
    assert timedelta(seconds=55) < delivery.next_attempt_at - timezone.now() <= timedelta(seconds=60)

    WebhookDelivery.objects.update(next_attempt_at=timezone.now())
    assert webhooks.delivery_attempt(delivery_id=delivery.pk) == "delivered"
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_status_code, delivery.last_error) == (
        "delivered",
        3,
        200,
        "",
    )
    assert len(receiver.received) == 3
    assert len({request.headers["modelyard-delivery"] for request in receiver.received}) == 1  # one id for all
    assert all(request.signature_ok(SECRET) for request in receiver.received)


@pytest.mark.django_db
def test_attempts_end_failed_at_the_limit(owner, receiver, queued, settings):
    settings.WEBHOOK_MAX_ATTEMPTS = 2
    create_model(owner)
    hook_for(owner, receiver, events=["version.ready"])
    upload_versions(owner, [1.0])
    receiver.statuses = [500, 500, 500]
    for _ in range(3):
        webhooks.delivery_attempt(delivery_id=queued[0])
        WebhookDelivery.objects.filter(status="pending").update(next_attempt_at=timezone.now())
    delivery = only_delivery()
    assert (delivery.status, delivery.attempts, delivery.next_attempt_at) == ("failed", 2, None)
    assert len(receiver.received) == 2


@pytest.mark.django_db
@pytest.mark.parametrize("drip", [False, True])
def test_an_attempt_stops_at_the_timeout(owner, receiver, queued, settings, drip):
    settings.WEBHOOK_TIMEOUT_SECONDS = 0.5
    create_model(owner)
    hook_for(owner, receiver, events=["version.ready"])
    upload_versions(owner, [1.0])
    if drip:  # one byte every 0.2 s: each read is quick, the whole answer is not
        receiver.drip_seconds = 0.2
    else:
        receiver.hold = threading.Event()
    assert webhooks.delivery_attempt(delivery_id=queued[0]) == "failed"
    delivery = only_delivery()
    assert delivery.last_error == "no answer within 0.5 s (MODELYARD_WEBHOOK_TIMEOUT_SECONDS)"
    assert delivery.status == "pending"


@pytest.mark.django_db
def test_a_redirect_is_not_followed(owner, queued):
    create_model(owner)
    with webhook_receiver() as target, webhook_receiver() as redirecting:
        hook_for(owner, redirecting, events=["version.ready"])
        redirecting.statuses = [302]
        redirecting.headers = {"Location": target.url}
        upload_versions(owner, [1.0])
        assert webhooks.delivery_attempt(delivery_id=queued[0]) == "failed"
        assert target.received == []
    delivery = only_delivery()
    assert (delivery.last_status_code, delivery.last_error) == (302, "answered 302 Found (redirects are not followed)")


@pytest.mark.django_db
def test_loopback_is_refused_without_the_setting(owner, receiver, queued, settings):
    create_model(owner)
    hook_for(owner, receiver, events=["version.ready"])
    settings.WEBHOOK_ALLOW_PRIVATE = False
    upload_versions(owner, [1.0])
    assert webhooks.delivery_attempt(delivery_id=queued[0]) == "failed"
    assert receiver.received == []
    assert only_delivery().last_error == (
        "127.0.0.1 is a loopback address (set MODELYARD_WEBHOOK_ALLOW_PRIVATE=true to deliver there)"
    )


@pytest.fixture
def resolving(monkeypatch):
    """Make ``hooks.example.test`` resolve to the address a test names, as a hostile DNS server would."""
    answer: dict[str, str] = {}
    real = socket.getaddrinfo

    def fake(host, port, *args, **kwargs):
        if host == "hooks.example.test":
            family = socket.AF_INET6 if ":" in answer["address"] else socket.AF_INET
            return [(family, socket.SOCK_STREAM, 6, "", (answer["address"], port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return answer


@pytest.mark.django_db
def test_the_address_is_checked_when_connecting_and_that_address_is_used(
    owner, receiver, queued, resolving, django_capture_on_commit_callbacks
):
    """DNS rebinding: the name passed when registered; at delivery it resolves to the metadata service."""
    create_model(owner)
    port = receiver.url.split(":")[2].split("/")[0]
    webhooks.webhook_create(
        url=f"http://hooks.example.test:{port}/hooks/modelyard",
        events=["version.ready", "alias.moved"],
        secret=SECRET,
        actor=owner.actor,
    )
    resolving["address"] = "169.254.169.254"
    upload_versions(owner, [1.0])
    assert webhooks.delivery_attempt(delivery_id=queued[0]) == "failed"
    assert WebhookDelivery.objects.get(pk=queued[0]).last_error == (
        "refused to deliver to hooks.example.test: 169.254.169.254 is a cloud metadata address"
    )

    resolving["address"] = "127.0.0.1"  # the address checked is the one connected to: the receiver
    with django_capture_on_commit_callbacks(execute=True):
        assert set_alias(owner, "staging", 1).status_code == 200
    assert webhooks.delivery_attempt(delivery_id=queued[1]) == "delivered"
    [request] = receiver.received
    assert request.headers["host"] == f"hooks.example.test:{port}"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("64:ff9b:1::a9fe:a9fe", "169.254.169.254 is a cloud metadata address"),  # local-use NAT64
        ("::7f00:1", "127.0.0.1 is a loopback address (set MODELYARD_WEBHOOK_ALLOW_PRIVATE=true to deliver there)"),
        ("::ffff:0:a00:1", "10.0.0.1 is a private address (set MODELYARD_WEBHOOK_ALLOW_PRIVATE=true to deliver there)"),
    ],
)
def test_a_name_resolving_to_an_ipv6_form_of_a_refused_ipv4_address_is_not_delivered_to(
    owner, queued, resolving, settings, address, why
):
    settings.WEBHOOK_ALLOW_PRIVATE = False
    create_model(owner)
    webhooks.webhook_create(
        url="http://hooks.example.test/hooks/modelyard", events=["version.ready"], secret=SECRET, actor=owner.actor
    )
    resolving["address"] = address
    upload_versions(owner, [1.0])
    assert webhooks.delivery_attempt(delivery_id=queued[0]) == "failed"
    delivery = only_delivery()
    assert (delivery.status, delivery.last_status_code) == ("pending", None)
    assert delivery.last_error == f"refused to deliver to hooks.example.test: {why}"


@pytest.mark.django_db
def test_a_disabled_webhook_stops_its_pending_deliveries(owner, receiver, queued):
    create_model(owner)
    hook = hook_for(owner, receiver, events=["version.ready"])
    upload_versions(owner, [1.0])
    webhooks.webhook_update(webhook=hook, actor=owner.actor, active=False)
    assert webhooks.delivery_attempt(delivery_id=queued[0]) == "disabled"
    delivery = only_delivery()
    assert (delivery.status, delivery.last_error) == ("failed", "the webhook was disabled")
    assert receiver.received == []


@pytest.mark.django_db
def test_an_attempt_whose_worker_was_lost_is_taken_back(owner, receiver, queued):
    create_model(owner)
    hook_for(owner, receiver, events=["version.ready"])
    upload_versions(owner, [1.0])
    WebhookDelivery.objects.update(
        status=DeliveryStatus.SENDING, attempts=1, claimed_at=timezone.now() - timedelta(minutes=10)
    )
    assert webhooks.deliveries_due() == []  # back to pending, its next attempt after the backoff
    delivery = only_delivery()
    assert (delivery.status, delivery.attempts) == ("pending", 1)
    assert delivery.last_error == "the attempt was lost (the process sending it stopped)"


@pytest.mark.django_db
def test_with_a_broker_deliveries_go_to_the_celery_task(owner, receiver, monkeypatch):
    from celery import current_app

    sent = []
    monkeypatch.setitem(current_app.conf, "task_always_eager", False)
    monkeypatch.setattr(current_app, "send_task", lambda name, args: sent.append((name, args)))
    create_model(owner)
    hook_for(owner, receiver, events=["version.ready"])
    webhooks.deliveries_queue([41, 42])
    assert sent == [(webhooks.DELIVER_TASK, (41,)), (webhooks.DELIVER_TASK, (42,))]
    assert webhooks.DELIVER_TASK in current_app.tasks  # the name is a registered task
    assert receiver.received == []


@pytest.mark.django_db
def test_promotion_requests_for_unprotecting_are_announced_without_a_version(owner, receiver, queued):
    from tests.support.people import make_person

    root = make_person("root", "admin")
    create_model(owner)
    hook_for(owner, receiver, events=["promotion.requested"])
    outcome = promotions.alias_update_flags(
        model=RegisteredModel.objects.get(), alias_name="production", actor=root.actor, protected=False, reason="why"
    )
    assert outcome.promotion is not None
    delivery = only_delivery()
    body = delivery.body
    assert '"version":null' in body and '"kind":"unprotect"' in body and '"requested_by":"root"' in body
