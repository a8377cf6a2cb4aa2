"""API tokens: hashed at rest, shown once, revocable, and the createtoken command."""

from __future__ import annotations

import subprocess
import sys

import pytest

from registry import services
from registry.audit import SYSTEM
from registry.models import ApiToken, AuditEvent

pytestmark = pytest.mark.django_db


def test_token_is_stored_hashed():
    token, raw = services.token_create(username="ann", create_user=True, roles=["maintainer"], actor=SYSTEM)
    assert raw.startswith(f"my_{token.prefix}_")
    assert token.key_hash == ApiToken.hash_key(raw)
    assert raw not in {token.key_hash, token.prefix}
    assert list(AuditEvent.objects.values_list("action", flat=True)) == [
        "user.create",
        "user.roles.grant",
        "token.create",
    ]


def test_revoked_token_is_refused(client):
    token, raw = services.token_create(username="ann", create_user=True, roles=["viewer"], actor=SYSTEM)
    assert client.get("/api/v1/models", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200
    services.token_revoke(token=token, actor=SYSTEM)
    assert client.get("/api/v1/models", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 401


def test_tampered_secret_is_refused(client):
    _, raw = services.token_create(username="ann", create_user=True, actor=SYSTEM)
    assert client.get("/api/v1/models", HTTP_AUTHORIZATION=f"Bearer {raw[:-1]}x").status_code == 401


def test_unknown_role_and_missing_user_are_refused():
    with pytest.raises(ValueError, match="unknown role"):
        services.token_create(username="ann", create_user=True, roles=["wizard"], actor=SYSTEM)
    with pytest.raises(ValueError, match="no user named 'bob'"):
        services.token_create(username="bob", actor=SYSTEM)


def test_createtoken_command_prints_token_as_last_line(tmp_path):
    env = {"MODELYARD_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "modelyard.cli", "createtoken", "carol", "--create-user", "--role", "admin"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("my_")
    refused = subprocess.run(
        [sys.executable, "-m", "modelyard.cli", "createtoken", "dave"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2
    assert "no user named 'dave'" in refused.stderr
