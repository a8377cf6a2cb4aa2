"""Typed helpers that read configuration from the environment.

Every helper names the variable in its error, so a bad value fails at start-up with a message
an operator can act on. ``NAME_FILE`` is accepted wherever a secret may be passed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str | None:
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        try:
            return Path(file_name).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE: cannot read {file_name}: {exc.strerror}") from exc
    value = os.environ.get(name)
    return default if value is None else value


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}: expected true or false, got {value!r}")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        number = int(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: expected an integer, got {value!r}") from exc
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}: must be at least {minimum}, got {number}")
    return number


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        number = float(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: expected a number, got {value!r}") from exc
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}: must be at least {minimum}, got {number}")
    return number


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(name, default).strip().lower()
    if value not in choices:
        raise ImproperlyConfigured(f"{name}: expected one of {', '.join(choices)}, got {value!r}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


_PERIODS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}


def env_rate(name: str) -> tuple[int, float] | None:
    """A rate like ``100/s``, ``6000/m`` or ``10000/h`` as (count, period in seconds); unset or empty is None."""
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    count, sep, unit = value.strip().partition("/")
    period = _PERIODS.get(unit.strip().lower())
    try:
        number = int(count.strip())
    except ValueError:
        number = 0
    if not sep or period is None or number < 1:
        raise ImproperlyConfigured(f"{name}: expected a rate like 100/s, 6000/m or 10000/h, got {value!r}")
    return number, period


def database_from_url(name: str, url: str) -> dict[str, object]:
    """Turn ``postgres://user:pass@host:port/db?opt=v`` or ``sqlite:///path`` into a DATABASES entry."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = unquote(parts.path)
        if parts.netloc or not path or path == "/":
            raise ImproperlyConfigured(f"{name}: a SQLite URL looks like sqlite:////absolute/path.db, got {url!r}")
        # sqlite:///rel.db -> "rel.db"; sqlite:////abs.db -> "/abs.db"
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": path[1:]}
    if parts.scheme in {"postgres", "postgresql", "pgsql"}:
        if not parts.path.strip("/"):
            raise ImproperlyConfigured(f"{name}: the PostgreSQL URL names no database: {url!r}")
        try:
            port = parts.port
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name}: bad port in {url!r}") from exc
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parts.path.lstrip("/")),
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(port or ""),
            "OPTIONS": dict(parse_qsl(parts.query)),
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }
    raise ImproperlyConfigured(f"{name}: expected a postgres:// or sqlite:/// URL, got scheme {parts.scheme!r}")


@dataclass(frozen=True)
class StorageConfig:
    """Where artifacts live: a local folder or an S3-compatible bucket and key prefix."""

    kind: str  # "file" or "s3"
    path: str = ""
    bucket: str = ""
    prefix: str = ""


def storage_from_url(name: str, url: str) -> StorageConfig:
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in {"", "localhost"} or not parts.path:
            raise ImproperlyConfigured(f"{name}: a folder URL looks like file:///absolute/path, got {url!r}")
        return StorageConfig(kind="file", path=unquote(parts.path))
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ImproperlyConfigured(f"{name}: an S3 URL looks like s3://bucket/prefix, got {url!r}")
        return StorageConfig(kind="s3", bucket=parts.netloc, prefix=parts.path.strip("/"))
    raise ImproperlyConfigured(f"{name}: expected file:///path or s3://bucket/prefix, got {url!r}")


def load_or_create_secret(path: Path) -> str:
    """Read the embedded secret key, generating it once with owner-only permissions."""
    from django.core.management.utils import get_random_secret_key

    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = get_random_secret_key()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process won the race
        return path.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(secret)
    return secret
