"""``modelyard manage rotate_encryption_keys``: encrypt every stored secret again under the first key.

After a new key is put first in MODELYARD_ENCRYPTION_KEYS (the old ones after it), this rewrites every
encrypted column (modelyard/crypto.py: EncryptedTextField) under the new key, in one transaction with
one audit event (``encryption.rotate``, with the count per field); then the old keys can be removed.
A secret that no configured key decrypts stops it, and nothing is changed.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from modelyard.crypto import SecretUnreadable, encrypted_fields
from registry.audit.chain import SYSTEM, audit_record


class Command(BaseCommand):
    help = "Encrypt every stored secret again under the first key of MODELYARD_ENCRYPTION_KEYS."

    def handle(self, *args: Any, **options: Any) -> None:
        counts: dict[str, int] = {}
        try:
            with transaction.atomic(durable=True):
                for model, field in encrypted_fields():
                    manager = model._base_manager
                    # Read through the field (decrypted with whichever key fits), written back through it
                    # (encrypted under the first key); the rows stay locked until the end.
                    rows = manager.select_for_update().values_list("pk", field.attname).order_by("pk")
                    changed = 0
                    for pk, plaintext in rows:
                        if plaintext:
                            manager.filter(pk=pk).update(**{field.attname: plaintext})
                            changed += 1
                    counts[f"{model._meta.label}.{field.name}"] = changed
                audit_record(
                    actor=SYSTEM,
                    action="encryption.rotate",
                    target_type="encryption_keys",
                    target="MODELYARD_ENCRYPTION_KEYS",
                    after={"reencrypted": counts},
                )
        except SecretUnreadable as exc:
            raise CommandError(f"nothing was changed: {exc}", returncode=1) from None
        detail = ", ".join(f"{label}: {count}" for label, count in counts.items()) or "no encrypted fields"
        total = sum(counts.values())
        self.stdout.write(f"re-encrypted {total} secret{'' if total == 1 else 's'} under the first key ({detail})")
