"""Secrets the registry reads back are encrypted at rest (modelyard/crypto.py, MODELYARD_ENCRYPTION_KEYS).

A webhook's secret never appears in a dump of the database, yet deliveries are signed with it; keys
rotate (new first, old after) and ``rotate_encryption_keys`` moves every secret to the new key.
"""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet, InvalidToken
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor

from modelyard import crypto
from registry.models import AuditEvent, DeliveryStatus, RegisteredModel, Role, Webhook, WebhookDelivery, WebhookEvent
from registry.webhooks import services as webhooks
from tests.support.people import make_person

SECRET = "the-webhook-secret-nobody-may-read-7f3a9c"
OLD, NEW = Fernet.generate_key().decode(), Fernet.generate_key().decode()


@pytest.fixture(autouse=True)
def _private_allowed(settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True  # the receiver listens on 127.0.0.1


@pytest.fixture
def admin(db):
    return make_person("root", Role.ADMIN)


def raw_secret(pk: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT secret FROM registry_webhook WHERE id = %s", [pk])
        return str(cursor.fetchone()[0])


def pg_dump() -> str:
    db = connection.settings_dict
    env = {**os.environ, "PGPASSWORD": db["PASSWORD"] or ""}
    command = ["pg_dump", "--data-only", "-h", db["HOST"] or "127.0.0.1", "-U", db["USER"] or "postgres"]
    if db["PORT"]:
        command += ["-p", str(db["PORT"])]
    result = subprocess.run([*command, db["NAME"]], env=env, capture_output=True, text=True, timeout=120, check=True)
    return result.stdout


def send_one_event(model: RegisteredModel, queued: list[int]) -> int:
    with transaction.atomic():
        webhooks.emit(WebhookEvent.ALIAS_MOVED, model=model, version=1, details={"alias": "production"})
    [delivery_id] = queued
    return delivery_id


@pytest.mark.django_db(transaction=True)
def test_a_webhook_secret_is_nowhere_in_a_database_dump_and_deliveries_are_still_signed_with_it(
    settings, admin, registered, receiver, queued
):
    response = admin.post("/api/v1/webhooks", {"url": receiver.url, "events": ["alias.moved"], "secret": SECRET})
    assert response.status_code == 201, response.content
    generated = admin.post("/api/v1/webhooks", {"url": receiver.url + "/2", "events": ["version.ready"]})
    assert generated.status_code == 201, generated.content
    generated_secret = generated.json()["secret"]
    hook = Webhook.objects.get(pk=response.json()["id"])

    dump = pg_dump()
    assert receiver.url in dump  # the rows are in the dump...
    assert SECRET not in dump and generated_secret not in dump  # ...their secrets are not
    assert SECRET.encode().hex() not in dump
    stored = raw_secret(hook.pk)
    assert stored.startswith("gAAAAA") and stored in dump
    assert Fernet(settings.ENCRYPTION_KEYS[0].encode()).decrypt(stored.encode()) == SECRET.encode()
    assert Webhook.objects.get(pk=hook.pk).secret == SECRET
    assert Webhook.objects.get(pk=generated.json()["id"]).secret == generated_secret
    # The API never shows it back.
    assert SECRET not in admin.get("/api/v1/webhooks").content.decode()

    delivery_id = send_one_event(RegisteredModel.objects.get(name=registered), queued)
    assert webhooks.delivery_attempt(delivery_id=delivery_id) == "delivered"
    [request] = receiver.received
    assert request.signature_ok(SECRET)
    assert not request.signature_ok(stored)  # signed with the secret, not with what the column holds


@pytest.mark.django_db(transaction=True)
def test_keys_rotate_new_first_and_the_command_reencrypts_every_secret_under_the_new_key(
    settings, admin, registered, receiver, queued
):
    settings.ENCRYPTION_KEYS = [OLD]
    hook, _ = webhooks.webhook_create(url=receiver.url, events=["alias.moved"], secret=SECRET, actor=admin.actor)
    under_old = raw_secret(hook.pk)
    assert Fernet(OLD.encode()).decrypt(under_old.encode()) == SECRET.encode()

    settings.ENCRYPTION_KEYS = [NEW, OLD]
    assert Webhook.objects.get(pk=hook.pk).secret == SECRET  # written under old, still read
    assert raw_secret(hook.pk) == under_old  # reading changes nothing

    out = io.StringIO()
    call_command("rotate_encryption_keys", stdout=out)

    assert out.getvalue() == "re-encrypted 1 secret under the first key (registry.Webhook.secret: 1)\n"
    under_new = raw_secret(hook.pk)
    assert Fernet(NEW.encode()).decrypt(under_new.encode()) == SECRET.encode()
    with pytest.raises(InvalidToken):
        Fernet(OLD.encode()).decrypt(under_new.encode())
    event = AuditEvent.objects.get(action="encryption.rotate")
    assert (event.actor, event.target_type, event.target) == ("system", "encryption_keys", "MODELYARD_ENCRYPTION_KEYS")
    assert event.after == {"reencrypted": {"registry.Webhook.secret": 1}}
    assert SECRET not in str(event.after) and SECRET not in str(event.before)

    settings.ENCRYPTION_KEYS = [NEW]  # the old key removed: everything still reads, deliveries still sign
    assert Webhook.objects.get(pk=hook.pk).secret == SECRET
    delivery_id = send_one_event(RegisteredModel.objects.get(name=registered), queued)
    assert webhooks.delivery_attempt(delivery_id=delivery_id) == "delivered"
    assert receiver.received[0].signature_ok(SECRET)


@pytest.mark.django_db(transaction=True)
def test_a_secret_no_key_decrypts_fails_its_deliveries_and_stops_the_rotation_unchanged(
    settings, admin, registered, receiver, queued
):
    settings.ENCRYPTION_KEYS = [OLD]
    hook, _ = webhooks.webhook_create(url=receiver.url, events=["alias.moved"], secret=SECRET, actor=admin.actor)
    stored = raw_secret(hook.pk)
    settings.ENCRYPTION_KEYS = [NEW]  # the key it was written with is gone

    # Listing, reading and emitting do not need the secret, so they keep working.
    assert admin.get("/api/v1/webhooks").status_code == 200
    assert admin.get(f"/api/v1/webhooks/{hook.pk}").status_code == 200
    delivery_id = send_one_event(RegisteredModel.objects.get(name=registered), queued)
    assert webhooks.delivery_attempt(delivery_id=delivery_id) == "failed"
    delivery = WebhookDelivery.objects.get(pk=delivery_id)
    assert (delivery.status, delivery.last_error) == (
        DeliveryStatus.PENDING,  # retried later: the key may come back
        "a stored secret cannot be decrypted with any key in MODELYARD_ENCRYPTION_KEYS "
        "(was the key it was written with removed?)",
    )
    assert receiver.received == []

    with pytest.raises(CommandError, match=r"^nothing was changed: a stored secret cannot be decrypted"):
        call_command("rotate_encryption_keys", stdout=io.StringIO())
    assert raw_secret(hook.pk) == stored
    assert not AuditEvent.objects.filter(action="encryption.rotate").exists()

    # Changing other fields neither needs the secret nor rewrites it.
    renamed = admin.patch(f"/api/v1/webhooks/{hook.pk}", {"url": receiver.url + "/moved"})
    assert renamed.status_code == 200, renamed.content
    assert raw_secret(hook.pk) == stored
    # A new secret through the API replaces it under the current key.
    changed = admin.patch(f"/api/v1/webhooks/{hook.pk}", {"secret": "a-brand-new-secret-0123"})
    assert changed.status_code == 200, changed.content
    assert Webhook.objects.get(pk=hook.pk).secret == "a-brand-new-secret-0123"


def migrate(targets: list[tuple[str, str]]) -> Any:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.fixture
def _back_to_the_latest_migrations() -> Any:
    yield
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("_back_to_the_latest_migrations")
def test_the_migration_encrypts_plaintext_secrets_and_its_reverse_decrypts_them():
    old = migrate([("registry", "0021_token_scopes")])
    hook = old.get_model("registry", "Webhook").objects.create(
        url="https://hooks.example.com/h", secret=SECRET, events=["alias.moved"]
    )
    empty = old.get_model("registry", "Webhook").objects.create(url="https://hooks.example.com/e", secret="", events=[])
    assert raw_secret(hook.pk) == SECRET

    migrate([("registry", "0022_encrypted_secrets")])

    stored = raw_secret(hook.pk)
    assert stored.startswith("gAAAAA")
    assert crypto.decrypt(stored) == SECRET
    assert raw_secret(empty.pk) == ""

    migrate([("registry", "0021_token_scopes")])

    assert (raw_secret(hook.pk), raw_secret(empty.pk)) == (SECRET, "")


# --- Keys from the settings --------------------------------------------------------------------------


def run_python(tmp_path: Path, code: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {"MODELYARD_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", **extra}
    setup = "import os; os.environ['DJANGO_SETTINGS_MODULE']='modelyard.settings'; import django; django.setup(); "
    return subprocess.run(
        [sys.executable, "-c", setup + code], env=env, capture_output=True, text=True, timeout=120, cwd=Path.cwd()
    )


def test_embedded_mode_generates_one_key_into_the_data_folder(tmp_path):
    code = "from django.conf import settings; print(settings.ENCRYPTION_KEYS, settings.ENCRYPTION_KEYS_SOURCE)"
    first = run_python(tmp_path, code)
    second = run_python(tmp_path, code)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    key = (tmp_path / "encryption-key").read_text()
    assert first.stdout == f"['{key}'] {tmp_path / 'encryption-key'}\n"
    assert Fernet(key.encode())  # a real Fernet key
    assert stat.S_IMODE((tmp_path / "encryption-key").stat().st_mode) == 0o600


def test_keys_from_the_environment_first_encrypts_and_all_decrypt(tmp_path):
    code = (
        "from cryptography.fernet import Fernet; from modelyard import crypto; "
        f"token = crypto.encrypt('x'); print(Fernet({NEW!r}.encode()).decrypt(token.encode()).decode()); "
        f"print(crypto.decrypt(Fernet({OLD!r}.encode()).encrypt(b'y').decode()))"
    )
    result = run_python(tmp_path, code, MODELYARD_ENCRYPTION_KEYS=f" {NEW} , {OLD} ")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "x\ny\n"
    assert not (tmp_path / "encryption-key").exists()


@pytest.mark.parametrize(
    ("value", "error"),
    [
        # {NEW} is filled in by the test: test ids must be the same in every xdist worker, and NEW is random.
        ("{NEW},not-a-key", "MODELYARD_ENCRYPTION_KEYS: key 2 of 2 is not a Fernet key"),
        ("{NEW_CUT}", "MODELYARD_ENCRYPTION_KEYS: key 1 of 1 is not a Fernet key"),
        (
            " , ",
            "MODELYARD_ENCRYPTION_KEYS: no key given; expected comma-separated Fernet keys, the first one encrypting",
        ),
        ("REPLACE-ME-with-a-Fernet-key", "MODELYARD_ENCRYPTION_KEYS: still the example Secret's placeholder"),
    ],
)
def test_a_malformed_key_stops_startup_with_a_clear_error_that_does_not_show_the_keys(tmp_path, value, error):
    value = value.replace("{NEW_CUT}", NEW[:-2]).replace("{NEW}", NEW)
    result = run_python(tmp_path, "print('started')", MODELYARD_ENCRYPTION_KEYS=value)
    assert result.returncode != 0
    assert "django.core.exceptions.ImproperlyConfigured: " + error in result.stderr
    assert NEW not in result.stderr and "not-a-key" not in result.stderr
