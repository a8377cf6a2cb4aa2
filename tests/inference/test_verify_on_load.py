"""Every load checks the version's signatures against the bytes the inference process read.

In-process runtimes driven pass by pass (as ``test_runtime_inprocess.py``), the real registry on the test
database, the local artifact folder, real keys. What an attacker with the bucket (and the database) could
change after validation is changed here, and the version must never serve.
"""

from __future__ import annotations

import hashlib
import io
import socket
from pathlib import Path

import numpy as np
import pytest

from inference.metrics import VERIFY_FAILURES
from modelyard.provenance import Signer, generate_private_key
from registry.models import AuditEvent, ModelFile, ModelVersion, SignatureKind, VersionSignature
from registry.provenance.services import registry_signer
from storage import get_storage
from tests.support.inference import sample
from tests.support.onnx_models import add_model_bytes
from tests.support.polling import reconcile_until
from tests.support.registry import artifact_path, create_model, promote, upload_versions
from tests.support.signing import key_pair, sha256

pytestmark = pytest.mark.django_db(transaction=True)


def serving(runtime) -> int | None:
    loaded = runtime.router.resolve("demo", None)
    return loaded.spec.version if loaded is not None else None


def failure(runtime, version: ModelVersion) -> str:
    reconcile_until(runtime, lambda: version.pk in runtime.status.failures, what="the load never failed")
    return runtime.status.failures[version.pk].error


def verify_failures(version: int) -> float:
    return VERIFY_FAILURES.labels("demo", str(version))._value.get()


@pytest.fixture
def v1_serving_v2_ready(owner, approver, make_runtime):
    create_model(owner)
    versions = upload_versions(owner, [1.0, 2.0])
    promote(owner, approver, 1)
    runtime = make_runtime()
    reconcile_until(runtime, lambda: serving(runtime) == 1, what="v1 never served")
    return runtime, versions


def test_a_byte_changed_in_storage_is_refused_on_every_host_audited_once_and_counted(
    owner, approver, make_runtime, v1_serving_v2_ready
):
    first, (_, v2) = v1_serving_v2_ready
    second = make_runtime("inproc-2")
    reconcile_until(second, lambda: serving(second) == 1, what="v1 never served on the second host")
    stored = artifact_path(v2)
    data = bytearray(stored.read_bytes())
    data[-1] ^= 0x01  # one bit of the last byte
    stored.write_bytes(bytes(data))
    counted = verify_failures(2)

    promote(owner, approver, 2)

    for runtime in (first, second):
        assert failure(runtime, v2).startswith("HashMismatch: sha256 mismatch for model.onnx: storage holds ")
        assert serving(runtime) == 1
    reconcile_until(first, lambda: first.status.failures[v2.pk].attempts >= 2, timeout=30, what="never retried")
    [event] = AuditEvent.objects.filter(action="version.verify_failed")
    assert (event.target, event.model_name, event.actor) == ("demo/2", "demo", f"inference:{event.after['worker']}")
    assert event.after["host"] == socket.gethostname()
    assert event.after["reason"].startswith("sha256 mismatch for model.onnx: storage holds ")
    assert verify_failures(2) - counted >= 3  # two hosts, one of them twice
    [worker] = [w for w in owner.get("/api/v1/fleet").json() if w["worker_id"] == first.worker_id]
    assert [(r["version"], r["state"]) for r in worker["loaded"]] == [(1, "ready"), (2, "failed")]


def test_bytes_and_recorded_digests_changed_together_are_refused_by_the_signature(owner, approver, v1_serving_v2_ready):
    runtime, (_, v2) = v1_serving_v2_ready
    forged = add_model_bytes(bias=9.0)
    artifact_path(v2).write_bytes(forged)
    # Someone with the database too: the recorded digests now agree with the forged bytes.
    ModelFile.objects.filter(version=v2).update(sha256=sha256(forged), size_bytes=len(forged))
    ModelVersion.objects.filter(pk=v2.pk).update(sha256=sha256(forged))

    promote(owner, approver, 2)

    assert failure(runtime, v2) == (
        "VerificationFailed: the registry signature does not match: "
        f"model.onnx: sha256 {sha256(forged)[:16]}… is not the signed {v2.sha256[:16]}…"
    )
    assert serving(runtime) == 1
    assert AuditEvent.objects.filter(action="version.verify_failed", target="demo/2").count() == 1


def test_a_version_without_its_registry_signature_is_not_loaded(owner, approver, v1_serving_v2_ready):
    runtime, (_, v2) = v1_serving_v2_ready
    VersionSignature.objects.filter(version=v2).delete()

    promote(owner, approver, 2)

    assert failure(runtime, v2) == (
        "VerificationFailed: demo v2 is not signed by the registry "
        "(validated before signing existed: `modelyard sign-versions` signs it)"
    )


def test_a_bundle_missing_from_storage_or_signed_by_another_key_is_refused(
    owner, approver, settings, v1_serving_v2_ready
):
    runtime, (_, v2) = v1_serving_v2_ready
    signature = VersionSignature.objects.get(version=v2, kind=SignatureKind.REGISTRY)
    get_storage().delete(signature.storage_key)
    promote(owner, approver, 2)
    assert failure(runtime, v2) == "VerificationFailed: the registry signature bundle is missing from storage"

    # Signed again by a key this host does not trust (someone else's registry): refused too.
    stranger = Signer(generate_private_key())
    bundle = stranger.sign({f.name: f.sha256 for f in v2.files.all()})
    get_storage().write(signature.storage_key, io.BytesIO(bundle))
    runtime.status.failures.clear()
    assert failure(runtime, v2) == (
        f"VerificationFailed: the registry signature does not match: signed by key {stranger.key_id[:16]}, "
        f"which is not trusted here (this host trusts the registry key(s) {registry_signer().key_id[:16]}: "
        "give every host the registry's key, MODELYARD_SIGNING_KEY, or its public key in MODELYARD_VERIFY_KEYS)"
    )


def test_after_a_key_rotation_old_versions_load_while_the_old_public_key_is_trusted(
    owner, approver, settings, make_runtime, tmp_path
):
    create_model(owner)
    [v1] = upload_versions(owner, [1.0])
    old = tmp_path / "old.pub.pem"
    old.write_bytes(registry_signer().public_pem)
    promote(owner, approver, 1)
    settings.SIGNING_KEY = generate_private_key()  # the registry signs with a new key from now on

    settings.VERIFY_KEYS = []
    refusing = make_runtime("without-the-old-key")
    assert "which is not trusted here" in failure(refusing, v1)

    settings.VERIFY_KEYS = [old]
    loading = make_runtime("with-the-old-key")
    reconcile_until(loading, lambda: serving(loading) == 1, what="v1 never loaded under the old key")
    x = sample()
    loaded = loading.router.resolve("demo", None)
    loaded.acquire()
    try:
        np.testing.assert_array_equal(loaded.run({"x": x}, ["y"])[0], x + np.float32(1.0))
    finally:
        loaded.release()


def test_an_uploaders_signature_is_checked_at_load_against_the_signers_trusted_now(
    owner, approver, settings, make_runtime, tmp_path
):
    ml_team = key_pair(tmp_path, "ml-team")
    settings.TRUSTED_SIGNERS = [("ml-team", ml_team.public_path)]
    create_model(owner)
    data = add_model_bytes(bias=3.0)
    bundle = ml_team.signer.sign({"model.onnx": hashlib.sha256(data).hexdigest()})
    assert owner.upload("demo", [("model.onnx", data), ("model.sig", bundle)]).status_code == 201
    promote(owner, approver, 1)
    v1 = ModelVersion.objects.get(model__name="demo", version=1)

    loads = make_runtime("trusting")
    reconcile_until(loads, lambda: serving(loads) == 1, what="the signed version never loaded")

    settings.TRUSTED_SIGNERS = []  # ml-team's key is no longer trusted on this host
    refuses = make_runtime("distrusting")
    assert failure(refuses, v1) == (
        "VerificationFailed: the uploader signature does not match: "
        f"signed by key {ml_team.signer.key_id[:16]}, which is not trusted here"
    )
    assert Path(settings.CACHE_DIR).exists()
