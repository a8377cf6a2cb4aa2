"""Signed provenance: OpenSSF Model Signing bundles made and checked over digests already computed.

A bundle (``.sig``) is an in-toto statement listing every file's sha256, in a DSSE envelope signed
with an elliptic-curve key or a certificate, as the ``model-signing`` library writes it. The library
checks a bundle by hashing the files again; Modelyard has the digests already (the upload hashes
while it streams, the artifact cache while it reads), so it signs a manifest built from them and,
to verify, checks the envelope with the library's verifiers and compares the signed digests with the
ones it computed. The bytes are read once.

The registry and the inference hosts import this module, and so do the user commands (``modelyard
push --sign-key``, ``pull``, ``verify``, ``audit verify-offline``): it imports the standard library,
``cryptography`` and ``model_signing``, nothing of the project.

Trust: a :class:`Trust` holds public keys and certificate chains by name. A key is named by its id,
the sha256 of its PEM SubjectPublicKeyInfo (the ``hint`` ``model-signing`` writes into a bundle);
a bundle names the key that made it, so verification picks that key and never tries the others.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

__all__ = [
    "REGISTRY_SIGNER",
    "ProvenanceError",
    "Signer",
    "Trust",
    "TrustedKey",
    "Verified",
    "build_trust",
    "bundle_digests_match",
    "canonical_json",
    "check_signing_key",
    "configured_trust",
    "generate_private_key",
    "key_id",
    "load_or_create_private_key",
    "parse_signers",
    "preload_verifier",
    "sign_digests",
    "verify_bundle",
]

# The name the registry's own key goes by in a Trust and in a version's signers.
REGISTRY_SIGNER = "modelyard"
SHA256 = "sha256"


class ProvenanceError(Exception):
    """A bundle that does not verify, or digests that are not the ones it signed; the message says which."""


class _Pem:
    """Bytes where ``model-signing`` wants a path: it only calls ``read_bytes``/``read_text`` on it."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def read_bytes(self) -> bytes:
        return self._data

    def read_text(self, encoding: str = "utf-8") -> str:
        return self._data.decode(encoding)


def _public_pem(public_key: Any) -> bytes:
    return bytes(
        public_key.public_bytes(
            encoding=serialization.Encoding.PEM, format=serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def key_id(public_key: Any) -> str:
    """The key's id: sha256 of its PEM SubjectPublicKeyInfo, as ``model-signing`` hints it in a bundle."""
    return hashlib.sha256(_public_pem(public_key)).hexdigest()


def generate_private_key() -> bytes:
    """A new P-256 private key, PEM (PKCS#8, unencrypted)."""
    key = ec.generate_private_key(ec.SECP256R1())
    return bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def load_or_create_private_key(path: Path) -> bytes:
    """The PEM key at ``path``, generated there once (owner-only) when missing; safe against a racing start."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(generate_private_key())
    try:
        os.link(draft, path)  # a process starting at the same moment finds no file or the whole key
    except FileExistsError:
        pass
    finally:
        draft.unlink()
    return path.read_bytes()


def _manifest(digests: Mapping[str, str], name: str) -> Any:
    from model_signing import manifest
    from model_signing._hashing.hashing import Digest

    serialization_type = manifest.SerializationType.from_args(
        {"method": "files", "hash_type": SHA256, "allow_symlinks": False}
    )
    items = [
        manifest.FileManifestItem(path=pathlib.PurePosixPath(file), digest=Digest(SHA256, bytes.fromhex(hexdigest)))
        for file, hexdigest in sorted(digests.items())
    ]
    return manifest.Manifest(name, items, serialization_type)


# The curves model-signing signs with (those of Sigstore's protobuf specifications).
SIGNING_CURVES = ("secp256r1", "secp384r1", "secp521r1")


def check_signing_key(private_key_pem: bytes) -> None:
    """Refuse, with :class:`ProvenanceError`, a PEM private key that :class:`Signer` could not sign with.

    The same checks as ``model-signing``'s, with ``cryptography`` alone: settings call this at every
    process start, and importing ``model_signing`` (sigstore, TUF) costs a second on a slow CPU that
    a process which never signs should not pay.
    """
    try:
        key = serialization.load_pem_private_key(private_key_pem, None)
    except (ValueError, TypeError) as exc:
        raise ProvenanceError(f"cannot sign with this key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ProvenanceError(
            f"cannot sign with this key: it is not an elliptic-curve key (curves: {', '.join(SIGNING_CURVES)})"
        )
    if key.curve.name not in SIGNING_CURVES:
        raise ProvenanceError(
            f"cannot sign with this key: Unsupported key for curve '{key.curve.name}' "
            f"(curves: {', '.join(SIGNING_CURVES)})"
        )


class Signer:
    """Signs with one private key, optionally with its certificate and the chain above it."""

    def __init__(self, private_key_pem: bytes, *, certificate: bytes | None = None, chain: bytes = b"") -> None:
        from model_signing._signing import sign_certificate, sign_ec_key

        check_signing_key(private_key_pem)
        try:
            if certificate is None:
                self._signer: Any = sign_ec_key.Signer(_Pem(private_key_pem))  # type: ignore[arg-type]
            else:
                self._signer = sign_certificate.Signer(
                    _Pem(private_key_pem),  # type: ignore[arg-type]
                    _Pem(certificate),  # type: ignore[arg-type]
                    [_Pem(chain)] if chain else [],  # type: ignore[list-item]
                )
        except (ValueError, TypeError) as exc:
            raise ProvenanceError(f"cannot sign with this key: {exc}") from None
        self.key_id = key_id(self._signer._private_key.public_key())

    @property
    def public_pem(self) -> bytes:
        return _public_pem(self._signer._private_key.public_key())

    def sign(self, digests: Mapping[str, str], *, name: str = "model") -> bytes:
        """The bundle (JSON bytes) of a manifest of ``digests`` (file name → sha256 hex)."""
        from model_signing._signing.signing import Payload

        signature = self._signer.sign(Payload(_manifest(digests, name)))
        return str(signature.bundle.to_json()).encode()


def sign_digests(private_key_pem: bytes, digests: Mapping[str, str], *, name: str = "model") -> bytes:
    """One bundle with one key: ``Signer(private_key_pem).sign(digests)``."""
    return Signer(private_key_pem).sign(digests, name=name)


@dataclass(frozen=True)
class TrustedKey:
    """A public key (``kind="key"``) or a certificate chain's roots (``kind="certificate"``), by name."""

    name: str
    kind: str
    pem: bytes
    key_id: str = ""


@dataclass(frozen=True)
class Verified:
    """What a bundle proved: who signed it, and the sha256 of every file it lists."""

    signer: str
    key_id: str
    kind: str
    digests: dict[str, str]


@dataclass
class Trust:
    """The keys and certificate chains a verifier accepts, each under a name."""

    keys: list[TrustedKey] = field(default_factory=list)

    def add_key(self, name: str, pem: bytes) -> TrustedKey:
        """Trust a PEM public key (or the public half of a PEM private key) under ``name``."""
        try:
            public = serialization.load_pem_public_key(pem)
        except ValueError:
            try:
                public = serialization.load_pem_private_key(pem, None).public_key()
            except (ValueError, TypeError) as exc:
                raise ProvenanceError(f"{name}: not a PEM public key: {exc}") from None
        if not isinstance(public, ec.EllipticCurvePublicKey):
            raise ProvenanceError(f"{name}: not an elliptic-curve key (model signing uses P-256, P-384 or P-521)")
        trusted = TrustedKey(name=name, kind="key", pem=_public_pem(public), key_id=key_id(public))
        self.keys.append(trusted)
        return trusted

    def add_certificates(self, name: str, pem: bytes) -> TrustedKey:
        """Trust what chains up to these PEM certificates (a root, or a root and intermediates) under ``name``."""
        try:
            certificates = x509.load_pem_x509_certificates(pem)
        except ValueError as exc:
            raise ProvenanceError(f"{name}: not PEM certificates: {exc}") from None
        fingerprint = hashlib.sha256(
            b"".join(c.fingerprint(c.signature_hash_algorithm or _SHA256()) for c in certificates)
        )
        trusted = TrustedKey(name=name, kind="certificate", pem=pem, key_id=fingerprint.hexdigest())
        self.keys.append(trusted)
        return trusted

    def add_pem(self, name: str, pem: bytes) -> TrustedKey:
        """A key or certificates, whichever the PEM holds."""
        if b"-----BEGIN CERTIFICATE-----" in pem:
            return self.add_certificates(name, pem)
        return self.add_key(name, pem)

    def names(self) -> list[str]:
        return sorted({k.name for k in self.keys})

    def by_key_id(self, wanted: str) -> TrustedKey | None:
        return next((k for k in self.keys if k.kind == "key" and k.key_id == wanted), None)


def build_trust(
    *, registry_keys: Iterable[bytes] = (), signers: Iterable[tuple[str, bytes]] = (), registry: bool = True
) -> Trust:
    """The registry's keys (private or public PEM; under :data:`REGISTRY_SIGNER`) and the named signers.

    ``registry=False`` leaves the registry's keys out: what an uploader's bundle is checked against.
    """
    trust = Trust()
    if registry:
        for pem in registry_keys:
            trust.add_key(REGISTRY_SIGNER, pem)
    for name, pem in signers:
        if name == REGISTRY_SIGNER:
            raise ProvenanceError(f"{REGISTRY_SIGNER!r} names the registry's own key; give the signer another name")
        trust.add_pem(name, pem)
    return trust


@functools.lru_cache(maxsize=8)
def configured_trust(
    signing_key: bytes,
    verify_keys: tuple[Path, ...] = (),
    signers: tuple[tuple[str, Path], ...] = (),
    *,
    registry: bool = True,
) -> Trust:
    """:func:`build_trust` from the settings (the key, MODELYARD_VERIFY_KEYS, MODELYARD_TRUSTED_SIGNERS), cached."""
    return build_trust(
        registry_keys=[signing_key, *(path.read_bytes() for path in verify_keys)],
        signers=[(name, path.read_bytes()) for name, path in signers],
        registry=registry,
    )


def _SHA256() -> Any:
    from cryptography.hazmat.primitives import hashes

    return hashes.SHA256()


def parse_signers(value: str) -> list[tuple[str, Path]]:
    """``name=path,name=path`` (``MODELYARD_TRUSTED_SIGNERS``) as pairs; raises ValueError naming a bad entry."""
    pairs = []
    for entry in (part.strip() for part in value.split(",")):
        if not entry:
            continue
        name, sep, path = entry.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"{entry!r}: expected NAME=PATH (a PEM public key or certificate chain)")
        pairs.append((name.strip(), Path(path.strip())))
    return pairs


def _read_bundle(data: bytes) -> Any:
    from model_signing._signing import sign_sigstore_pb

    try:
        return sign_sigstore_pb.Signature.read(_Pem(data))  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - the parser raises whatever the JSON or the protobuf mapping finds wrong
        raise ProvenanceError(f"not a model signing bundle: {type(exc).__name__}: {exc}") from None


def preload_verifier() -> None:
    """Import what :func:`verify_bundle` needs now, not at the first bundle.

    ``model_signing`` (with sigstore and TUF) takes 0.4 s to a second to import on a slow CPU. An
    inference process verifies every version before it loads it, so it runs this on a thread of its
    own at start, beside the registry's query and the first download (I/O, which lets it run).
    """
    from model_signing._signing import sign_certificate, sign_ec_key, sign_sigstore_pb  # noqa: F401


def verify_bundle(data: bytes, trust: Trust) -> Verified:
    """Check the bundle's envelope against ``trust``; the digests it signed. Raises :class:`ProvenanceError`."""
    from model_signing._signing import sign_certificate, sign_ec_key

    signature = _read_bundle(data)
    material = signature.bundle.verification_material
    chain = getattr(material, "x509_certificate_chain", None)
    if chain is not None and chain.certificates:
        candidates = [k for k in trust.keys if k.kind == "certificate"]
        if not candidates:
            raise ProvenanceError("signed with a certificate, and no certificate chain is trusted")
        errors = []
        for trusted in candidates:
            verifier = sign_certificate.Verifier([_Pem(trusted.pem)])  # type: ignore[list-item]
            try:
                manifest = verifier.verify(signature)
            except Exception as exc:  # noqa: BLE001 - OpenSSL's X509StoreContextError, InvalidSignature, ValueError
                errors.append(f"{trusted.name}: {_reason(exc)}")
                continue
            leaf = x509.load_der_x509_certificate(chain.certificates[0].raw_bytes)
            return Verified(trusted.name, leaf.fingerprint(_SHA256()).hex(), "certificate", _digests(manifest))
        raise ProvenanceError("the certificate does not chain to a trusted signer (" + "; ".join(errors) + ")")
    hint = material.public_key.hint if material.public_key else None
    if not hint:
        raise ProvenanceError("the bundle names no key (re-sign it with model-signing 1.0 or newer)")
    key = trust.by_key_id(hint)
    if key is None:
        raise ProvenanceError(f"signed by key {hint[:16]}, which is not trusted here")
    try:
        manifest = sign_ec_key.Verifier(_Pem(key.pem)).verify(signature)  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - cryptography's InvalidSignature has no message
        raise ProvenanceError(f"the signature by {key.name} does not verify: {_reason(exc)}") from None
    return Verified(key.name, key.key_id, "key", _digests(manifest))


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _digests(manifest: Any) -> dict[str, str]:
    digests = {}
    for descriptor in manifest.resource_descriptors():
        if descriptor.digest.algorithm != SHA256:
            raise ProvenanceError(
                f"{descriptor.identifier}: signed as {descriptor.digest.algorithm}; "
                "Modelyard checks sha256 file manifests (model-signing's default)"
            )
        digests[descriptor.identifier] = descriptor.digest.digest_hex
    return digests


def bundle_digests_match(signed: Mapping[str, str], actual: Mapping[str, str], *, ignore: Iterable[str] = ()) -> None:
    """Raise :class:`ProvenanceError` unless the signed digests are exactly the files' (``ignore``: the bundles)."""
    skip = set(ignore)
    have = {name: digest for name, digest in actual.items() if name not in skip}
    for name in sorted(set(signed) | set(have)):
        if name not in have:
            raise ProvenanceError(f"{name}: signed, but not part of this version")
        if name not in signed:
            raise ProvenanceError(f"{name}: not covered by the signature")
        if signed[name] != have[name]:
            raise ProvenanceError(f"{name}: sha256 {have[name][:16]}… is not the signed {signed[name][:16]}…")


def canonical_json(document: Any) -> bytes:
    """The one byte form of a JSON document that is hashed and signed (sorted keys, no spaces)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
