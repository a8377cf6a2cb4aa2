"""Encryption at rest of the secrets the registry must read back (webhook secrets, and the like).

Keys are Fernet keys (AES-128-CBC with HMAC-SHA256, from ``cryptography``), listed in
``MODELYARD_ENCRYPTION_KEYS``: the first encrypts, every one decrypts (``MultiFernet``), so a key
is rotated by putting a new one first, running ``modelyard manage rotate_encryption_keys``, then
dropping the old one. Unset, a key is generated into the data folder on first start.

Use :func:`encrypt` / :func:`decrypt` directly, or declare a model field :class:`EncryptedTextField`:
its attribute holds the plain text, its column a Fernet token. API tokens are not stored this way:
they are kept as hashes only, since the registry never needs them back.
"""

from __future__ import annotations

import base64
import binascii
from functools import lru_cache
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.db import models


class SecretUnreadable(Exception):
    """A stored secret cannot be decrypted with any of the configured keys."""


def generate_key() -> str:
    """A new random Fernet key (44 characters of URL-safe base64)."""
    return Fernet.generate_key().decode()


def parse_keys(text: str) -> list[str]:
    """Comma-separated Fernet keys, checked; raises ValueError naming the bad one by position, never its value."""
    keys = [part.strip() for part in text.split(",") if part.strip()]
    if not keys:
        raise ValueError("no key given; expected comma-separated Fernet keys, the first one encrypting")
    for number, key in enumerate(keys, start=1):
        try:
            raw = base64.urlsafe_b64decode(key.encode("ascii"))
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raw = b""
        if len(raw) != 32 or len(key) != 44:
            raise ValueError(
                f"key {number} of {len(keys)} is not a Fernet key (32 bytes in URL-safe base64, 44 characters); "
                "make one with: python -c "
                "'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'"
            )
    return keys


@lru_cache(maxsize=8)
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(key.encode()) for key in keys])


def _configured() -> MultiFernet:
    from django.conf import settings

    return _fernet(tuple(settings.ENCRYPTION_KEYS))


def encrypt(plaintext: str) -> str:
    """A Fernet token of ``plaintext`` under the first configured key."""
    return _configured().encrypt(plaintext.encode()).decode()


def decrypt(token: str) -> str:
    """The plain text of a token made by :func:`encrypt` under any configured key."""
    try:
        return _configured().decrypt(token.encode()).decode()
    except InvalidToken:
        raise SecretUnreadable(
            "a stored secret cannot be decrypted with any key in MODELYARD_ENCRYPTION_KEYS "
            "(was the key it was written with removed?)"
        ) from None


class EncryptedTextField(models.TextField):
    """A text column whose value is stored encrypted (:func:`encrypt`) and read back in plain text.

    It cannot be searched or filtered on (each write gives a different token).
    """

    description = "Text encrypted at rest with MODELYARD_ENCRYPTION_KEYS"

    def from_db_value(self, value: str | None, expression: Any, connection: Any) -> str | None:
        if value is None or value == "":
            return value
        return decrypt(value)

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        if value is None or value == "":
            return value
        return encrypt(str(value))


def encrypted_fields() -> list[tuple[type[models.Model], EncryptedTextField]]:
    """Every (model, field) of the installed apps that is stored encrypted, for key rotation."""
    from django.apps import apps

    return [
        (model, field)
        for model in apps.get_models()
        for field in model._meta.concrete_fields
        if isinstance(field, EncryptedTextField)
    ]
