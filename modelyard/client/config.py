"""Where the client finds its server and token: arguments, then ``MODELYARD_URL``/``MODELYARD_TOKEN``, then a profile.

Profiles live in ``$XDG_CONFIG_HOME/modelyard/config.toml`` (``~/.config/modelyard/config.toml``), one
table per profile, written by ``modelyard login`` with mode 600 since they hold API tokens::

    [default]
    url = "http://127.0.0.1:8000"
    token = "my_..."

    [bob]
    url = "http://127.0.0.1:8000"
    token = "my_..."

The profile is the one named (``--profile``, ``Client(profile=...)``, else ``MODELYARD_PROFILE``, else
``default``). A profile named explicitly wins over the environment, so that ``--profile bob`` acts
as bob even where ``MODELYARD_TOKEN`` holds someone else's token.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from modelyard.client.errors import ConfigError

PROFILE_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DEFAULT_PROFILE = "default"
# What a profile may hold besides url and token: the files for HTTPS (``modelyard login --ca-bundle ...``).
TLS_KEYS = ("ca_bundle", "client_cert", "client_key")
TLS_VARIABLES = {
    "ca_bundle": "MODELYARD_CA_BUNDLE",
    "client_cert": "MODELYARD_CLIENT_CERT",
    "client_key": "MODELYARD_CLIENT_KEY",
}


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "modelyard" / "config.toml"


def read_profiles(path: Path | None = None) -> dict[str, dict[str, str]]:
    """Every saved profile; none when the file does not exist."""
    path = path or config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    return {
        name: {key: str(value) for key, value in table.items() if key in ("url", "token", *TLS_KEYS)}
        for name, table in data.items()
        if isinstance(table, dict)
    }


def save_profile(
    name: str, *, url: str, token: str, path: Path | None = None, tls: Mapping[str, str | None] | None = None
) -> Path:
    """Add or replace one profile, keeping the others; the file is replaced whole and is readable by its owner only.

    ``tls``: the profile's ``ca_bundle``, ``client_cert`` and ``client_key`` (saved as absolute paths).
    """
    if not PROFILE_PATTERN.match(name):
        raise ConfigError(f"invalid profile name {name!r}: use letters, digits, '_' or '-'")
    path = path or config_path()
    profiles = read_profiles(path)
    files = {key: os.path.abspath(value) for key, value in (tls or {}).items() if key in TLS_KEYS and value}
    profiles[name] = {"url": url, "token": token, **files}
    lines = ["# Written by `modelyard login`. It holds API tokens: keep it private (mode 600)."]
    for profile, values in profiles.items():
        lines.append(f"\n[{profile}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    # Created with mode 600 from the first byte; os.replace then swaps it in whole.
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join(lines) + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.chmod(draft, 0o600)  # in case the file existed with wider permissions
    os.replace(draft, path)
    return path


@dataclass(frozen=True)
class Target:
    """The server and token a client uses, and where they came from."""

    url: str
    token: str | None
    profile: str | None  # the profile that supplied something, if any
    tls: dict[str, str] = field(default_factory=dict)  # ca_bundle, client_cert, client_key: those set


def resolve(
    url: str | None = None,
    token: str | None = None,
    profile: str | None = None,
    tls: Mapping[str, str | os.PathLike[str] | None] | None = None,
) -> Target:
    """Arguments first; then a profile named explicitly; then the environment; then the default profile.

    The same for each of ``tls``'s files (``ca_bundle``, ``client_cert``, ``client_key``) and their variables.
    """
    named = profile or None
    profiles = read_profiles() if named or not (url and token) else {}
    if named is not None and named not in profiles:
        hint = f"create it with `modelyard login URL --profile {named}`"
        raise ConfigError(f"no profile '{named}' in {config_path()}; {hint}")
    if named is None:
        named = os.environ.get("MODELYARD_PROFILE") or DEFAULT_PROFILE
        if named != DEFAULT_PROFILE and named not in profiles:
            raise ConfigError(f"MODELYARD_PROFILE names no profile '{named}' in {config_path()}")
        saved = profiles.get(named, {})
        url = url or os.environ.get("MODELYARD_URL") or saved.get("url")
        token = token or os.environ.get("MODELYARD_TOKEN") or saved.get("token")
    else:
        saved = profiles[named]
        url = url or saved.get("url") or os.environ.get("MODELYARD_URL")
        token = token or saved.get("token") or os.environ.get("MODELYARD_TOKEN")
    if not url:
        raise ConfigError("no server: pass --url, set MODELYARD_URL, or save a profile with `modelyard login URL`")
    files: dict[str, str] = {}
    for key in TLS_KEYS:
        given = (tls or {}).get(key)
        environment = os.environ.get(TLS_VARIABLES[key])
        explicit = profile is not None
        value = given or (saved.get(key) or environment if explicit else environment or saved.get(key))
        if value:
            files[key] = os.fspath(value)
    return Target(url=url.rstrip("/"), token=token or None, profile=named if saved else None, tls=files)
