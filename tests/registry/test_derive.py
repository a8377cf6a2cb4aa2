"""Derived versions: each recipe keeps its promise, the result is a validated version with its parent and delta.

The derive job runs on the in-process job thread (the embedded default), so these tests commit
(``transaction=True``) and wait for the job row to finish.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from registry.models import AuditEvent, DeriveJob, JobStatus, ModelVersion, VersionStatus
from storage import get_storage
from tests.support.onnx_models import add_model_bytes, classifier_model, masked_model, mlp_model
from tests.support.people import Person
from tests.support.polling import eventually

pytestmark = pytest.mark.django_db(transaction=True)


def upload(person: Person, model: str, files: list[tuple[str, bytes]]) -> ModelVersion:
    response = person.upload(model, files)
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get(model__name=model, version=response.json()["version"])
    assert version.status == VersionStatus.READY, version.errors
    return version


def finished(job_id: int) -> DeriveJob:
    def done() -> DeriveJob | None:
        job = DeriveJob.objects.get(pk=job_id)
        return job if job.status in (JobStatus.SUCCEEDED, JobStatus.FAILED) else None

    return eventually(done, timeout=120, what=lambda: str(DeriveJob.objects.get(pk=job_id).status))


def derive(person: Person, model: str, version: int, recipe: Any, options: Any = None) -> Any:
    body = {"recipe": recipe} if options is None else {"recipe": recipe, "options": options}
    return person.post(f"/api/v1/models/{model}/versions/{version}/derive", body)


def derived_version(person: Person, model: str, version: int, recipe: str, options: Any = None) -> ModelVersion:
    response = derive(person, model, version, recipe, options)
    assert response.status_code == 202, response.content
    assert response.json()["status"] in ("pending", "running", "succeeded")
    assert response.json()["recipe"] == recipe
    job = finished(response.json()["id"])
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert job.result is not None

    def validated() -> ModelVersion | None:  # validation runs after the job's commit, on the same thread
        version = ModelVersion.objects.get(pk=job.result_id)
        return version if version.status in (VersionStatus.READY, VersionStatus.FAILED) else None

    return eventually(validated, timeout=60)


def stored_model(version: ModelVersion) -> bytes:
    with get_storage().open(version.model_file.storage_key) as stream:
        return stream.read()


def outputs(model_bytes: bytes, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_fp16_keeps_float32_io_and_halves_the_weights(owner: Person, registered: str) -> None:
    parent = upload(owner, registered, [("model.onnx", classifier_model().SerializeToString())])

    child = derived_version(owner, registered, parent.version, "fp16")

    assert child.status == VersionStatus.READY, child.errors
    assert child.derived_from_id == parent.pk
    assert child.recipe["recipe"] == "fp16"
    assert child.recipe["options"]["optimize"] is False
    assert child.recipe["libraries"]["onnxconverter-common"] >= "1.16"
    built = onnx.load_from_string(stored_model(child))
    assert {init.data_type for init in built.graph.initializer} == {TensorProto.FLOAT16}
    assert [value.type.tensor_type.elem_type for value in built.graph.input] == [TensorProto.FLOAT]
    assert [value.type.tensor_type.elem_type for value in built.graph.output] == [TensorProto.FLOAT]
    x = np.random.default_rng(5).standard_normal((16, 64)).astype(np.float32)
    expected, got = outputs(stored_model(parent), x), outputs(stored_model(child), x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=0.05, rtol=0.01)
    # The delta the job measured (synthetic inputs: the parent has no sample_inputs.json)
    delta = child.accuracy
    assert delta["against"] == parent.version and delta["inputs"] == "synthetic"
    scores = delta["outputs"]["scores"]
    assert scores["cosine"] > 0.9999 and scores["top1_agreement"] == 1.0
    assert 0 < scores["max_abs_diff"] < 0.05 and 0 < scores["mean_abs_diff"] <= scores["max_abs_diff"]
    # shown in the API, audited
    body = owner.get(f"/api/v1/models/{registered}/versions/{child.version}").json()
    assert body["derived_from"] == parent.version and body["accuracy"] == delta and body["recipe"] == child.recipe
    event = AuditEvent.objects.get(action="version.derive")
    assert event.target == f"{registered}/{child.version}"
    assert event.after["derived_from"] == parent.version and event.after["recipe"]["recipe"] == "fp16"
    assert event.actor == "owner"


def test_fp16_of_a_model_that_casts_its_mask_to_float_loads(owner: Person, registered: str) -> None:
    """BERT exports cast the attention mask to float; the converter alone leaves that Cast's target at FLOAT."""
    parent = upload(owner, registered, [("model.onnx", masked_model().SerializeToString())])

    child = derived_version(owner, registered, parent.version, "fp16")

    assert child.status == VersionStatus.READY, child.errors
    [cast] = [node for node in onnx.load_from_string(stored_model(child)).graph.node if node.output == ["m"]]
    assert cast.attribute[0].i == TensorProto.FLOAT16
    feeds: dict[str, np.ndarray] = {
        "x": np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32),
        "mask": np.ones((4, 8), np.int64),
    }
    feeds["mask"][:, 6:] = 0
    expected = ort.InferenceSession(stored_model(parent), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ort.InferenceSession(stored_model(child), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, expected, atol=0.05, rtol=0.01)
    assert child.accuracy["worst"]["cosine"] > 0.9999


def test_fp16_after_the_transformer_optimiser(owner: Person, registered: str) -> None:
    parent = upload(owner, registered, [("model.onnx", mlp_model().SerializeToString())])

    child = derived_version(owner, registered, parent.version, "fp16", {"optimize": True, "model_type": "bert"})

    assert child.status == VersionStatus.READY, child.errors
    assert child.recipe["options"]["optimize"] is True
    built = onnx.load_from_string(stored_model(child))
    assert TensorProto.FLOAT16 in {init.data_type for init in built.graph.initializer}
    assert [value.type.tensor_type.elem_type for value in built.graph.output] == [TensorProto.FLOAT]
    assert child.accuracy["worst"]["cosine"] > 0.999


def test_int8_dynamic_is_smaller_and_quantised(owner: Person, registered: str) -> None:
    parent = upload(owner, registered, [("model.onnx", mlp_model().SerializeToString())])

    child = derived_version(owner, registered, parent.version, "int8-dynamic", {"per_channel": True})

    assert child.status == VersionStatus.READY, child.errors
    assert child.size_bytes < parent.size_bytes / 2
    ops = {node.op_type for node in onnx.load_from_string(stored_model(child)).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops or "QuantizeLinear" in ops, ops
    assert child.recipe["options"] == {"weight_type": "qint8", "per_channel": True, "op_types": []}
    x = np.random.default_rng(6).standard_normal((32, 32)).astype(np.float32)
    expected, got = outputs(stored_model(parent), x), outputs(stored_model(child), x)
    cosine = float(np.dot(expected.ravel(), got.ravel()) / np.linalg.norm(expected) / np.linalg.norm(got))
    assert cosine > 0.99
    assert child.accuracy["worst"]["cosine"] > 0.99
    assert child.accuracy["outputs"]["y"]["top1_agreement"] >= 0.75


def test_ort_optimized_loads_and_matches(owner: Person, registered: str) -> None:
    parent = upload(owner, registered, [("model.onnx", classifier_model().SerializeToString())])

    child = derived_version(owner, registered, parent.version, "ort-optimized", {"level": "extended"})

    assert child.status == VersionStatus.READY, child.errors
    ops = [node.op_type for node in onnx.load_from_string(stored_model(child)).graph.node]
    assert ops == ["Gemm"]  # MatMul + Add fused
    x = np.random.default_rng(7).standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_allclose(outputs(stored_model(child), x), outputs(stored_model(parent), x), atol=1e-5)
    assert child.accuracy["worst"]["max_abs_diff"] < 1e-5


def test_the_delta_uses_sample_inputs_and_extras_carry_over(owner: Person, registered: str) -> None:
    rows = np.random.default_rng(8).standard_normal((3, 64)).astype(np.float32)
    samples = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 64], "data": rows.ravel().tolist()}]}
    files = [
        ("model.onnx", classifier_model().SerializeToString()),
        ("sample_inputs.json", json.dumps(samples).encode()),
    ]
    parent = upload(owner, registered, files)

    child = derived_version(owner, registered, parent.version, "fp16")

    assert child.accuracy["inputs"] == "sample_inputs.json"
    assert sorted(child.files.values_list("name", flat=True)) == ["model.onnx", "sample_inputs.json"]
    expected, got = outputs(stored_model(parent), rows), outputs(stored_model(child), rows)
    assert child.accuracy["outputs"]["scores"]["max_abs_diff"] == pytest.approx(
        float(np.abs(expected.astype(np.float64) - got).max()), rel=1e-6
    )


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"recipe": "int4"}, 'unknown recipe "int4"; recipes are fp16, int8-dynamic, ort-optimized'),
        ({"recipe": ["fp16"]}, 'unknown recipe ["fp16"]; recipes are fp16, int8-dynamic, ort-optimized'),
        ({"recipe": {"fp16": True}}, 'unknown recipe {"fp16": true}; recipes are fp16, int8-dynamic, ort-optimized'),
        (
            {"recipe": "fp16", "options": {"turbo": True}},
            "unknown option(s) for fp16: turbo; its options are hidden_size, model_type, num_heads, op_block_list, "
            "optimize",
        ),
        (
            {"recipe": "int8-dynamic", "options": {"weight_type": "int4"}},
            "option 'weight_type' must be one of qint8, quint8",
        ),
        ({"recipe": "ort-optimized", "options": {"level": 3}}, "option 'level' must be one of basic, extended, all"),
        ({"recipe": "fp16", "options": [1]}, "options must be a JSON object"),
    ],
)
def test_unknown_recipes_and_options_are_refused(owner: Person, registered: str, body: Any, error: str) -> None:
    parent = upload(owner, registered, [("model.onnx", add_model_bytes())])

    response = owner.post(f"/api/v1/models/{registered}/versions/{parent.version}/derive", body)

    assert response.status_code == 400, response.content
    assert response.json()["error"] == error
    assert not DeriveJob.objects.exists()


@pytest.mark.parametrize(
    ("options", "error"),
    [
        (
            {"op_types": ["MatMul", "Add", "Gemm"]},
            "option 'op_types' lists 3 names; at most 2 (MODELYARD_DERIVE_MAX_OPTION_ITEMS)",
        ),
        (
            {"op_types": ["MatMul", "LayerNormalization"]},
            "option 'op_types': a name is longer than 8 characters (MODELYARD_DERIVE_MAX_OPTION_ITEM_CHARS)",
        ),
    ],
)
def test_option_lists_past_their_limits_are_refused_naming_the_setting(
    owner: Person, registered: str, settings: Any, options: Any, error: str
) -> None:
    settings.DERIVE_MAX_OPTION_ITEMS = 2
    settings.DERIVE_MAX_OPTION_ITEM_CHARS = 8
    parent = upload(owner, registered, [("model.onnx", add_model_bytes())])

    response = derive(owner, registered, parent.version, "int8-dynamic", options)

    assert response.status_code == 400, response.content
    assert response.json() == {"error": error, "detail": None}
    assert not DeriveJob.objects.exists()
    assert not AuditEvent.objects.filter(action="version.derive.request").exists()
    # Within both limits the same option is taken (and the job waited for, validation included).
    child = derived_version(owner, registered, parent.version, "int8-dynamic", {"op_types": ["MatMul", "Add"]})
    assert child.recipe["options"]["op_types"] == ["MatMul", "Add"]


def test_only_a_ready_version_is_derived_from(owner: Person, registered: str) -> None:
    response = owner.upload(registered, [("model.onnx", b"\x08\x0a" + b"garbage" * 3)])
    assert response.status_code in (201, 400)
    failed = upload(owner, registered, [("model.onnx", add_model_bytes())])
    ModelVersion.objects.filter(pk=failed.pk).update(status=VersionStatus.FAILED)

    response = derive(owner, registered, failed.version, "fp16")

    assert response.status_code == 409
    assert response.json()["error"] == f"version {failed.version} is failed; only a ready version can be derived from"


def test_a_viewer_may_not_derive(owner: Person, outsider: Person, registered: str) -> None:
    parent = upload(owner, registered, [("model.onnx", add_model_bytes())])

    assert derive(outsider, registered, parent.version, "fp16").status_code == 403
    assert owner.get(f"/api/v1/models/{registered}/versions/{parent.version}/derive").json() == []


def test_a_derivation_past_its_time_limit_fails_naming_the_setting(
    owner: Person, registered: str, settings: Any
) -> None:
    parent = upload(owner, registered, [("model.onnx", mlp_model().SerializeToString())])
    settings.DERIVE_TIMEOUT_SECONDS = 0.2  # not even enough to import ONNX Runtime

    response = derive(owner, registered, parent.version, "int8-dynamic")

    job = finished(response.json()["id"])
    assert job.status == JobStatus.FAILED and job.result is None
    assert job.error.startswith("the derivation stopped after 0.2 s (MODELYARD_DERIVE_TIMEOUT_SECONDS) while "), (
        job.error
    )
    assert ModelVersion.objects.filter(model__name=registered).count() == 1
    assert AuditEvent.objects.get(action="version.derive.fail").after["error"] == job.error
    # and the job reads back through the API
    body = owner.get(f"/api/v1/derive-jobs/{job.pk}").json()
    assert body["status"] == "failed" and body["error"] == job.error and body["version"] is None


def test_a_derivation_past_its_memory_limit_fails_naming_the_setting(
    owner: Person, registered: str, settings: Any
) -> None:
    # 64 MB of weights: loaded, converted and run twice for the delta, far past 256 MB
    parent = upload(owner, registered, [("model.onnx", mlp_model(features=4096, hidden=4096).SerializeToString())])
    settings.DERIVE_MEMORY_MB = 256

    response = derive(owner, registered, parent.version, "fp16")

    job = finished(response.json()["id"])
    assert job.status == JobStatus.FAILED
    assert job.error.startswith(
        "the derivation stopped: it needed more than 256 MB of memory (MODELYARD_DERIVE_MEMORY_MB)"
    ), job.error


def test_jobs_whose_worker_was_lost_end_failed(owner: Person, registered: str, settings: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from registry import tasks
    from registry.models import VersionBenchmark

    parent = upload(owner, registered, [("model.onnx", add_model_bytes())])
    settings.DERIVE_TIMEOUT_SECONDS = 60
    settings.BENCHMARK_TIMEOUT_SECONDS = 60
    long_ago = timezone.now() - timedelta(seconds=60 + tasks.LOST_JOB_GRACE_SECONDS + 5)
    # What a worker killed mid-run leaves behind: rows claimed, never finished.
    lost = DeriveJob.objects.create(source=parent, recipe="fp16", status=JobStatus.RUNNING, started_at=long_ago)
    recent = DeriveJob.objects.create(source=parent, recipe="fp16", status=JobStatus.RUNNING, started_at=timezone.now())
    VersionBenchmark.objects.filter(version=parent).update(status=JobStatus.RUNNING, started_at=long_ago)

    swept = tasks.fail_lost_jobs()

    assert swept == {"derive": [lost.pk], "benchmarks": [VersionBenchmark.objects.get(version=parent).pk]}
    lost.refresh_from_db()
    recent.refresh_from_db()
    assert lost.status == JobStatus.FAILED and recent.status == JobStatus.RUNNING
    assert lost.error == "the derivation was lost: the worker running it stopped before it finished; derive again"
    bench = VersionBenchmark.objects.get(version=parent)
    assert bench.status == JobStatus.FAILED and bench.error.startswith("the benchmark was lost")
    assert tasks.fail_lost_jobs() == {"derive": [], "benchmarks": []}
