"""The client's TLS files without a server: where ``ca_bundle``, ``client_cert`` and ``client_key`` come from."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.client import Client, ConfigError, read_profiles, save_profile
from modelyard.client.config import resolve

VARIABLES = ("MODELYARD_CA_BUNDLE", "MODELYARD_CLIENT_CERT", "MODELYARD_CLIENT_KEY")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("MODELYARD_URL", "MODELYARD_TOKEN", "MODELYARD_PROFILE", "REQUESTS_CA_BUNDLE", *VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name in ("ca.pem", "env-ca.pem", "arg-ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("-----BEGIN CERTIFICATE-----\n")
    return tmp_path


def test_a_profile_keeps_its_tls_files_as_absolute_paths(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(home)
    save_profile("default", url="https://a:1", token="t", tls={"ca_bundle": "ca.pem", "client_cert": None})
    assert read_profiles()["default"] == {"url": "https://a:1", "token": "t", "ca_bundle": str(home / "ca.pem")}
    assert resolve().tls == {"ca_bundle": str(home / "ca.pem")}
    assert Client().tls == {"verify": str(home / "ca.pem")}


def test_arguments_then_environment_then_the_default_profile(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_profile("default", url="https://a:1", token="t", tls={"ca_bundle": str(home / "ca.pem")})
    monkeypatch.setenv("MODELYARD_CA_BUNDLE", str(home / "env-ca.pem"))
    assert Client().tls == {"verify": str(home / "env-ca.pem")}
    assert Client(ca_bundle=home / "arg-ca.pem").tls == {"verify": str(home / "arg-ca.pem")}
    # A profile named explicitly wins over the environment, as for its URL and token.
    assert Client(profile="default").tls == {"verify": str(home / "ca.pem")}


def test_client_certificate_and_key_go_together(home: Path) -> None:
    client = Client("https://a:1", client_cert=home / "cert.pem", client_key=home / "key.pem")
    assert client.tls == {"cert": (str(home / "cert.pem"), str(home / "key.pem"))}
    with pytest.raises(ConfigError) as alone:
        Client("https://a:1", client_key=home / "key.pem")
    assert str(alone.value) == (
        "--client-key (MODELYARD_CLIENT_KEY) goes with --client-cert CERT.pem (MODELYARD_CLIENT_CERT)"
    )


def test_a_file_that_does_not_exist_is_a_config_error_naming_it(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as missing:
        Client("https://a:1", ca_bundle=home / "nope.pem")
    assert str(missing.value) == f"--ca-bundle (MODELYARD_CA_BUNDLE) {home / 'nope.pem'}: no such file"
    monkeypatch.setenv("MODELYARD_CLIENT_CERT", str(home / "gone.pem"))
    with pytest.raises(ConfigError) as gone:
        Client("https://a:1")
    assert str(gone.value) == f"--client-cert (MODELYARD_CLIENT_CERT) {home / 'gone.pem'}: no such file"
