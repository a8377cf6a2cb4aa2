"""A version's signatures checked against the bytes this process read for it, before it is loaded.

The artifact cache hashes every file as it reads it (``ArtifactCache.bundle_with_digests``); the
bundles come from storage and the trusted keys from this process's settings, so a change made in the
bucket, or in the registry's database, after validation is found here. The registry's bundle must
be there and be signed by the registry's key; an uploader's bundle, when the version has one, must
verify against ``MODELYARD_TRUSTED_SIGNERS`` too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from django.conf import settings

from modelyard.provenance import (
    REGISTRY_SIGNER,
    ProvenanceError,
    Trust,
    bundle_digests_match,
    configured_trust,
    verify_bundle,
)
from storage import ObjectNotFound, StorageError, get_storage

if TYPE_CHECKING:  # the artifact cache imports this module's error, and needs no Django models for it
    from registry.serving import ServedSignature

# A bundle is a few kilobytes; more than this is not one.
MAX_BUNDLE_BYTES = 1024 * 1024
REGISTRY = "registry"


class VerificationFailed(Exception):
    """The bytes read for a version are not what its signatures sign, or it has no signature this host trusts."""


class Signed(Protocol):
    """What is checked: a version to load (``VersionSpec``) or to benchmark (``BenchmarkJob``)."""

    @property
    def model(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def signatures(self) -> tuple[ServedSignature, ...]: ...


def verify_version(spec: Signed, digests: Mapping[str, str]) -> list[str]:
    """Check every bundle of ``spec`` against ``digests`` (file name → sha256 as read); the signers, or raise."""
    if not any(s.kind == REGISTRY for s in spec.signatures):
        raise VerificationFailed(
            f"{spec.model} v{spec.version} is not signed by the registry "
            "(validated before signing existed: `modelyard sign-versions` signs it)"
        )
    signers = []
    for signature in spec.signatures:
        data = _read(signature)
        trust = configured_trust(
            settings.SIGNING_KEY,
            tuple(settings.VERIFY_KEYS),
            tuple(settings.TRUSTED_SIGNERS),
            registry=signature.kind == REGISTRY,
        )
        try:
            verified = verify_bundle(data, trust)
            if signature.kind == REGISTRY and verified.signer != REGISTRY_SIGNER:
                raise ProvenanceError(f"signed by {verified.signer}, not by the registry")
            bundle_digests_match(verified.digests, digests)
        except ProvenanceError as exc:
            hint = _hint(trust) if signature.kind == REGISTRY and "not trusted here" in str(exc) else ""
            raise VerificationFailed(f"the {signature.kind} signature does not match: {exc}{hint}") from None
        signers.append(verified.signer)
    return signers


def _hint(trust: Trust) -> str:
    """For a registry bundle by a key this host does not know: which keys it knows, and how to give it the right one."""
    known = ", ".join(key.key_id[:16] for key in trust.keys if key.name == REGISTRY_SIGNER)
    return (
        f" (this host trusts the registry key(s) {known}: give every host the registry's key, "
        "MODELYARD_SIGNING_KEY, or its public key in MODELYARD_VERIFY_KEYS)"
    )


def _read(signature: ServedSignature) -> bytes:
    try:
        with get_storage().open(signature.storage_key) as stream:
            data = bytes(stream.read(MAX_BUNDLE_BYTES + 1))
    except ObjectNotFound:
        raise VerificationFailed(f"the {signature.kind} signature bundle is missing from storage") from None
    except StorageError:
        raise  # storage away: an ordinary failed load, retried
    if len(data) > MAX_BUNDLE_BYTES:
        raise VerificationFailed(f"the {signature.kind} signature bundle is larger than {MAX_BUNDLE_BYTES} bytes")
    return data
