"""Signed provenance in the registry: the registry's signature at validation, uploaders' bundles checked on
arrival, derived versions' statements, and aliases that require a signature.

Real keys and a real certificate chain made here (``tests/support/signing.py``), real uploads through the
API on the test database and the artifact folder, the bundles read back from storage.
"""

from __future__ import annotations

import json

import pytest

from modelyard.provenance import REGISTRY_SIGNER, ProvenanceError, build_trust, verify_bundle
from registry import promotions
from registry.errors import InvalidInput, SignatureRequired
from registry.models import Alias, AuditEvent, ModelVersion, SignatureKind, VersionSignature, VersionStatus
from registry.provenance import services as provenance
from registry.tasks import collect_orphaned_artifacts
from storage import get_storage
from tests.support.onnx_models import add_model_bytes, classifier_model
from tests.support.people import Person, make_person
from tests.support.signing import certificate_chain, key_pair, sha256

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = add_model_bytes(bias=1.0)


def stored(keys: list[str]) -> dict[str, bytes]:
    out = {}
    for key in keys:
        with get_storage().open(key) as stream:
            out[key] = stream.read()
    return out


def all_objects() -> set[str]:
    return {item.key for item in get_storage().list("")}


def test_a_validated_version_is_signed_by_the_registry_over_every_file(owner: Person, registered: str, settings):
    notes = b"trained on the 2026-11 snapshot"
    response = owner.upload(registered, [("model.onnx", MODEL), ("notes.txt", notes)])
    assert response.status_code == 201, response.content

    version = ModelVersion.objects.get(model__name=registered, version=1)
    assert version.status == VersionStatus.READY
    [signature] = version.signatures.all()
    assert (signature.kind, signature.signer) == (SignatureKind.REGISTRY, REGISTRY_SIGNER)
    assert signature.storage_key.endswith("/.registry.sig")
    bundle = stored([signature.storage_key])[signature.storage_key]
    assert signature.sha256 == sha256(bundle)
    verified = verify_bundle(bundle, build_trust(registry_keys=[settings.SIGNING_KEY]))
    assert verified.digests == {"model.onnx": sha256(MODEL), "notes.txt": sha256(notes)}
    assert signature.key_id == provenance.registry_signer().key_id == verified.key_id
    assert provenance.version_provenance(version)["signed"] is True


def test_a_failed_version_is_not_signed(owner: Person, registered: str):
    response = owner.upload(registered, [("model.onnx", MODEL), ("tokenizer.json", b"{}")])
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get(model__name=registered, version=1)
    assert version.status == VersionStatus.FAILED
    assert not version.signatures.exists()
    assert not [key for key in all_objects() if key.endswith(".sig")]


def test_an_upload_signed_by_a_trusted_key_is_accepted_and_its_signer_recorded(owner: Person, registered, ml_team):
    bundle = ml_team.signer.sign({"model.onnx": sha256(MODEL)})

    response = owner.upload(registered, [("model.onnx", MODEL), ("model.sig", bundle)])

    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get(model__name=registered, version=1)
    assert [f.name for f in version.files.all()] == ["model.onnx"]  # the bundle is not a file of the version
    kinds = {s.kind: s for s in version.signatures.all()}
    assert set(kinds) == {SignatureKind.UPLOADER, SignatureKind.REGISTRY}
    uploader = kinds[SignatureKind.UPLOADER]
    assert (uploader.signer, uploader.key_id) == ("ml-team", ml_team.signer.key_id)
    assert stored([uploader.storage_key])[uploader.storage_key] == bundle
    event = AuditEvent.objects.get(action="version.upload")
    assert event.after["signed_by"] == [{"name": "ml-team", "key_id": ml_team.signer.key_id, "kind": "uploader"}]
    assert [s["name"] for s in provenance.version_provenance(version)["signers"]] == ["ml-team", REGISTRY_SIGNER]


def test_an_upload_signed_with_a_certificate_that_chains_to_a_trusted_root_is_accepted(
    owner: Person, registered, settings, tmp_path
):
    chain = certificate_chain(tmp_path)
    settings.TRUSTED_SIGNERS = [("ml-team-ca", chain.root_path)]
    bundle = chain.signer.sign({"model.onnx": sha256(MODEL)})

    response = owner.upload(registered, [("model.onnx", MODEL), ("model.sig", bundle)])

    assert response.status_code == 201, response.content
    uploader = VersionSignature.objects.get(kind=SignatureKind.UPLOADER)
    assert uploader.signer == "ml-team-ca"


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("untrusted key", "model.sig: signed by key {other}, which is not trusted here"),
        ("other bytes", "model.sig: model.onnx: sha256 {actual}… is not the signed {signed}…"),
        ("a file left out", "model.sig: notes.txt: not covered by the signature"),
        (
            "not a bundle",
            "model.sig: not a model signing bundle: JSONDecodeError: Expecting value: line 1 column 1 (char 0)",
        ),
        ("a certificate", "model.sig: signed with a certificate, and no certificate chain is trusted"),
    ],
)
def test_an_upload_whose_bundle_does_not_verify_is_refused_and_leaves_nothing(
    owner: Person, registered, ml_team, tmp_path, case, error
):
    other = key_pair(tmp_path, "other")
    files = [("model.onnx", MODEL)]
    if case == "untrusted key":
        bundle = other.signer.sign({"model.onnx": sha256(MODEL)})
    elif case == "other bytes":
        bundle = ml_team.signer.sign({"model.onnx": sha256(b"another model")})
    elif case == "a file left out":
        files.append(("notes.txt", b"notes"))
        bundle = ml_team.signer.sign({"model.onnx": sha256(MODEL)})
    elif case == "not a bundle":
        bundle = b"not json"
    else:
        bundle = certificate_chain(tmp_path).signer.sign({"model.onnx": sha256(MODEL)})
    before = all_objects()

    response = owner.upload(registered, [*files, ("model.sig", bundle)])

    assert response.status_code == 400, response.content
    expected = error.format(
        other=other.signer.key_id[:16], actual=sha256(MODEL)[:16], signed=sha256(b"another model")[:16]
    )
    assert response.json()["error"].startswith(expected), response.json()["error"]
    assert not ModelVersion.objects.exists()
    assert all_objects() == before


def test_a_certificate_issued_by_another_authority_is_refused(owner: Person, registered, settings, tmp_path):
    trusted = certificate_chain(tmp_path, "ml-team-ca")
    settings.TRUSTED_SIGNERS = [("ml-team-ca", trusted.root_path)]
    bundle = certificate_chain(tmp_path, "someone-else").signer.sign({"model.onnx": sha256(MODEL)})

    response = owner.upload(registered, [("model.onnx", MODEL), ("model.sig", bundle)])

    assert response.status_code == 400
    assert response.json()["error"] == (
        "model.sig: the certificate does not chain to a trusted signer "
        "(ml-team-ca: X509StoreContextError: self-signed certificate in certificate chain)"
    )


def test_a_bundle_is_refused_when_no_uploader_is_trusted(owner: Person, registered, settings, tmp_path):
    settings.TRUSTED_SIGNERS = []
    bundle = key_pair(tmp_path).signer.sign({"model.onnx": sha256(MODEL)})
    response = owner.upload(registered, [("model.onnx", MODEL), ("model.sig", bundle)])
    assert response.status_code == 400
    assert response.json()["error"] == (
        "model.sig: this registry trusts no uploader's signature (MODELYARD_TRUSTED_SIGNERS is empty)"
    )


def test_a_bundle_larger_than_the_limit_is_refused(owner: Person, registered, ml_team, monkeypatch):
    monkeypatch.setattr(provenance, "MAX_BUNDLE_BYTES", 64)
    response = owner.upload(registered, [("model.onnx", MODEL), ("model.sig", b"{" + b" " * 100 + b"}")])
    assert response.status_code == 400
    assert response.json()["error"] == "model.sig: larger than 64 bytes; not a signature bundle"
    assert not ModelVersion.objects.exists()


def test_a_derived_version_carries_a_signed_statement_and_passes_an_alias_its_signed_parent_passes(
    owner: Person, admin: Person, registered: str, ml_team
):
    from tests.registry.test_derive import derived_version

    parent_bytes = classifier_model().SerializeToString()
    bundle = ml_team.signer.sign({"model.onnx": sha256(parent_bytes)})
    assert owner.upload(registered, [("model.onnx", parent_bytes), ("model.sig", bundle)]).status_code == 201

    child = derived_version(owner, registered, 1, "fp16")

    assert child.status == VersionStatus.READY, child.errors
    statement = child.signatures.get(kind=SignatureKind.DERIVATION)
    document = statement.document
    assert document["parent"] == {"model": registered, "version": 1, "files": {"model.onnx": sha256(parent_bytes)}}
    assert document["child"]["files"] == {f.name: f.sha256 for f in child.files.all()}
    assert document["recipe"] == child.recipe
    assert {"onnx", "onnxruntime", "model-signing"} <= set(document["libraries"])
    verified = provenance.signature_verify(statement)
    assert verified.digests["parent/model.onnx"] == sha256(parent_bytes)
    assert provenance.version_provenance(child)["derivation"]["verified"] is True

    # An alias that requires ml-team's signature takes the child: its statement names a parent ml-team signed.
    require(admin, registered, "ml-team")
    response = set_alias(owner, registered, child.version)
    assert response.status_code == 200, response.content

    # A statement whose document was changed in the database no longer verifies.
    statement.document = {**document, "recipe": {"recipe": "int8"}}
    statement.save(update_fields=["document"])
    with pytest.raises(ProvenanceError, match=r"^derivation\.json: sha256 .* is not the signed "):
        provenance.signature_verify(statement)


def test_the_orphan_collector_keeps_every_versions_bundles(owner: Person, registered, ml_team):
    bundle = ml_team.signer.sign({"model.onnx": sha256(MODEL)})
    assert owner.upload(registered, [("model.onnx", MODEL), ("model.sig", bundle)]).status_code == 201
    keys = set(VersionSignature.objects.values_list("storage_key", flat=True))
    assert len(keys) == 2

    collect_orphaned_artifacts(grace_seconds=0)

    assert keys <= all_objects()


# --- Aliases that require a signature -------------------------------------------------------------------


@pytest.fixture
def admin(db: None) -> Person:
    from registry.models import Role

    return make_person("admin", Role.ADMIN)


def staging(model: str) -> Alias:
    return Alias.objects.get(model__name=model, name="staging")


def require(admin: Person, model: str, *signers: str, alias: str = "staging") -> Alias:
    from registry.models import RegisteredModel

    return promotions.alias_set_provenance(
        model=RegisteredModel.objects.get(name=model),
        alias_name=alias,
        actor=admin.actor,
        require_signature=True,
        trusted_signers=list(signers) or None,
    )


def set_alias(person: Person, model: str, version: int, alias: str = "staging"):
    return person.client.put(
        f"/api/v1/models/{model}/aliases/{alias}",
        {"version": version, "reason": "test"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {person.token}",
    )


def test_an_alias_that_requires_a_signature_refuses_an_unsigned_version_with_409(owner, admin, registered):
    assert owner.upload(registered, [("model.onnx", MODEL)]).status_code == 201
    require(admin, registered)

    response = set_alias(owner, registered, 1)

    assert response.status_code == 409, response.content
    assert response.json()["error"] == ("version 1 is not signed by its uploader, and 'staging' requires a signature")
    assert staging(registered).version is None
    event = AuditEvent.objects.get(action="alias.provenance")
    assert event.after == {"require_signature": True, "trusted_signers": []}


def test_an_alias_accepts_a_version_signed_by_a_trusted_signer_and_refuses_another_signer(
    owner, admin, registered, settings, tmp_path
):
    ml_team, vendor = key_pair(tmp_path, "ml-team"), key_pair(tmp_path, "vendor")
    settings.TRUSTED_SIGNERS = [("ml-team", ml_team.public_path), ("vendor", vendor.public_path)]
    for signer in (ml_team, vendor):
        bundle = signer.signer.sign({"model.onnx": sha256(MODEL)})
        # The same bytes twice, each signed by another signer: allowed on purpose.
        sent = owner.upload(registered, [("model.onnx", MODEL), ("model.sig", bundle)], query="?allow_duplicate=true")
        assert sent.status_code == 201
    require(admin, registered, "ml-team")

    refused = set_alias(owner, registered, 2)
    assert refused.status_code == 409
    assert refused.json()["error"] == "version 2 is signed by 'vendor'; 'staging' accepts only 'ml-team'"

    accepted = set_alias(owner, registered, 1)
    assert accepted.status_code == 200, accepted.content
    assert staging(registered).version.version == 1


def test_a_protected_alias_refuses_the_request_and_the_approval_of_an_unsigned_version(
    owner, approver, admin, registered, ml_team
):
    assert owner.upload(registered, [("model.onnx", MODEL)]).status_code == 201
    bundle = ml_team.signer.sign({"model.onnx": sha256(MODEL)})
    signed = [("model.onnx", MODEL), ("model.sig", bundle)]
    assert owner.upload(registered, signed, query="?allow_duplicate=true").status_code == 201  # the same bytes, signed
    # A request opened before the alias required a signature is refused at approval.
    opened = set_alias(owner, registered, 1, alias="production")
    assert opened.status_code == 202, opened.content
    require(admin, registered, alias="production")

    assert set_alias(owner, registered, 1, alias="production").status_code == 409
    approval = approver.post(f"/api/v1/promotions/{opened.json()['id']}/approve", {"reason": "ok"})
    assert approval.status_code == 409, approval.content
    assert approval.json()["error"] == "version 1 is not signed by its uploader, and 'production' requires a signature"
    assert set_alias(owner, registered, 2, alias="production").status_code == 202


def test_only_configured_signers_can_be_named_and_only_by_an_admin(owner, admin, registered, ml_team):
    with pytest.raises(InvalidInput, match=r"^unknown signer\(s\) vendor; the trusted signers are ml-team$"):
        require(admin, registered, "vendor")
    from registry.errors import PermissionDenied

    with pytest.raises(PermissionDenied):
        require(owner, registered)


def test_the_refusal_is_a_conflict_with_the_requirement_in_its_detail(owner, admin, registered):
    assert owner.upload(registered, [("model.onnx", MODEL)]).status_code == 201
    alias = require(admin, registered)
    with pytest.raises(SignatureRequired) as refused:
        provenance.check_alias_signature(alias, ModelVersion.objects.get(version=1))
    assert refused.value.detail == {"require_signature": True, "trusted_signers": []}
    assert json.dumps(refused.value.detail)


def test_sign_versions_signs_the_ready_versions_validated_before_signing_existed(owner: Person, registered, capsys):
    from modelyard.cli import main

    for bias in (1.0, 2.0):
        assert owner.upload(registered, [("model.onnx", add_model_bytes(bias=bias))]).status_code == 201
    VersionSignature.objects.filter(version__version=1).delete()  # as a version from before this release

    assert main(["sign-versions"]) == 0

    assert capsys.readouterr().out == f"signed {registered} v1\n"
    version = ModelVersion.objects.get(version=1)
    assert provenance.version_provenance(version)["signed"] is True
    event = AuditEvent.objects.get(action="version.sign")
    assert (event.target, event.after["signed_by"][0]["kind"]) == (f"{registered}/1", "registry")
    assert main(["sign-versions"]) == 0
    assert capsys.readouterr().out == ""
