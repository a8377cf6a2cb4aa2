"""Real keys and a real certificate chain for the provenance tests, made here (P-256, never stored in the repo)."""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from modelyard.provenance import Signer, generate_private_key


@dataclass(frozen=True)
class KeyPair:
    private_pem: bytes
    public_path: Path  # the public key as a PEM file, as MODELYARD_TRUSTED_SIGNERS and --key name it

    @property
    def signer(self) -> Signer:
        return Signer(self.private_pem)


def key_pair(folder: Path, name: str = "signer") -> KeyPair:
    private = generate_private_key()
    public = folder / f"{name}.pub.pem"
    public.write_bytes(Signer(private).public_pem)
    return KeyPair(private, public)


@dataclass(frozen=True)
class Chain:
    leaf_key_pem: bytes
    leaf_pem: bytes
    root_pem: bytes
    root_path: Path

    @property
    def signer(self) -> Signer:
        return Signer(self.leaf_key_pem, certificate=self.leaf_pem, chain=self.root_pem)


def _certificate(subject: str, issuer: str, public_key: object, signing_key: object, *, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    usage = x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(public_key)  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .sign(signing_key, hashes.SHA256())  # type: ignore[arg-type]
    )


def certificate_chain(folder: Path, name: str = "ml-team-ca") -> Chain:
    """A root CA and a leaf certificate it issued for signing; the root is what a registry trusts."""
    root_key = ec.generate_private_key(ec.SECP256R1())
    root = _certificate(name, name, root_key.public_key(), root_key, ca=True)
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = _certificate("ml-engineer", name, leaf_key.public_key(), root_key, ca=False)
    pem = serialization.Encoding.PEM
    root_path = folder / f"{name}.pem"
    root_path.write_bytes(root.public_bytes(pem))
    key_pem = leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return Chain(key_pem, leaf.public_bytes(pem), root.public_bytes(pem), root_path)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
