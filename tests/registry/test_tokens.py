"""API tokens: hashed at rest, shown once, revocable, and the createtoken and revoketoken commands."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from datetime import datetime, timedelta

import pytest

from registry.access import services
from registry.access.auth import bearer_token
from registry.audit.chain import SYSTEM
from registry.errors import InvalidInput, NotFound
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
    with pytest.raises(InvalidInput, match="unknown role"):
        services.token_create(username="ann", create_user=True, roles=["wizard"], actor=SYSTEM)
    with pytest.raises(NotFound, match="no user named 'bob'"):
        services.token_create(username="bob", actor=SYSTEM)


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer my_abc_secret", "my_abc_secret"),
        ("bearer   my_abc_secret  ", "my_abc_secret"),
        ("BEARER my_abc_secret", "my_abc_secret"),
        ("Bearer", ""),  # the scheme with no token: refused as a bad token, not ignored
        ("Basic dXNlcjpwYXNz", None),
        ("", None),
        ("Token my_abc_secret", None),
    ],
)
def test_one_parser_reads_the_bearer_header(header, token):
    assert bearer_token(header) == token


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
    assert refused.stderr.strip().splitlines()[-1] == (
        "modelyard createtoken: no user named 'dave' (pass --create-user to create it)"
    )


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modelyard.cli", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_createtoken_expires_days_and_revoketoken_commands(tmp_path):
    env = {"MODELYARD_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    created = _cli(env, "createtoken", "erin", "--create-user", "--expires-days", "7")
    assert created.returncode == 0, created.stderr
    raw = created.stdout.strip().splitlines()[-1]
    prefix = raw.split("_")[1]
    assert ", expires " in created.stderr
    with sqlite3.connect(tmp_path / "modelyard.sqlite3") as db:
        created_at, expires_at = db.execute(
            "SELECT created_at, expires_at FROM registry_apitoken WHERE prefix = ?", (prefix,)
        ).fetchone()
    lifetime = datetime.fromisoformat(expires_at) - datetime.fromisoformat(created_at)
    assert timedelta(days=7) - timedelta(seconds=5) < lifetime <= timedelta(days=7)

    revoked = _cli(env, "revoketoken", prefix)
    assert (revoked.returncode, revoked.stdout.strip()) == (0, f"Revoked token {prefix} of erin.")
    again = _cli(env, "revoketoken", prefix)
    assert again.returncode == 0
    assert again.stdout.startswith(f"Token {prefix} of erin was already revoked at ")
    with sqlite3.connect(tmp_path / "modelyard.sqlite3") as db:
        assert db.execute("SELECT revoked_at IS NOT NULL FROM registry_apitoken WHERE prefix = ?", (prefix,)).fetchone()
        events = db.execute("SELECT actor, target FROM registry_auditevent WHERE action = 'token.revoke'").fetchall()
    assert events == [("system", prefix)]

    unknown = _cli(env, "revoketoken", "feedbeef")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "modelyard revoketoken: no API token with prefix 'feedbeef'"
    bad = _cli(env, "createtoken", "erin", "--expires-days", "0")
    assert bad.returncode == 2
    assert "expected a whole number of days of at least 1, got '0'" in bad.stderr
