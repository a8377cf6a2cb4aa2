"""Signed provenance over the REST API: the registry's keys, a version's signers, the bundles, uploaders' signatures,
and aliases that require one."""

from __future__ import annotations

import hashlib

import pytest
from django.conf import settings as django_settings
from django.test import Client

from modelyard.provenance import Signer, Trust, generate_private_key, verify_bundle
from registry.models import Alias, AuditEvent, ModelVersion, Role, VersionStatus
from tests.support.onnx_models import add_model_bytes
from tests.support.people import Person, make_person
from tests.support.uploads import stored_keys

pytestmark = pytest.mark.django_db

VERSIONS = "/api/v1/models/demo/versions"
STAGING = "/api/v1/models/demo/aliases/staging"
MODEL = add_model_bytes(bias=1.0)
MODEL_SHA256 = hashlib.sha256(MODEL).hexdigest()


@pytest.fixture
def admin() -> Person:
    return make_person("root", Role.ADMIN)


def registry_key() -> Signer:
    return Signer(django_settings.SIGNING_KEY)


def upload_ready(person: Person, files: list[tuple[str, bytes]]) -> int:
    response = person.upload("demo", files)  # validation runs as the upload's transaction commits
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get(model__name="demo", version=response.json()["version"])
    assert version.status == VersionStatus.READY, version.errors
    return version.version


def test_signing_keys_lists_the_registry_key_and_the_trusted_signers(outsider, ml_team):
    response = outsider.get("/api/v1/signing-keys")

    assert response.status_code == 200
    current = registry_key()
    assert response.json() == {
        "keys": [{"id": current.key_id, "name": "modelyard", "current": True, "pem": current.public_pem.decode()}],
        "trusted_signers": [{"name": "ml-team", "kind": "key", "id": ml_team.signer.key_id}],
    }


def test_signing_keys_and_provenance_need_a_signed_in_user(owner, registered):
    upload_ready(owner, [("model.onnx", MODEL)])
    for path in ("/api/v1/signing-keys", f"{VERSIONS}/1/provenance", f"{VERSIONS}/1/download?file=model.sig"):
        response = Client().get(path)
        assert response.status_code == 401, path
        assert response.json()["error"] == "authentication required: send 'Authorization: Bearer <token>'"


def test_a_fresh_ready_version_is_signed_by_the_registry(owner, outsider, registered):
    upload_ready(owner, [("model.onnx", MODEL)])

    response = outsider.get(f"{VERSIONS}/1/provenance")

    assert response.status_code == 200
    body = response.json()
    assert (body["signed"], body["derivation"], body["problems"]) == (True, None, [])
    assert body["signers"] == [
        {"name": "modelyard", "key_id": registry_key().key_id, "kind": "registry", "verified": True}
    ]
    assert outsider.get(f"{VERSIONS}/9/provenance").status_code == 404


def test_download_model_sig_is_the_registrys_bundle_over_the_files(owner, outsider, registered):
    upload_ready(owner, [("model.onnx", MODEL)])

    response = outsider.get(f"{VERSIONS}/1/download?file=model.sig")

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == 'attachment; filename="model.sig"'
    data = response.content
    assert response["X-Content-SHA256"] == hashlib.sha256(data).hexdigest()
    trust = Trust()
    trust.add_key("registry", registry_key().public_pem)
    verified = verify_bundle(data, trust)
    assert (verified.signer, verified.key_id) == ("registry", registry_key().key_id)
    assert verified.digests == {"model.onnx": MODEL_SHA256}
    # The model itself still downloads as before.
    assert outsider.get(f"{VERSIONS}/1/download").headers["X-Content-SHA256"] == MODEL_SHA256


def test_download_of_a_bundle_the_version_lacks_is_404(owner, outsider, registered):
    upload_ready(owner, [("model.onnx", MODEL)])

    for name, kind in (("uploader.sig", "uploader"), ("derivation.sig", "derivation")):
        response = outsider.get(f"{VERSIONS}/1/download?file={name}")
        assert response.status_code == 404
        assert response.json()["error"] == f"version 1 has no {kind} signature ('{name}')"
    missing = outsider.get(f"{VERSIONS}/1/download?file=other.sig")
    assert missing.json()["error"] == "version 1 of model 'demo' has no file 'other.sig'"


def test_an_upload_signed_by_a_trusted_uploader_has_two_signers(owner, outsider, registered, ml_team):
    bundle = ml_team.signer.sign({"model.onnx": MODEL_SHA256})

    upload_ready(owner, [("model.onnx", MODEL), ("model.sig", bundle)])

    body = outsider.get(f"{VERSIONS}/1/provenance").json()
    assert (body["signed"], body["problems"]) == (True, [])
    assert sorted(body["signers"], key=lambda s: s["kind"]) == [
        {"name": "modelyard", "key_id": registry_key().key_id, "kind": "registry", "verified": True},
        {"name": "ml-team", "key_id": ml_team.signer.key_id, "kind": "uploader", "verified": True},
    ]
    # The bundle is not a file of the version; it downloads as uploader.sig, byte for byte.
    assert [f["name"] for f in outsider.get(f"{VERSIONS}/1").json()["files"]] == ["model.onnx"]
    uploaded = outsider.get(f"{VERSIONS}/1/download?file=uploader.sig")
    assert (uploaded.status_code, uploaded.content) == (200, bundle)


def test_an_upload_signed_by_an_untrusted_key_is_refused_and_leaves_nothing(owner, registered, ml_team):
    stranger = Signer(generate_private_key())
    bundle = stranger.sign({"model.onnx": MODEL_SHA256})

    response = owner.upload("demo", [("model.onnx", MODEL), ("model.sig", bundle)])

    assert response.status_code == 400
    assert response.json()["error"] == f"model.sig: signed by key {stranger.key_id[:16]}, which is not trusted here"
    assert not ModelVersion.objects.exists()
    assert stored_keys() == []


def test_an_upload_whose_bundle_signs_other_bytes_is_refused(owner, registered, ml_team):
    bundle = ml_team.signer.sign({"model.onnx": hashlib.sha256(b"other bytes").hexdigest()})

    response = owner.upload("demo", [("model.onnx", MODEL), ("model.sig", bundle)])

    assert response.status_code == 400
    other = hashlib.sha256(b"other bytes").hexdigest()
    assert response.json()["error"] == (
        f"model.sig: model.onnx: sha256 {MODEL_SHA256[:16]}… is not the signed {other[:16]}…"
    )
    assert not ModelVersion.objects.exists()
    assert stored_keys() == []


def test_admin_sets_an_aliases_signature_requirement(admin, registered, ml_team):
    response = admin.patch(STAGING, {"require_signature": True, "trusted_signers": ["ml-team"]})

    assert response.status_code == 200, response.content
    assert (response.json()["require_signature"], response.json()["trusted_signers"]) == (True, ["ml-team"])
    alias = Alias.objects.get(model__name="demo", name="staging")
    assert (alias.require_signature, alias.trusted_signers) == (True, ["ml-team"])
    event = AuditEvent.objects.get(action="alias.provenance")
    assert (event.actor, event.target) == ("root", "demo@staging")
    assert (event.before, event.after) == (
        {"require_signature": False, "trusted_signers": []},
        {"require_signature": True, "trusted_signers": ["ml-team"]},
    )
    # Every alias answer carries both fields.
    [production, staging] = sorted(admin.get("/api/v1/models/demo/aliases").json(), key=lambda a: a["alias"])
    assert (production["require_signature"], production["trusted_signers"]) == (False, [])
    assert (staging["require_signature"], staging["trusted_signers"]) == (True, ["ml-team"])

    cleared = admin.patch(STAGING, {"require_signature": False, "trusted_signers": []})
    assert (cleared.json()["require_signature"], cleared.json()["trusted_signers"]) == (False, [])


def test_only_an_admin_sets_the_signature_requirement(owner, outsider, registered):
    refused = owner.patch(STAGING, {"require_signature": True})
    assert refused.status_code == 403
    assert refused.json()["error"] == "changing an alias's signature requirement needs the admin role"
    viewer = outsider.patch(STAGING, {"require_signature": True})
    assert viewer.status_code == 403
    assert viewer.json()["error"] == "this action needs the maintainer or admin role"
    assert not Alias.objects.filter(name="staging").exists()
    assert not AuditEvent.objects.filter(action="alias.provenance").exists()


def test_bad_signature_settings_are_400(admin, registered, ml_team):
    unknown = admin.patch(STAGING, {"trusted_signers": ["ml-team", "bob"]})
    assert unknown.status_code == 400
    assert unknown.json()["error"] == "unknown signer(s) bob; the trusted signers are ml-team"
    not_bool = admin.patch(STAGING, {"require_signature": "maybe"})
    assert (not_bool.status_code, not_bool.json()["error"]) == (400, "require_signature: Must be a valid boolean.")
    with_flags = admin.patch(STAGING, {"require_signature": True, "served": True})
    assert with_flags.status_code == 400
    assert with_flags.json()["error"] == (
        "send the policy (max_slowdown_percent, min_cosine, max_abs_diff), the signature requirement "
        "(require_signature, trusted_signers) and the cache without protected or served"
    )
    assert not Alias.objects.filter(name="staging").exists()


def test_policy_and_signature_requirement_are_set_together(admin, registered, ml_team):
    response = admin.patch(STAGING, {"max_slowdown_percent": 5, "trusted_signers": ["ml-team"]})

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["max_slowdown_percent"], body["require_signature"], body["trusted_signers"]) == (
        5.0,
        True,
        ["ml-team"],
    )
    assert list(AuditEvent.objects.filter(action__startswith="alias.").values_list("action", flat=True)) == [
        "alias.provenance",
        "alias.policy",
    ]


def test_an_alias_that_requires_a_signature_refuses_an_unsigned_version(owner, admin, registered, ml_team):
    upload_ready(owner, [("model.onnx", MODEL)])
    signed_model = add_model_bytes(bias=2.0)
    bundle = ml_team.signer.sign({"model.onnx": hashlib.sha256(signed_model).hexdigest()})
    upload_ready(owner, [("model.onnx", signed_model), ("model.sig", bundle)])
    assert admin.patch(STAGING, {"require_signature": True}).status_code == 200

    refused = owner.client.put(
        STAGING, {"version": 1}, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {owner.token}"
    )

    assert refused.status_code == 409
    assert refused.json() == {
        "error": "version 1 is not signed by its uploader, and 'staging' requires a signature",
        "detail": {"require_signature": True, "trusted_signers": []},
    }
    assert Alias.objects.get(name="staging").version is None
    moved = owner.client.put(
        STAGING, {"version": 2}, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {owner.token}"
    )
    assert (moved.status_code, moved.json()["version"]) == (200, 2)
