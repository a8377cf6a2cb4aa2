"""TLS of ``modelyard serve``: the certificate, key and client CA its HTTP and gRPC listeners share.

``modelyard serve`` checks them with :func:`server_tls` before it starts anything, so a missing
file, a key of another certificate or an option given without its partner stops the start with
a message naming the option. The worker processes read the same files again (``modelyard.asgi``,
for gRPC's credentials). Standard library only: the CLI imports it before Django is set up.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

# `serve`'s option and the environment variable it defaults to, for each file.
CERTFILE = ("--ssl-certfile", "MODELYARD_SSL_CERTFILE")
KEYFILE = ("--ssl-keyfile", "MODELYARD_SSL_KEYFILE")
CA_CERTS = ("--ssl-ca-certs", "MODELYARD_SSL_CA_CERTS")


class TLSConfigError(ValueError):
    """A TLS option that cannot be used; the message names it."""


class _Encrypted(Exception):
    """OpenSSL asked for the key's passphrase."""


def _refuse_passphrase() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal, which a server (or a worker process) never has.
    raise _Encrypted


@dataclass(frozen=True)
class ServerTLS:
    """The PEM bytes of a server's certificate (chain), its key, and the CAs its callers' certificates must chain to."""

    certfile: str
    keyfile: str
    ca_certs: str | None
    certificate_chain: bytes
    private_key: bytes
    client_ca: bytes | None

    @property
    def client_certificates_required(self) -> bool:
        return self.client_ca is not None


def _read(path: str, option: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise TLSConfigError(f"{option} {path}: no such file") from None
    except IsADirectoryError:
        raise TLSConfigError(f"{option} {path}: is a folder, not a PEM file") from None
    except OSError as exc:
        raise TLSConfigError(f"{option} {path}: cannot be read ({exc.strerror or exc})") from None


def server_tls(
    certfile: str | None,
    keyfile: str | None,
    ca_certs: str | None,
    *,
    names: tuple[str, str, str] = (CERTFILE[0], KEYFILE[0], CA_CERTS[0]),
) -> ServerTLS | None:
    """The checked TLS set-up, or None when no option is given. Raises :class:`TLSConfigError`.

    ``names`` are the options' names in messages (``--ssl-certfile``, or ``MODELYARD_SSL_CERTFILE`` when
    the value came from the environment).
    """
    cert_name, key_name, ca_name = names
    if not (certfile or keyfile or ca_certs):
        return None
    if ca_certs and not certfile:
        raise TLSConfigError(f"{ca_name} (client certificates) needs {cert_name} CERT.pem and {key_name} KEY.pem")
    if certfile and not keyfile:
        raise TLSConfigError(f"{cert_name} goes with {key_name} KEY.pem (the certificate's private key)")
    if keyfile and not certfile:
        raise TLSConfigError(f"{key_name} goes with {cert_name} CERT.pem (the key's certificate)")
    assert certfile and keyfile
    chain = _read(certfile, cert_name)
    key = _read(keyfile, key_name)
    if b"-----BEGIN CERTIFICATE-----" not in chain:
        raise TLSConfigError(f"{cert_name} {certfile}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    if b"PRIVATE KEY-----" not in key:
        raise TLSConfigError(f"{key_name} {keyfile}: holds no PEM private key (-----BEGIN PRIVATE KEY-----)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile, keyfile, password=_refuse_passphrase)
    except _Encrypted:
        raise TLSConfigError(
            f"{key_name} {keyfile}: the key is encrypted; give it unencrypted (readable by the server's user only)"
        ) from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise TLSConfigError(
                f"{key_name} {keyfile} is not the private key of the certificate in {cert_name} {certfile}"
            ) from None
        raise TLSConfigError(
            f"{cert_name} {certfile} with {key_name} {keyfile}: not a usable certificate and key ({exc.reason or exc})"
        ) from None
    client_ca = None
    if ca_certs:
        client_ca = _read(ca_certs, ca_name)
        if b"-----BEGIN CERTIFICATE-----" not in client_ca:
            raise TLSConfigError(f"{ca_name} {ca_certs}: holds no PEM CA certificate (-----BEGIN CERTIFICATE-----)")
        try:
            context.load_verify_locations(cafile=ca_certs)
        except ssl.SSLError as exc:
            raise TLSConfigError(f"{ca_name} {ca_certs}: not a usable CA certificate ({exc.reason or exc})") from None
    return ServerTLS(
        certfile=certfile,
        keyfile=keyfile,
        ca_certs=ca_certs or None,
        certificate_chain=chain,
        private_key=key,
        client_ca=client_ca,
    )
