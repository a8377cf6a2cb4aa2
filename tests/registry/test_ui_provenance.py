"""Provenance in the web UI: a version's signers and what each inference process found of its bytes, an alias's
signature requirement set from the model page, and the candidate's signers on the promotion review."""

from __future__ import annotations

import hashlib

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from modelyard.provenance import Signer
from registry import serving
from registry.models import Alias, AuditEvent, DeriveJob, JobStatus, ModelVersion, Role, VersionStatus
from registry.serving import LoadedRow, LoadState, WorkerReport
from tests.support.onnx_models import add_model_bytes
from tests.support.people import Person, login_person
from tests.support.polling import eventually
from tests.support.registry import create_model
from tests.support.signing import KeyPair

pytestmark = pytest.mark.django_db

SIGNATURE_FORM = "/ui/models/demo/aliases/production/signature"


@pytest.fixture
def ada() -> Person:
    return login_person("ada", Role.APPROVER)


@pytest.fixture
def root() -> Person:
    return login_person("root", Role.ADMIN)


def upload(person: Person, model: bytes, signer: KeyPair | None = None) -> ModelVersion:
    files = [("model.onnx", model)]
    if signer is not None:
        files.append(("model.sig", signer.signer.sign({"model.onnx": hashlib.sha256(model).hexdigest()})))
    response = person.upload("demo", files)
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get(model__name="demo", version=response.json()["version"])
    assert version.status == VersionStatus.READY, version.errors
    return version


def report(worker_id: str, *rows: LoadedRow) -> None:
    serving.worker_heartbeat(
        WorkerReport(
            worker_id=worker_id, host="h", pid=1, device="cpu", provider="CPU", started_at=timezone.now(), loaded=rows
        )
    )


def test_the_version_page_lists_the_signers_and_each_hosts_check_of_the_bytes(mia, ml_team):
    create_model(mia)
    upload(mia, add_model_bytes(bias=1.0), signer=ml_team)
    refused = "VerificationFailed: the registry signature does not match: model.onnx: sha256 0123456789abcdef…"
    report("w-ok", LoadedRow(model="demo", version=1, state=LoadState.READY, aliases=("production",)))
    report("w-refused", LoadedRow(model="demo", version=1, state=LoadState.FAILED, error=refused, attempts=3))
    report("w-hash", LoadedRow(model="demo", version=1, state=LoadState.FAILED, error="HashMismatch: model.onnx"))
    report("w-other", LoadedRow(model="demo", version=1, state=LoadState.FAILED, error="Fail: cannot build"))
    report("w-idle")

    response = mia.client.get("/ui/models/demo/versions/1")

    assert response.status_code == 200
    html = response.content.decode()
    registry_key, uploader_key = Signer(django_settings.SIGNING_KEY).key_id, ml_team.signer.key_id
    for name, kind, key in (("modelyard", "registry", registry_key), ("ml-team", "uploader", uploader_key)):
        assert (
            f'<tr data-signer="{name}" data-kind="{kind}">\n'
            f'      <td class="wrap">{name}</td>\n'
            f"      <td>{kind}</td>\n"
            f'      <td class="mono small" title="{key}">{key[:16]}</td>\n'
            '      <td><span class="badge ok">yes</span></td>'
        ) in html
    assert 'id="provenance" data-signed="true"' in html
    checks = {worker.worker_id: check for worker, check in response.context["fleet_checks"]}
    assert checks == {
        "w-ok": "verified",
        "w-refused": "refused: the registry signature does not match: model.onnx: sha256 0123456789abcdef…",
        "w-hash": "refused: model.onnx",
        "w-other": "",
        "w-idle": "",
    }
    assert (
        '<li data-worker="w-refused" class="wrap">w-refused:\n      <span class="bad">refused: the registry '
        "signature does not match: model.onnx: sha256 0123456789abcdef…</span></li>"
    ) in html
    assert '<li data-worker="w-ok" class="wrap">w-ok:\n      <span class="badge ok">verified</span></li>' in html


def test_a_version_not_signed_yet_says_so(mia):
    create_model(mia)
    version = upload(mia, add_model_bytes(bias=1.0))
    version.signatures.all().delete()  # as a version validated before provenance existed

    response = mia.client.get("/ui/models/demo/versions/1")

    assert 'id="provenance" data-signed="false"' in response.content.decode()
    assert '<p class="muted" data-unsigned>Not signed.</p>' in response.content.decode()


def test_the_alias_settings_form_with_empty_trusted_signers_saves(root, ml_team):
    create_model(root)

    # As a browser sends the form with the box unticked and the signers left empty.
    response = root.client.post(SIGNATURE_FORM, {"trusted_signers": ""})

    assert (response.status_code, response["Location"]) == (302, "/ui/models/demo")
    production = Alias.objects.get(model__name="demo", name="production")
    assert (production.require_signature, production.trusted_signers) == (False, [])
    assert AuditEvent.objects.filter(action="alias.provenance").count() == 1
    page = root.client.get("/ui/models/demo").content.decode()
    assert "&#x27;production&#x27; no longer requires a signature." in page

    ticked = root.client.post(SIGNATURE_FORM, {"require_signature": "on", "trusted_signers": ""})
    assert ticked.status_code == 302
    production.refresh_from_db()
    assert (production.require_signature, production.trusted_signers) == (True, [])
    assert "requires a signature by any trusted signer." in root.client.get("/ui/models/demo").content.decode()

    named = root.client.post(SIGNATURE_FORM, {"trusted_signers": "ml-team"})  # naming a signer requires one
    assert named.status_code == 302
    production.refresh_from_db()
    assert (production.require_signature, production.trusted_signers) == (True, ["ml-team"])
    page = root.client.get("/ui/models/demo").content.decode()
    assert (
        '<td data-signature><span class="badge warn" title="only a version signed by its uploader (or derived from '
        'one) can be set">required</span> <span class="small">by ml-team</span></td>'
    ) in page
    assert 'name="trusted_signers" value="ml-team"' in page


def test_the_alias_settings_form_refuses_an_unknown_signer_and_a_non_admin(root, mia, ml_team):
    create_model(root)

    unknown = root.client.post(SIGNATURE_FORM, {"require_signature": "on", "trusted_signers": "ml-team, bob"})

    assert unknown.status_code == 400
    assert "unknown signer(s) bob; the trusted signers are ml-team" in unknown.content.decode()
    assert not Alias.objects.filter(require_signature=True).exists()
    refused = mia.client.post(SIGNATURE_FORM, {"require_signature": "on", "trusted_signers": ""})
    assert refused.status_code == 403
    assert "changing an alias&#x27;s signature requirement needs the admin role" in refused.content.decode()
    assert AuditEvent.objects.filter(action="access.denied", actor="mia").count() == 1
    assert not AuditEvent.objects.filter(action="alias.provenance").exists()
    # Only admins are shown the form, and it sets the model's aliases, not new ones.
    assert "alias-signatures" not in mia.client.get("/ui/models/demo").content.decode()
    assert root.client.post("/ui/models/demo/aliases/nope/signature", {"trusted_signers": ""}).status_code == 404


def test_the_review_shows_the_candidates_signers_and_the_aliases_requirement(mia, ada, root, ml_team):
    create_model(mia)
    upload(mia, add_model_bytes(bias=1.0))
    requested = mia.client.put(
        "/api/v1/models/demo/aliases/production", {"version": 1, "reason": "first"}, content_type="application/json"
    )
    assert requested.status_code == 202, requested.content
    production = root.client.patch(
        "/api/v1/models/demo/aliases/production", {"require_signature": True}, content_type="application/json"
    )
    assert production.status_code == 200, production.content

    review = ada.client.get(f"/ui/promotions/{requested.json()['id']}")

    assert review.status_code == 200
    html = review.content.decode()
    assert '<tr data-signer="modelyard" data-kind="registry">' in html
    assert 'data-signer="ml-team"' not in html
    assert (
        "<p id=\"signature-requirement\">'production' requires a signature by any trusted signer:\n"
        '      <span class="bad wrap">version 1 is not signed by its uploader, and &#x27;production&#x27; requires '
        "a signature</span></p>"
    ) in html
    promote_page = mia.client.get("/ui/models/demo/promote", {"alias": "production", "version": "1"})
    assert (
        '<p class="flash warn wrap" id="signature-problem">version 1 is not signed by its uploader, and '
        "&#x27;production&#x27; requires a signature</p>"
    ) in promote_page.content.decode()


@pytest.mark.django_db(transaction=True)  # the derive job runs on the in-process job thread, after commit
def test_a_derived_versions_page_shows_its_signed_derivation_statement(mia):
    create_model(mia)
    upload(mia, add_model_bytes(bias=1.0))
    job = mia.post("/api/v1/models/demo/versions/1/derive", {"recipe": "ort-optimized"})
    assert job.status_code == 202, job.content

    def validated() -> ModelVersion | None:
        derived = DeriveJob.objects.get(pk=job.json()["id"])
        assert derived.status != JobStatus.FAILED, derived.error
        found = ModelVersion.objects.filter(pk=derived.result_id).first()
        return found if found is not None and found.status == VersionStatus.READY else None

    child = eventually(validated, timeout=120)

    response = mia.client.get(f"/ui/models/demo/versions/{child.version}")

    derivation = response.context["provenance"]["derivation"]
    assert (derivation["parent"]["model"], derivation["parent"]["version"], derivation["verified"]) == ("demo", 1, True)
    html = response.content.decode()
    assert (
        '<p id="derivation-statement">Signed derivation statement: <strong>demo v2</strong> is\n'
        "    <strong>ort-optimized</strong>"
    ) in html
    assert '    of <a href="/ui/models/demo/versions/1">demo v1</a>\n    <span class="badge ok">verified</span>' in html
