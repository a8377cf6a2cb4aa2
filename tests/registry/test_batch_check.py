"""Validation's batching check: two samples run together and each alone, as the /v2 batcher would merge them.

Before, every model whose inputs and outputs had a dynamic first dimension had its concurrent requests
merged along it, whether or not it was a batch. Now validation records whether merging gives each
request its own answer (``batch_check``) and why (``batch_note``), and the version is served without
merging unless it does (``tests/compat/test_batch_safety.py`` serves such a model under load).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from onnxkit.validation import validate_bundle, validate_in_child
from tests.support.onnx_models import add_model, first_dim_model, fixed_add_model, mlp_model, string_parsing_model
from tests.support.text_models import text_model_bytes, tiny_tokenizer_json

pytestmark = pytest.mark.real_validation  # validation itself: no memo (tests/support/validation_memo.py)

NOT_A_BATCH = "the first dimension is not a batch"
A_BATCH = "the first dimension is a batch"


def validate(tmp_path: Path, model: bytes, *extras: tuple[str, bytes], time_limit: float | None = 60.0):
    for name, data in (("model.onnx", model), *extras):
        (tmp_path / name).write_bytes(data)
    names = {"model.onnx", *(name for name, _ in extras)}
    result = validate_bundle(tmp_path / "model.onnx", names, time_limit_seconds=time_limit)
    assert result.errors == []
    return result


def samples(rows: list[list[float]]) -> tuple[str, bytes]:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [len(rows), 4], "data": rows}]}
    return ("sample_inputs.json", json.dumps(body).encode())


def test_a_softmax_over_the_first_dimension_is_unsafe_to_merge(tmp_path):
    result = validate(tmp_path, first_dim_model("softmax0").SerializeToString())
    assert result.batch_check == "unsafe"
    assert result.batch_note == (
        "output 'y' of two synthetic samples run together differs from each run alone by up to 0.438 "
        f"(tolerance 0.0001): {NOT_A_BATCH}"
    )


def test_a_model_that_works_row_by_row_is_safe_to_merge(tmp_path):
    result = validate(tmp_path, first_dim_model("softmax1").SerializeToString())
    assert (result.batch_check, result.batch_note) == (
        "safe",
        f"two synthetic samples run together gave the outputs each gave alone (largest difference 0, "
        f"tolerance 0.0001): {A_BATCH}",
    )


def test_outputs_with_other_rows_than_the_requests_together_are_unsafe(tmp_path):
    result = validate(tmp_path, first_dim_model("doubled").SerializeToString())
    assert (result.batch_check, result.batch_note) == (
        "unsafe",
        "output 'y' has shape [4, 4] for two synthetic samples of 1 and 1 row(s) run together, not 2 rows: "
        "its first dimension is not a batch",
    )


def test_a_model_that_fails_on_two_samples_together_is_unsafe(tmp_path):
    result = validate(tmp_path, first_dim_model("one-row").SerializeToString())
    assert result.batch_check == "unsafe"
    assert result.batch_note.startswith("two synthetic samples fail when run together: ")
    assert "cannot be reshaped to the requested shape" in result.batch_note


def test_a_dynamically_quantized_model_is_safe_within_the_rounding_of_its_quantization(tmp_path):
    """int8-dynamic scales activations by the whole batch's range: merged rows round a little differently."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    (tmp_path / "fp32.onnx").write_bytes(mlp_model().SerializeToString())
    quantize_dynamic(str(tmp_path / "fp32.onnx"), str(tmp_path / "int8.onnx"), weight_type=QuantType.QInt8)
    result = validate(tmp_path, (tmp_path / "int8.onnx").read_bytes())
    assert result.batch_check == "safe", result.batch_note
    assert re.fullmatch(
        r"two synthetic samples run together gave the outputs each gave alone \(largest difference [0-9.]+, "
        r"tolerance [0-9.]+, 5% of the largest value for dynamic quantization\): the first dimension is a batch",
        result.batch_note,
    ), result.batch_note


def test_a_fixed_first_dimension_is_never_merged_and_not_run_again(tmp_path):
    result = validate(tmp_path, fixed_add_model(rows=2).SerializeToString())
    assert (result.batch_check, result.batch_note) == (
        "no-batch-dimension",
        "input 'x' has a fixed first dimension (2): requests are merged only along a dynamic first dimension of "
        "every input and output",
    )


def test_a_sample_of_several_rows_is_checked_in_two_halves(tmp_path):
    rows: list[list[float]] = [[0.5, 1, 2, 3], [4, 5, 6, 7], [-1, 0, 1, 2], [9, 8, 7, 6]]
    unsafe = validate(tmp_path, first_dim_model("softmax0").SerializeToString(), samples(rows))
    assert unsafe.batch_check == "unsafe"
    assert re.fullmatch(
        r"output 'y' of two halves of sample_inputs.json run together differs from each run alone by up to "
        rf"[0-9.]+ \(tolerance 0.0001\): {NOT_A_BATCH}",
        unsafe.batch_note,
    ), unsafe.batch_note
    safe = validate(tmp_path, add_model().SerializeToString(), samples(rows))
    assert safe.batch_check == "safe"
    assert safe.batch_note.startswith("two halves of sample_inputs.json run together gave the outputs each gave alone")


def test_a_sample_of_one_row_is_checked_with_a_variant_of_it(tmp_path):
    result = validate(tmp_path, first_dim_model("softmax0").SerializeToString(), samples([[1, 2, 3, 4]]))
    assert result.batch_check == "unsafe"
    assert result.batch_note.startswith("output 'y' of sample_inputs.json and a variant of it run together differs")


def test_a_text_version_is_checked_on_its_sample_texts_padded_alike(tmp_path):
    result = validate(tmp_path, text_model_bytes(), ("tokenizer.json", tiny_tokenizer_json()))
    assert result.batch_check == "safe", result.batch_note
    assert result.batch_note.startswith(
        "two halves of the sample texts tokenised by tokenizer.json run together gave the outputs each gave alone"
    )


def test_when_the_check_cannot_run_the_version_is_unchecked_and_says_why(tmp_path):
    result = validate(tmp_path, string_parsing_model().SerializeToString())
    assert (result.batch_check, result.batch_note) == (
        "unchecked",
        "the batching check could not run on synthetic strings; upload sample_inputs.json with two rows or more "
        "to check it",
    )


def test_the_check_is_skipped_when_it_would_not_fit_in_validation_time(tmp_path):
    result = validate(tmp_path, first_dim_model("softmax0").SerializeToString(), time_limit=1e-6)
    assert result.batch_check == "unchecked"
    assert re.fullmatch(
        r"the batching check was skipped: the test run took [0-9.]+ s, and the check needs about three times "
        r"that more, past the time validation has \(MODELYARD_VALIDATION_TIMEOUT_SECONDS\)",
        result.batch_note,
    ), result.batch_note


@pytest.mark.parametrize(("kind", "check"), [("softmax0", "unsafe"), ("softmax1", "safe")])
def test_the_validation_child_reports_the_check(tmp_path, kind, check):
    (tmp_path / "model.onnx").write_bytes(first_dim_model(kind).SerializeToString())
    result = validate_in_child(tmp_path / "model.onnx", {"model.onnx"}, timeout_seconds=60, memory_mb=2048)
    assert result.errors == []
    assert result.batch_check == check
    assert result.batch_note.endswith(NOT_A_BATCH if check == "unsafe" else A_BATCH)
