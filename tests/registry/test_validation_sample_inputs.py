"""The test run of validation on an upload's own ``sample_inputs.json``, and models that parse their string inputs.

Validation fills string inputs with ``"a"``, which a model that parses numbers from its strings (as
Triton's ``simple_string`` does) cannot read. Such a model is not broken: without sample inputs the
failed synthetic run is a warning, and with them the run uses them, so a real failure still fails.
"""

from __future__ import annotations

import json

import pytest

from tests.support.onnx_models import add_model_bytes, string_parsing_model, unrunnable_model

pytestmark = [pytest.mark.django_db, pytest.mark.real_validation]  # validation itself: no memo

MODEL = ("model.onnx", string_parsing_model().SerializeToString())


def samples(*inputs: dict) -> tuple[str, bytes]:
    return ("sample_inputs.json", json.dumps({"inputs": list(inputs)}).encode())


def text(data: list, shape: list | None = None) -> dict:
    return {"name": "text", "datatype": "BYTES", "shape": shape or [len(data) // 2, 2], "data": data}


def upload(person, model, files) -> dict:
    response = person.upload(model, files)
    assert response.status_code == 201, response.content
    return person.get(f"/api/v1/models/{model}/versions/{response.json()['version']}").json()


def test_a_string_parsing_model_without_samples_is_ready_with_a_warning(owner, registered):
    body = upload(owner, registered, [MODEL])
    assert body["status"] == "ready", body["errors"]
    assert body["errors"] == []
    [warning] = body["warnings"]
    assert warning.startswith(
        "the test run on synthetic inputs failed: 6 : RUNTIME_EXCEPTION : Non-zero status code returned while "
        "running Cast node"
    )
    assert warning.endswith(
        'The model takes string input(s) text, which validation fills with "a"; upload sample_inputs.json '
        "(a /v2 JSON inference request) with the version to test it on real inputs"
    )


def test_a_string_parsing_model_runs_on_its_sample_inputs(owner, registered):
    body = upload(owner, registered, [MODEL, samples(text(["1", "22", "-3", "40"]))])
    assert body["status"] == "ready", body["errors"]
    assert body["warnings"] == []


def test_sample_inputs_the_model_cannot_run_fail_the_version(owner, registered):
    body = upload(owner, registered, [MODEL, samples(text(["1", "twenty-two"]))])
    assert body["status"] == "failed"
    [error] = body["errors"]
    assert error.startswith("ONNX Runtime could not run the model on sample_inputs.json: ")
    assert "Cast" in error


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "sample_inputs.json: not valid JSON: Expecting property name enclosed in double quotes"),
        (b'{"inputs": []}', "sample_inputs.json: it needs a non-empty 'inputs' list, as a /v2 inference request has"),
        (
            json.dumps({"inputs": [text(["1", "2"]), text(["3", "4"])]}).encode(),
            "sample_inputs.json: input 'text' appears twice",
        ),
        (
            json.dumps({"inputs": [{"name": "words", "datatype": "BYTES", "shape": [1], "data": ["1"]}]}).encode(),
            "sample_inputs.json: unknown input 'words'; the model takes text",
        ),
        (
            json.dumps({"inputs": [{"name": "text", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}]}).encode(),
            "sample_inputs.json: input 'text': expected datatype BYTES, got INT32",
        ),
        (
            json.dumps({"inputs": [text(["1", "2", "3"], shape=[1, 3])]}).encode(),
            "sample_inputs.json: input 'text': expected shape [-1, 2], got [1, 3]",
        ),
        (
            json.dumps({"inputs": [text(["1", "2", "3"], shape=[2, 2])]}).encode(),
            "sample_inputs.json: input 'text': shape [2, 2] needs 4 values, got 3",
        ),
        (
            json.dumps({"inputs": [text([1, 2])]}).encode(),
            "sample_inputs.json: input 'text': BYTES data must be strings",
        ),
        (b'{"inputs": [{"name": "text", "data": ' + b"[" * 5000 + b"]" * 5000 + b"}]}", None),
    ],
    ids=["not-json", "no-inputs", "twice", "unknown-input", "datatype", "shape", "count", "not-strings", "deep"],
)
def test_sample_inputs_that_do_not_fit_the_model_fail_naming_the_problem(owner, registered, content, message):
    body = upload(owner, registered, [MODEL, ("sample_inputs.json", content)])
    assert body["status"] == "failed"
    [error] = body["errors"]
    assert error.startswith("sample_inputs.json: ")
    if message is not None:
        assert error.startswith(message), error


def test_a_model_without_string_inputs_still_fails_when_its_synthetic_run_fails(owner, registered):
    body = upload(owner, registered, [("model.onnx", unrunnable_model().SerializeToString())])
    assert body["status"] == "failed"
    assert body["errors"][0].startswith("ONNX Runtime could not run the model on synthetic inputs:")


def test_sample_inputs_of_a_numeric_model_are_used_for_its_test_run(owner, registered):
    x = {"name": "x", "datatype": "FP32", "shape": [2, 4], "data": [1, 2, 3, 4, 5, 6, 7, 8]}
    body = upload(owner, registered, [("model.onnx", add_model_bytes()), samples(x)])
    assert body["status"] == "ready", body["errors"]
    wrong = {"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}
    body = upload(owner, registered, [("model.onnx", add_model_bytes(bias=2.0)), samples(wrong)])
    assert body["errors"] == ["sample_inputs.json: input 'x': expected shape [-1, 4], got [1, 3]"]
