"""Bundles stored beside a version's files, their rows, and the checks the registry makes with them.

A version's bundles live under its upload prefix as ``.registry.sig``, ``.model.sig`` (the
uploader's) and ``.derivation.sig``: file names never start with a dot, so no upload collides with
them. Every check reads the bundle's bytes from storage and the trusted keys from the settings; the
``VersionSignature`` rows only say where the bundles are and who signed them when they verified.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from modelyard import provenance
from modelyard.provenance import REGISTRY_SIGNER, ProvenanceError
from registry.audit.chain import SYSTEM, audit_version
from registry.errors import InvalidInput, NotFound, SignatureInvalid, SignatureRequired
from registry.models import Alias, ModelFile, ModelVersion, SignatureKind, VersionSignature, VersionStatus
from storage import StorageError, get_storage
from storage.base import ObjectExists

# The name an uploader's bundle has in an upload (model-signing's default output name).
UPLOADED_BUNDLE = "model.sig"
# A bundle is a few kilobytes; anything this large is not one, and is refused before it is read further.
MAX_BUNDLE_BYTES = 1024 * 1024
STORED_NAME: dict[str, str] = {
    SignatureKind.REGISTRY: ".registry.sig",
    SignatureKind.UPLOADER: ".model.sig",
    SignatureKind.DERIVATION: ".derivation.sig",
}
# ``GET .../download?file=NAME`` for each bundle: model.sig is the registry's, over every file of the version.
DOWNLOAD_NAME = {"model.sig": SignatureKind.REGISTRY, "uploader.sig": SignatureKind.UPLOADER}
DOWNLOAD_NAME["derivation.sig"] = SignatureKind.DERIVATION
# The libraries a derived version's statement records.
DERIVE_LIBRARIES = ("onnx", "onnxruntime", "onnxruntime-gpu", "onnxconverter-common", "model-signing")


@dataclass(frozen=True)
class SignedBundle:
    """A bundle written to storage and verified, to be recorded as a ``VersionSignature``."""

    kind: str
    signer: str
    key_id: str
    storage_key: str
    sha256: str
    document: dict[str, Any] | None = None


@dataclass(frozen=True)
class ServedSignature:
    """A signed bundle of a version an inference process loads: it checks the bytes it read with it, from storage."""

    kind: str  # "registry" or "uploader"
    signer: str
    storage_key: str


def served_signatures(version: ModelVersion) -> tuple[ServedSignature, ...]:
    """The bundles every load of ``version`` checks (its registry and uploader signatures; prefetch-friendly)."""
    return tuple(
        ServedSignature(s.kind, s.signer, s.storage_key)
        for s in version.signatures.all()
        if s.kind in (SignatureKind.REGISTRY, SignatureKind.UPLOADER)
    )


# --- Keys and trust ----------------------------------------------------------------------------------


def registry_signer() -> provenance.Signer:
    return _signer(settings.SIGNING_KEY)


@functools.lru_cache(maxsize=4)
def _signer(pem: bytes) -> provenance.Signer:
    return provenance.Signer(pem)


def trust(*, registry: bool = True) -> provenance.Trust:
    """What the settings trust: the registry's keys (unless ``registry=False``) and the named signers."""
    return provenance.configured_trust(
        settings.SIGNING_KEY, tuple(settings.VERIFY_KEYS), tuple(settings.TRUSTED_SIGNERS), registry=registry
    )


def signing_keys() -> dict[str, Any]:
    """``GET /api/v1/signing-keys``: the registry's public keys (the current one first) and the trusted signers."""
    current = registry_signer()
    keys = [{"id": current.key_id, "name": REGISTRY_SIGNER, "current": True, "pem": current.public_pem.decode()}]
    for path in settings.VERIFY_KEYS:
        trusted = provenance.Trust().add_key(REGISTRY_SIGNER, path.read_bytes())
        if trusted.key_id != current.key_id:
            keys.append({"id": trusted.key_id, "name": REGISTRY_SIGNER, "current": False, "pem": trusted.pem.decode()})
    signers = [{"name": k.name, "kind": k.kind, "id": k.key_id} for k in trust(registry=False).keys]
    return {"keys": keys, "trusted_signers": signers}


# --- Bundles in storage ------------------------------------------------------------------------------


def _prefix(files: Sequence[ModelFile]) -> str:
    return files[0].storage_key.rsplit("/", 1)[0]


def _store(prefix: str, kind: str, data: bytes) -> tuple[str, str]:
    key = f"{prefix}/{STORED_NAME[kind]}"
    storage = get_storage()
    try:
        written = storage.write(key, io.BytesIO(data))
    except ObjectExists:  # an earlier attempt wrote it, and did not get to record it: this one is the bundle now
        storage.delete(key)
        written = storage.write(key, io.BytesIO(data))
    return written.key, written.sha256


def bundle_read(signature: VersionSignature) -> bytes:
    """The bundle's bytes from storage (at most :data:`MAX_BUNDLE_BYTES`)."""
    with get_storage().open(signature.storage_key) as stream:
        return bytes(stream.read(MAX_BUNDLE_BYTES + 1))[: MAX_BUNDLE_BYTES + 1]


def file_digests(files: Iterable[ModelFile]) -> dict[str, str]:
    return {f.name: f.sha256 for f in files}


# --- Uploads -----------------------------------------------------------------------------------------


def uploaded_bundle_check(data: bytes, digests: Mapping[str, str], storage_key: str) -> SignedBundle:
    """An uploader's bundle, verified against the trusted signers and the digests the upload computed."""
    if len(data) > MAX_BUNDLE_BYTES:
        raise SignatureInvalid(f"{UPLOADED_BUNDLE}: larger than {MAX_BUNDLE_BYTES} bytes; not a signature bundle")
    if not settings.TRUSTED_SIGNERS:
        raise SignatureInvalid(
            f"{UPLOADED_BUNDLE}: this registry trusts no uploader's signature (MODELYARD_TRUSTED_SIGNERS is empty)"
        )
    try:
        verified = provenance.verify_bundle(data, trust(registry=False))
        provenance.bundle_digests_match(verified.digests, digests)
    except ProvenanceError as exc:
        raise SignatureInvalid(f"{UPLOADED_BUNDLE}: {exc}") from None
    return SignedBundle(
        kind=SignatureKind.UPLOADER,
        signer=verified.signer,
        key_id=verified.key_id,
        storage_key=storage_key,
        sha256=hashlib.sha256(data).hexdigest(),
    )


# --- The registry's signatures, once validation passed ------------------------------------------------


def version_sign(version: ModelVersion) -> list[SignedBundle]:
    """Sign ``version`` (and, when derived, its derivation) with the registry's key; bundles written to storage.

    Called before the validation outcome is recorded, which records the rows in its transaction: a
    ready version always has its registry signature. Raises ``StorageUnavailable`` for the caller to retry.
    """
    files = list(version.files.all())
    signer = registry_signer()
    name = f"{version.model.name}-v{version.version}"
    data = signer.sign(file_digests(files), name=name)
    key, sha256 = _store(_prefix(files), SignatureKind.REGISTRY, data)
    bundles = [SignedBundle(SignatureKind.REGISTRY, REGISTRY_SIGNER, signer.key_id, key, sha256)]
    # Only a version the registry derived (it has a recipe) gets a statement: a parent its uploader named
    # (registry/lifecycle/lineage.py) is their word, not something the registry saw done.
    if version.derived_from_id is not None and version.recipe:
        document = derivation_document(version, files)
        data = signer.sign(derivation_digests(document), name=f"{name}-derivation")
        key, sha256 = _store(_prefix(files), SignatureKind.DERIVATION, data)
        bundles.append(
            SignedBundle(SignatureKind.DERIVATION, REGISTRY_SIGNER, signer.key_id, key, sha256, document=document)
        )
    return bundles


def versions_sign_unsigned() -> list[ModelVersion]:
    """Sign every ready version without a registry signature (validated before signing existed): ``version.sign``.

    The digests signed are the ones recorded at upload; a version whose stored bytes changed since is
    signed as it was uploaded, and its loads still refuse the changed bytes.
    """
    unsigned = (
        ModelVersion.objects.filter(status=VersionStatus.READY)
        .exclude(signatures__kind=SignatureKind.REGISTRY)
        .select_related("model", "derived_from__model")
        .order_by("pk")
    )
    signed = []
    for version in unsigned:
        bundles = version_sign(version)  # storage first; then the rows, or nothing
        with transaction.atomic(durable=True):
            if VersionSignature.objects.filter(version=version, kind=SignatureKind.REGISTRY).exists():
                continue  # signed meanwhile (another run)
            signatures_record(version, bundles)
            audit_version(
                version,
                actor=SYSTEM,
                action="version.sign",
                after={"signed_by": [{"name": b.signer, "key_id": b.key_id, "kind": b.kind} for b in bundles]},
            )
        signed.append(version)
    return signed


def derivation_document(version: ModelVersion, files: Sequence[ModelFile]) -> dict[str, Any]:
    """What a derived version's statement says: the parent's digests, the recipe, the libraries, the child's digests."""
    parent = version.derived_from
    assert parent is not None
    libraries = {}
    for library in DERIVE_LIBRARIES:
        try:
            libraries[library] = importlib.metadata.version(library)
        except importlib.metadata.PackageNotFoundError:
            continue
    return {
        "parent": {"model": parent.model.name, "version": parent.version, "files": file_digests(parent.files.all())},
        "child": {"model": version.model.name, "version": version.version, "files": file_digests(files)},
        "recipe": version.recipe,
        "libraries": libraries,
    }


def derivation_digests(document: Mapping[str, Any]) -> dict[str, str]:
    """The manifest a derivation statement signs: ``derivation.json`` (the document) and both versions' files."""
    digests = {"derivation.json": hashlib.sha256(provenance.canonical_json(document)).hexdigest()}
    digests.update({f"parent/{n}": d for n, d in document["parent"]["files"].items()})
    digests.update({f"child/{n}": d for n, d in document["child"]["files"].items()})
    return digests


def signatures_record(version: ModelVersion, bundles: Sequence[SignedBundle]) -> None:
    """The rows of ``bundles``, replacing the version's rows of the same kinds (a version validated again).

    Inside the transaction that records the version's state.
    """
    VersionSignature.objects.filter(version=version, kind__in=[b.kind for b in bundles]).delete()
    VersionSignature.objects.bulk_create(
        VersionSignature(
            version=version,
            kind=b.kind,
            signer=b.signer,
            key_id=b.key_id,
            storage_key=b.storage_key,
            sha256=b.sha256,
            document=b.document,
        )
        for b in bundles
    )


# --- Reading and checking -----------------------------------------------------------------------------


def signature_verify(signature: VersionSignature) -> provenance.Verified:
    """Verify one stored bundle against today's trust and the version's recorded digests; raises ProvenanceError."""
    try:
        data = bundle_read(signature)
    except StorageError as exc:
        raise ProvenanceError(f"the {signature.kind} bundle cannot be read from storage: {exc}") from None
    verified = provenance.verify_bundle(data, trust(registry=signature.kind != SignatureKind.UPLOADER))
    if signature.kind == SignatureKind.DERIVATION:
        if signature.document is None:
            raise ProvenanceError("the derivation statement's document is missing")
        provenance.bundle_digests_match(verified.digests, derivation_digests(signature.document))
        provenance.bundle_digests_match(
            signature.document["child"]["files"], file_digests(signature.version.files.all())
        )
    else:
        provenance.bundle_digests_match(verified.digests, file_digests(signature.version.files.all()))
    if signature.kind != SignatureKind.UPLOADER and verified.signer != REGISTRY_SIGNER:
        raise ProvenanceError(f"the {signature.kind} bundle is signed by {verified.signer}, not by the registry")
    return verified


def version_provenance(version: ModelVersion) -> dict[str, Any]:
    """``GET .../provenance``: who signed the version, its derivation, each bundle checked now."""
    signers = []
    problems = []
    derivation = None
    for signature in version.signatures.all():
        entry = {"name": signature.signer, "key_id": signature.key_id, "kind": signature.kind, "verified": True}
        try:
            signature_verify(signature)
        except ProvenanceError as exc:
            entry["verified"] = False
            problems.append(f"{signature.kind}: {exc}")
        if signature.kind == SignatureKind.DERIVATION:
            derivation = {**(signature.document or {}), "verified": entry["verified"]}
        else:
            signers.append(entry)
    signed = any(s["kind"] == SignatureKind.REGISTRY and s["verified"] for s in signers) and not problems
    return {
        "signed": signed,
        "signers": signers,
        "derivation": derivation,
        "verified_at": timezone.now().isoformat(),
        "problems": problems,
    }


def bundle_download(version: ModelVersion, name: str) -> VersionSignature:
    """The bundle ``?file=NAME`` asks for (model.sig, uploader.sig, derivation.sig)."""
    kind = DOWNLOAD_NAME.get(name)
    if kind is None:
        raise NotFound(f"version {version.version} has no file '{name}'")
    signature = version.signatures.filter(kind=kind).first()
    if signature is None:
        raise NotFound(f"version {version.version} has no {kind} signature ('{name}')")
    return signature


# --- Aliases that require a signature -----------------------------------------------------------------


def signature_problem(alias: Alias, version: ModelVersion) -> str | None:
    """Why ``alias`` refuses ``version`` for want of a signature it accepts, or None.

    Accepted: an uploader's signature that verified on upload, by one of the alias's trusted signers
    when it names any; or, for a derived version, a signed derivation from a parent accepted so.
    """
    if not alias.require_signature:
        return None
    trusted = list(alias.trusted_signers or [])
    current: ModelVersion | None = version
    while current is not None:
        kinds = {s.kind: s for s in current.signatures.all()}
        uploader = kinds.get(SignatureKind.UPLOADER)
        if uploader is not None:
            if trusted and uploader.signer not in trusted:
                source = "" if current == version else f" (the source of version {version.version})"
                return (
                    f"version {current.version}{source} is signed by '{uploader.signer}'; "
                    f"'{alias.name}' accepts only {', '.join(repr(t) for t in trusted)}"
                )
            return None
        if current.derived_from_id is None or SignatureKind.DERIVATION not in kinds:
            break
        current = current.derived_from
    who = f" by one of {', '.join(repr(t) for t in trusted)}" if trusted else ""
    return f"version {version.version} is not signed by its uploader, and '{alias.name}' requires a signature{who}"


def check_alias_signature(alias: Alias, version: ModelVersion) -> None:
    problem = signature_problem(alias, version)
    if problem is not None:
        raise SignatureRequired(problem, detail={"require_signature": True, "trusted_signers": alias.trusted_signers})


def trusted_signer_names(names: Sequence[str]) -> list[str]:
    """``names`` checked against MODELYARD_TRUSTED_SIGNERS; raises InvalidInput naming any unknown one."""
    known = [name for name, _ in settings.TRUSTED_SIGNERS]
    unknown = [name for name in names if name not in known]
    if unknown:
        listed = ", ".join(known) if known else "none: MODELYARD_TRUSTED_SIGNERS is empty"
        raise InvalidInput(f"unknown signer(s) {', '.join(unknown)}; the trusted signers are {listed}")
    return list(dict.fromkeys(names))
