"""Certificates made in the test with ``cryptography``: a root CA, a server certificate for 127.0.0.1, a client's.

Written as PEM files into a folder; nothing is read from the machine's trust store.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Key = ec.EllipticCurvePrivateKey


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _ca(common_name: str) -> tuple[Key, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (
        _builder(common_name, _name(common_name), key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, certificate


def _leaf(common_name: str, ca_key: Key, ca: x509.Certificate, *, server: bool) -> tuple[Key, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(common_name, ca.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    return key, builder.sign(ca_key, hashes.SHA256())


def _write_key(path: Path, key: Key) -> Path:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)
    return path


def _write_cert(path: Path, *certificates: x509.Certificate) -> Path:
    path.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates))
    return path


@dataclass(frozen=True)
class Chain:
    """PEM files: the root CA, the server's certificate (127.0.0.1) and key, a client's, and a stranger CA's."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # signed nothing here: trusting it alone must not trust the server
    other_key: Path  # a key of no certificate here

    def context(self, *, client: bool = False) -> ssl.SSLContext:
        """A client's TLS context trusting the test's CA (and presenting the client certificate)."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if client:
            context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


def make_chain(folder: Path) -> Chain:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca = _ca("Modelyard test root CA")
    server_key, server = _leaf("127.0.0.1", ca_key, ca, server=True)
    client_key, client = _leaf("inference caller", ca_key, ca, server=False)
    other_key, other = _ca("Another CA")
    return Chain(
        ca=_write_cert(folder / "ca.pem", ca),
        server_cert=_write_cert(folder / "server.pem", server),
        server_key=_write_key(folder / "server-key.pem", server_key),
        client_cert=_write_cert(folder / "client.pem", client),
        client_key=_write_key(folder / "client-key.pem", client_key),
        other_ca=_write_cert(folder / "other-ca.pem", other),
        other_key=_write_key(folder / "other-key.pem", other_key),
    )
