"""``/api/v1/webhooks``: admins register, change and remove endpoints and read their delivery logs; nobody else."""

from __future__ import annotations

import pytest

from registry.models import AuditEvent, Role, Webhook, WebhookDelivery
from registry.webhooks import services as webhooks
from tests.support.people import make_person

pytestmark = pytest.mark.django_db

HOOKS = "/api/v1/webhooks"


@pytest.fixture
def admin():
    return make_person("root", Role.ADMIN)


@pytest.fixture(autouse=True)
def _private_allowed(settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True  # the tests register loopback URLs


def test_admin_registers_a_webhook_and_sees_the_generated_secret_once(admin, registered):
    response = admin.post(HOOKS, {"url": "http://127.0.0.1:9/hook", "events": ["alias.moved", "version.ready"]})
    assert response.status_code == 201, response.content
    body = response.json()
    secret = body.pop("secret")
    assert len(secret) >= 32
    assert (body["url"], body["events"], body["model"], body["active"], body["created_by"]) == (
        "http://127.0.0.1:9/hook",
        ["version.ready", "alias.moved"],  # in the order of the event list
        None,
        True,
        "root",
    )
    hook = Webhook.objects.get(pk=body["id"])
    assert hook.secret == secret
    listed = admin.get(HOOKS).json()["results"]
    assert [row["id"] for row in listed] == [hook.pk]
    assert "secret" not in listed[0] and "secret" not in admin.get(f"{HOOKS}/{hook.pk}").json()
    event = AuditEvent.objects.get(action="webhook.create")
    assert event.after == {
        "url": "http://127.0.0.1:9/hook",
        "events": ["version.ready", "alias.moved"],
        "model": None,
        "active": True,
    }
    assert secret not in str(event.after)


def test_a_secret_sent_is_kept_and_not_echoed(admin, registered):
    response = admin.post(
        HOOKS, {"url": "https://hooks.example.com/m", "events": ["version.failed"], "secret": "s" * 20, "model": "demo"}
    )
    assert response.status_code == 201, response.content
    assert response.json()["secret"] is None
    assert response.json()["model"] == "demo"
    assert Webhook.objects.get().secret == "s" * 20


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            {"url": "ftp://h/x", "events": ["alias.moved"]},
            "webhook URL refused: the URL must start with http:// or https://",
        ),
        (
            {"url": "http://169.254.169.254/latest", "events": ["alias.moved"]},
            "webhook URL refused: 169.254.169.254 is a cloud metadata address",
        ),
        (
            {"url": "http://[fe80::1]/x", "events": ["alias.moved"]},
            "webhook URL refused: fe80::1 is a link-local address",
        ),
        (
            {"url": "http://user:pw@hooks.example.com/", "events": ["alias.moved"]},
            "webhook URL refused: the URL must not carry credentials; the signature authenticates deliveries",
        ),
        (
            {"url": "http://h.example.com/", "events": ["alias.moved", "model.deleted"]},
            "unknown event(s) model.deleted; events are version.ready, version.failed, promotion.requested, "
            "promotion.approved, promotion.rejected, alias.moved, rollout.started, rollout.step, rollout.paused, "
            "rollout.resumed, rollout.rolled_back, rollout.completed, rollout.aborted, inference_job.finished",
        ),
        (
            {"url": "http://h.example.com/", "events": []},
            "name at least one event: version.ready, version.failed, promotion.requested, promotion.approved, "
            "promotion.rejected, alias.moved, rollout.started, rollout.step, rollout.paused, rollout.resumed, "
            "rollout.rolled_back, rollout.completed, rollout.aborted, inference_job.finished",
        ),
        ({"url": "http://h.example.com/", "events": ["alias.moved"], "model": "nope"}, "no model named 'nope'"),
        (
            {"url": "http://h.example.com/", "events": ["alias.moved"], "secret": "short"},
            "a webhook secret needs at least 16 characters",
        ),
        ({"events": ["alias.moved"]}, "url: This field is required."),
        (
            {"url": "http://h.example.com/in\r\nX-Injected: 1", "events": ["alias.moved"]},
            "webhook URL refused: the URL must not contain spaces or control characters (found '\\r')",
        ),
        (
            {"url": "http://[::ffff:0:a9fe:a9fe]/latest", "events": ["alias.moved"]},
            "webhook URL refused: 169.254.169.254 is a cloud metadata address",
        ),
    ],
)
def test_bad_input_is_400_and_registers_nothing(admin, body, error):
    response = admin.post(HOOKS, body)
    assert response.status_code == 400, response.content
    assert response.json()["error"] == error
    assert not Webhook.objects.exists()


def test_private_addresses_need_the_setting(admin, settings):
    settings.WEBHOOK_ALLOW_PRIVATE = False
    response = admin.post(HOOKS, {"url": "http://10.1.2.3/hook", "events": ["alias.moved"]})
    assert response.status_code == 400
    assert response.json()["error"] == (
        "webhook URL refused: 10.1.2.3 is a private address (set MODELYARD_WEBHOOK_ALLOW_PRIVATE=true to deliver there)"
    )


def test_only_admins_see_or_manage_webhooks(owner, approver):
    hook, _ = webhooks.webhook_create(url="http://127.0.0.1:9/", events=["alias.moved"], actor=owner.actor)
    for person in (owner, approver):
        for response in (
            person.get(HOOKS),
            person.get(f"{HOOKS}/{hook.pk}"),
            person.get(f"{HOOKS}/{hook.pk}/deliveries"),
            person.post(HOOKS, {"url": "http://127.0.0.1:9/", "events": ["alias.moved"]}),
            person.patch(f"{HOOKS}/{hook.pk}", {"active": False}),
            person.delete(f"{HOOKS}/{hook.pk}"),
        ):
            assert response.status_code == 403
            assert response.json()["error"] == "webhooks need the admin role"
    assert Webhook.objects.get().active
    assert AuditEvent.objects.filter(action="access.denied").count() == 6  # the refused writes


def test_admin_changes_a_webhook_and_a_new_secret_is_audited_without_its_value(admin, registered):
    hook, _ = webhooks.webhook_create(url="http://127.0.0.1:9/", events=["alias.moved"], actor=admin.actor)
    response = admin.patch(
        f"{HOOKS}/{hook.pk}", {"events": ["version.ready"], "active": False, "secret": "n" * 24, "model": "demo"}
    )
    assert response.status_code == 200, response.content
    assert (response.json()["events"], response.json()["active"], response.json()["model"]) == (
        ["version.ready"],
        False,
        "demo",
    )
    hook.refresh_from_db()
    assert hook.secret == "n" * 24
    event = AuditEvent.objects.get(action="webhook.update")
    assert event.before == {"url": "http://127.0.0.1:9/", "events": ["alias.moved"], "model": None, "active": True}
    assert event.after == {
        "url": "http://127.0.0.1:9/",
        "events": ["version.ready"],
        "model": "demo",
        "active": False,
        "secret_changed": True,
    }
    assert admin.patch(f"{HOOKS}/{hook.pk}", {"url": "http://169.254.169.254/"}).status_code == 400
    hook.refresh_from_db()
    assert hook.url == "http://127.0.0.1:9/"


def test_the_audit_log_keeps_a_webhook_url_without_its_query_string(admin):
    response = admin.post(HOOKS, {"url": "https://hooks.example.com/in?token=s3cr3t-key", "events": ["alias.moved"]})
    assert response.status_code == 201, response.content
    assert response.json()["url"] == "https://hooks.example.com/in?token=s3cr3t-key"  # the admin sees it whole
    hook = Webhook.objects.get()
    assert AuditEvent.objects.get(action="webhook.create").after["url"] == "https://hooks.example.com/in?(hidden)"

    changed = admin.patch(f"{HOOKS}/{hook.pk}", {"url": "https://hooks.example.com/in?token=n3w-key"})
    assert changed.status_code == 200, changed.content
    event = AuditEvent.objects.get(action="webhook.update")
    assert (event.before["url"], event.after["url"]) == ("https://hooks.example.com/in?(hidden)",) * 2
    assert event.after["url_changed"] is True
    webhooks.webhook_delete(webhook=Webhook.objects.get(), actor=admin.actor)
    recorded = [event.canonical() for event in AuditEvent.objects.filter(action__startswith="webhook.")]
    assert len(recorded) == 3 and "s3cr3t" not in str(recorded) and "n3w-key" not in str(recorded)


def test_admin_removes_a_webhook_with_its_log(admin, registered):
    hook, _ = webhooks.webhook_create(url="http://127.0.0.1:9/", events=["alias.moved"], actor=admin.actor)
    assert admin.delete(f"{HOOKS}/{hook.pk}").status_code == 204
    assert not Webhook.objects.exists()
    assert AuditEvent.objects.filter(action="webhook.delete", target=str(hook.pk)).exists()
    response = admin.delete(f"{HOOKS}/{hook.pk}")
    assert response.status_code == 404
    assert response.json()["error"] == f"there is no webhook {hook.pk}"


def test_the_delivery_log_lists_newest_first_and_filters_by_status(admin, registered):
    hook, _ = webhooks.webhook_create(url="http://127.0.0.1:9/", events=["version.ready"], actor=admin.actor)
    for number in (1, 2):
        WebhookDelivery.objects.create(
            webhook=hook,
            uuid=f"00000000-0000-0000-0000-00000000000{number}",
            event="version.ready",
            model_name="demo",
            version=number,
            body=f'{{"event": "version.ready", "version": {number}}}',
            status="failed" if number == 1 else "pending",
            attempts=number,
            last_error="answered 500: boom" if number == 1 else "",
        )
    rows = admin.get(f"{HOOKS}/{hook.pk}/deliveries").json()["results"]
    assert [(row["version"], row["status"], row["attempts"]) for row in rows] == [(2, "pending", 2), (1, "failed", 1)]
    assert rows[1]["last_error"] == "answered 500: boom"
    assert rows[0]["payload"] == {"event": "version.ready", "version": 2}
    failed = admin.get(f"{HOOKS}/{hook.pk}/deliveries?status=failed").json()["results"]
    assert [row["version"] for row in failed] == [1]
    response = admin.get(f"{HOOKS}/{hook.pk}/deliveries?status=lost")
    assert response.status_code == 400
    assert response.json()["error"] == "unknown status 'lost'; statuses are pending, sending, delivered, failed"
    assert admin.get(f"{HOOKS}/999/deliveries").status_code == 404
