"""Typed helpers that read configuration from the environment.

Every helper names the variable in its error, so a bad value fails at start-up with a message
an operator can act on. ``NAME_FILE`` is accepted wherever a secret may be passed.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
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


def env_enum(name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``, matched without regard to case and returned in their spelling (``kSameAsRequested``)."""
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    spelled = {choice.lower(): choice for choice in choices}
    try:
        return spelled[value.strip().lower()]
    except KeyError:
        raise ImproperlyConfigured(f"{name}: expected one of {', '.join(choices)}, got {value!r}") from None


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def env_providers(name: str, default: list[str], known: tuple[str, ...]) -> list[str]:
    """ONNX Runtime execution providers in order: short names from ``known`` or full ``...ExecutionProvider`` names.

    A misspelt provider would otherwise be skipped as "not available" and the process would quietly
    serve on the CPU, so an unknown name stops start-up instead.
    """
    items = env_list(name, default)
    for item in items:
        if item.lower() not in known and not item.endswith("ExecutionProvider"):
            raise ImproperlyConfigured(
                f"{name}: unknown execution provider {item!r}; expected {', '.join(known)} or a full name such as "
                "CUDAExecutionProvider"
            )
    return items


_PERIODS = {
    "s": 1,
    "sec": 1,
    "second": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "h": 3600,
    "hour": 3600,
    "d": 86400,
    "day": 86400,
}
_OFF = {"off", "none", "0"}


def parse_rate(text: str) -> tuple[int, int] | None:
    """``"120/min"`` -> (120 requests, 60 seconds); ``"off"`` -> None. Raises ValueError on anything else."""
    cleaned = text.strip().lower()
    if cleaned in _OFF:
        return None
    count, sep, period = cleaned.partition("/")
    if not sep or not count.isdigit() or int(count) < 1 or period not in _PERIODS:
        raise ValueError(f"expected a rate such as 120/min (per s, min, hour or day) or off, got {text!r}")
    return int(count), _PERIODS[period]


def env_rate(name: str, default: str) -> str | None:
    """A request rate such as ``1200/min``; ``off`` disables it (None)."""
    value = os.environ.get(name)
    text = default if value is None or value.strip() == "" else value
    try:
        return None if parse_rate(text) is None else text.strip().lower()
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: {exc}") from exc


def cache_from_url(name: str, url: str | None) -> dict[str, dict[str, object]]:
    """Django's CACHES: Redis for ``redis://``, ``rediss://`` or ``unix://`` URLs, process memory otherwise.

    Only counters live here (API throttling), so a short socket timeout keeps a slow Redis from
    holding requests up; the throttle lets requests through when Redis does not answer.
    """
    if not url:
        return {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "modelyard"}}
    scheme = urlsplit(url).scheme
    if scheme not in {"redis", "rediss", "unix"}:
        raise ImproperlyConfigured(f"{name}: expected a redis://, rediss:// or unix:// URL, got scheme {scheme!r}")
    return {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": url,
            "KEY_PREFIX": "modelyard",
            "OPTIONS": {"socket_connect_timeout": 1.0, "socket_timeout": 1.0},
        }
    }


def redis_url(name: str, url: str | None) -> str | None:
    """``url`` (read from ``name``) if a ``redis://``, ``rediss://`` or ``unix://`` URL; None when unset."""
    if not url:
        return None
    scheme = urlsplit(url).scheme
    if scheme not in {"redis", "rediss", "unix"}:
        raise ImproperlyConfigured(f"{name}: expected a redis://, rediss:// or unix:// URL, got scheme {scheme!r}")
    return url


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def env_networks(name: str) -> tuple[IPNetwork, ...]:
    """Comma-separated IP addresses or CIDR blocks (``10.0.0.0/8, 2001:db8::/32``); unset means none."""
    networks = []
    for item in env_list(name, []):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name}: {item!r} is not an IP address or CIDR block") from exc
    return tuple(networks)


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


def load_or_create_secret(path: Path, generate: Callable[[], str] | None = None) -> str:
    """Read the embedded secret key, generating it once (``generate``) with owner-only permissions."""
    from django.core.management.utils import get_random_secret_key

    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = (generate or get_random_secret_key)()
    # Written whole under a private name, then linked into place: a process starting at the same
    # moment either finds no file or the complete key, never an empty file it would read as "".
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret)
    try:
        os.link(draft, path)
    except FileExistsError:  # another process won the race with a key that is complete
        return path.read_text().strip()
    finally:
        draft.unlink()
    return secret


def env_signing_key(name: str, default_path: Path) -> tuple[bytes, str]:
    """The registry's signing key (PEM) and where it came from: ``name`` holds PEM text or a file's path.

    Unset, the key at ``default_path`` (the data folder's) is read, generated there on first start.
    """
    from modelyard.provenance import ProvenanceError, check_signing_key, load_or_create_private_key

    value = env_str(name)
    if value is not None and "REPLACE-ME" in value:  # deploy/k8s/base/secret.example.yaml applied as it is
        raise ImproperlyConfigured(
            f"{name}: still the example Secret's placeholder; put a PEM key there "
            "(openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt)"
        )
    if value is None:
        pem, source = load_or_create_private_key(default_path), str(default_path)
    elif value.lstrip().startswith("-----BEGIN"):
        pem, source = value.encode(), name
    else:
        try:
            pem, source = Path(value).read_bytes(), value
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}: cannot read the key file {value}: {exc.strerror}") from None
    try:
        check_signing_key(pem)  # not Signer(pem): that imports model_signing, which only signing needs
    except ProvenanceError as exc:
        raise ImproperlyConfigured(f"{name}: {exc}") from None
    return pem, source


def env_encryption_keys(name: str, default_path: Path) -> tuple[list[str], str]:
    """Fernet keys for secrets stored encrypted (modelyard/crypto.py), and where they came from.

    ``name`` holds comma-separated keys, the first encrypting; unset, one key is read from ``default_path``
    (the data folder's), generated there on first start.
    """
    from modelyard.crypto import generate_key, parse_keys

    value = env_str(name)
    if value is not None and "REPLACE-ME" in value:  # deploy/k8s/base/secret.example.yaml applied as it is
        raise ImproperlyConfigured(
            f"{name}: still the example Secret's placeholder; put a Fernet key there "
            "(python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())')"
        )
    if value is None:
        text, source = load_or_create_secret(default_path, generate_key), str(default_path)
    else:
        text, source = value, name
    try:
        return parse_keys(text), source
    except ValueError as exc:
        raise ImproperlyConfigured(f"{source}: {exc}") from None


def env_pem_files(name: str) -> list[Path]:
    """``name``: comma-separated paths of PEM files, each readable (checked at start, not at first use)."""
    paths = [Path(part.strip()) for part in (env_str(name) or "").split(",") if part.strip()]
    for path in paths:
        if not path.is_file():
            raise ImproperlyConfigured(f"{name}: {path} is not a readable file")
    return paths


def env_signers(name: str) -> list[tuple[str, Path]]:
    """``name``: ``NAME=PATH,...``, each PATH a PEM public key or certificate chain."""
    from modelyard.provenance import parse_signers

    try:
        pairs = parse_signers(env_str(name) or "")
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: {exc}") from None
    for signer, path in pairs:
        if not path.is_file():
            raise ImproperlyConfigured(f"{name}: {signer}: {path} is not a readable file")
    return pairs
