"""Configuration from the environment: defaults, URL parsing, and errors that name the variable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from modelyard.env import (
    StorageConfig,
    cache_from_url,
    database_from_url,
    env_bool,
    env_int,
    env_rate,
    parse_rate,
    storage_from_url,
)


def test_postgres_url():
    db = database_from_url("X", "postgres://u:p%40ss@db.example:6543/reg?sslmode=require")
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["NAME"], db["USER"], db["PASSWORD"], db["HOST"], db["PORT"]) == (
        "reg",
        "u",
        "p@ss",
        "db.example",
        "6543",
    )
    assert db["OPTIONS"] == {"sslmode": "require"}


def test_sqlite_url():
    assert database_from_url("X", "sqlite:////var/lib/m.db")["NAME"] == "/var/lib/m.db"


@pytest.mark.parametrize("url", ["mysql://x/y", "postgres://host", "sqlite://"])
def test_bad_database_url_names_the_variable(url):
    with pytest.raises(ImproperlyConfigured, match=r"^MODELYARD_DATABASE_URL: "):
        database_from_url("MODELYARD_DATABASE_URL", url)


def test_storage_urls():
    assert storage_from_url("X", "file:///srv/a") == StorageConfig(kind="file", path="/srv/a")
    assert storage_from_url("X", "s3://bkt/some/prefix/") == StorageConfig(
        kind="s3", bucket="bkt", prefix="some/prefix"
    )
    with pytest.raises(ImproperlyConfigured, match=r"^MODELYARD_STORAGE_URL: "):
        storage_from_url("MODELYARD_STORAGE_URL", "gs://x")


def test_bool_and_int(monkeypatch):
    monkeypatch.setenv("FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured, match=r"^FLAG: expected true or false"):
        env_bool("FLAG", False)
    monkeypatch.setenv("NUM", "12x")
    with pytest.raises(ImproperlyConfigured, match=r"^NUM: expected an integer"):
        env_int("NUM", 1)


def test_bad_value_fails_at_startup_naming_the_variable(tmp_path):
    env = {**os.environ, "MODELYARD_DATA_DIR": str(tmp_path), "MODELYARD_MAX_UPLOAD_BYTES": "lots"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [sys.executable, "-m", "modelyard.cli", "manage", "check"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "MODELYARD_MAX_UPLOAD_BYTES: expected an integer, got 'lots'" in result.stderr


def test_embedded_default_generates_secret_once(tmp_path):
    env = {"MODELYARD_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    code = "from django.conf import settings; import django; django.setup(); print(settings.SECRET_KEY)"
    run = [sys.executable, "-c", f"import os; os.environ['DJANGO_SETTINGS_MODULE']='modelyard.settings'; {code}"]
    first = subprocess.run(run, env=env, capture_output=True, text=True, check=True, timeout=120).stdout
    second = subprocess.run(run, env=env, capture_output=True, text=True, check=True, timeout=120).stdout
    assert first == second and len(first.strip()) >= 50
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600


def test_rates(monkeypatch):
    assert parse_rate("1200/min") == (1200, 60)
    assert parse_rate("5/second") == (5, 1)
    assert parse_rate("off") is None
    monkeypatch.setenv("MODELYARD_API_RATE_USER", "OFF")
    assert env_rate("MODELYARD_API_RATE_USER", "1200/min") is None
    monkeypatch.delenv("MODELYARD_API_RATE_USER")
    assert env_rate("MODELYARD_API_RATE_USER", "1200/min") == "1200/min"
    for bad in ("lots", "10/fortnight", "0/min", "-1/s", "1.5/min"):
        monkeypatch.setenv("MODELYARD_API_RATE_ANON", bad)
        with pytest.raises(ImproperlyConfigured, match=r"^MODELYARD_API_RATE_ANON: expected a rate such as 120/min"):
            env_rate("MODELYARD_API_RATE_ANON", "120/min")


def test_cache_urls():
    assert cache_from_url("X", None)["default"]["BACKEND"] == "django.core.cache.backends.locmem.LocMemCache"
    redis = cache_from_url("X", "redis://cache:6379/2")["default"]
    assert (redis["BACKEND"], redis["LOCATION"]) == (
        "django.core.cache.backends.redis.RedisCache",
        "redis://cache:6379/2",
    )
    with pytest.raises(ImproperlyConfigured, match=r"^MODELYARD_CACHE_URL: expected a redis://"):
        cache_from_url("MODELYARD_CACHE_URL", "memcached://x")


@pytest.mark.parametrize(
    ("extra", "backend"),
    [
        ({}, "LocMemCache"),
        ({"MODELYARD_BROKER_URL": "amqp://guest@127.0.0.1//"}, "LocMemCache"),
        ({"MODELYARD_BROKER_URL": "redis://127.0.0.1:6379/3"}, "RedisCache redis://127.0.0.1:6379/3"),
        ({"MODELYARD_CACHE_URL": "redis://127.0.0.1:6379/4"}, "RedisCache redis://127.0.0.1:6379/4"),
    ],
)
def test_throttle_counters_go_to_redis_when_one_is_configured(tmp_path, extra, backend):
    env = {"MODELYARD_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", **extra}
    code = (
        "import django; django.setup(); from django.conf import settings; c = settings.CACHES['default']; "
        "print(c['BACKEND'].rsplit('.', 1)[1], c.get('LOCATION', '') if 'Redis' in c['BACKEND'] else '')"
    )
    run = [sys.executable, "-c", f"import os; os.environ['DJANGO_SETTINGS_MODULE']='modelyard.settings'; {code}"]
    assert (
        subprocess.run(run, env=env, capture_output=True, text=True, check=True, timeout=120).stdout.strip() == backend
    )


def _pem(key) -> str:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def test_a_signing_key_that_cannot_sign_is_refused_naming_the_variable(monkeypatch, tmp_path):
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    from modelyard.env import env_signing_key
    from modelyard.provenance import Signer, generate_private_key

    default = tmp_path / "signing-key.pem"
    cases = [
        (_pem(rsa.generate_private_key(65537, 2048)), "it is not an elliptic-curve key (curves: secp256r1, secp384r1"),
        (_pem(ec.generate_private_key(ec.SECP256K1())), "Unsupported key for curve 'secp256k1' (curves: secp256r1"),
        ("-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n", "cannot sign with this key: "),
    ]
    for pem, message in cases:
        monkeypatch.setenv("MODELYARD_SIGNING_KEY", pem)
        with pytest.raises(ImproperlyConfigured) as caught:
            env_signing_key("MODELYARD_SIGNING_KEY", default)
        assert str(caught.value).startswith("MODELYARD_SIGNING_KEY: cannot sign with this key: ")
        assert message in str(caught.value)
    # A good key passes the same check, and the Signer that the check stands in for signs with it.
    good = generate_private_key()
    monkeypatch.setenv("MODELYARD_SIGNING_KEY", good.decode())
    assert env_signing_key("MODELYARD_SIGNING_KEY", default) == (good, "MODELYARD_SIGNING_KEY")
    assert Signer(good).sign({"model.onnx": "0" * 64}).startswith(b"{")
