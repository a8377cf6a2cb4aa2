"""Webhook secrets are stored encrypted (modelyard/crypto.py, MODELYARD_ENCRYPTION_KEYS).

The column is widened to text (a Fernet token is longer than its plain text), the secrets already
there are encrypted under the first key, then the field becomes an EncryptedTextField (no change to
the column). Reversed, the secrets are decrypted back into a column of 200 characters.
"""

from typing import Any

from django.db import migrations, models

import modelyard.crypto


def encrypt_secrets(apps: Any, schema_editor: Any) -> None:
    from modelyard.crypto import encrypt

    Webhook = apps.get_model("registry", "Webhook")  # the field is plain text at this step, every secret too
    for pk, secret in Webhook.objects.values_list("pk", "secret"):
        if secret:
            Webhook.objects.filter(pk=pk).update(secret=encrypt(secret))


def decrypt_secrets(apps: Any, schema_editor: Any) -> None:
    from modelyard.crypto import decrypt

    Webhook = apps.get_model("registry", "Webhook")  # plain text again at this step: the column holds tokens
    for pk, secret in Webhook.objects.values_list("pk", "secret"):
        if secret:
            Webhook.objects.filter(pk=pk).update(secret=decrypt(secret))


class Migration(migrations.Migration):
    dependencies = [("registry", "0021_token_scopes")]

    operations = [
        migrations.AlterField(model_name="webhook", name="secret", field=models.TextField()),
        migrations.RunPython(encrypt_secrets, decrypt_secrets, elidable=False),
        migrations.AlterField(model_name="webhook", name="secret", field=modelyard.crypto.EncryptedTextField()),
    ]
