"""Triton's statistics, classification and model repository extensions over REST, with the real tritonclient.http.

The package's server (``tests/support/v2server.py``) is shared by every test of ``tests/compat``,
so statistics are compared before and after what a test sends, on a model no other test in this
file sends to meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.v2server import LABELS, MODELS, V2Server

EXTENSIONS = [
    "binary_tensor_data",
    "classification",
    "model_configuration",
    "model_repository",
    "parameters",
    "statistics",
]


@pytest.fixture
def client(v2: V2Server) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(v2.url) as triton:
        yield triton


def x_input(x: np.ndarray, name: str = "x") -> httpclient.InferInput:
    item = httpclient.InferInput(name, list(x.shape), "FP32")
    item.set_data_from_numpy(x)
    return item


def stats_of(client: httpclient.InferenceServerClient, model: str, version: str = "") -> dict[str, Any]:
    [stats] = client.get_inference_statistics(model, version)["model_stats"]
    return stats


def test_server_metadata_advertises_exactly_the_extensions_served(client):
    assert client.get_server_metadata()["extensions"] == EXTENSIONS


# --- statistics -------------------------------------------------------------------------------------------


def test_statistics_count_the_requests_sent(client):
    before = stats_of(client, "batchy")
    started_ms = time.time_ns() // 1_000_000
    rows = [1, 2, 3, 1, 1]
    for count in rows:
        x = np.full((count, 4), count, np.float32)
        np.testing.assert_array_equal(client.infer("batchy", [x_input(x)]).as_numpy("y"), x + 0.5)
    after = stats_of(client, "batchy")

    def grew(path: str) -> int:
        a, b = after["inference_stats"], before["inference_stats"]
        return a[path]["count"] - b[path]["count"]

    assert (after["name"], after["version"]) == ("batchy", "1")
    assert grew("success") == len(rows)
    assert grew("fail") == 0
    assert grew("queue") == grew("compute_input") == grew("compute_infer") == grew("compute_output") == len(rows)
    assert after["inference_count"] - before["inference_count"] == sum(rows)
    assert 1 <= after["execution_count"] - before["execution_count"] <= len(rows)
    assert after["inference_stats"]["success"]["ns"] > before["inference_stats"]["success"]["ns"]
    assert after["inference_stats"]["compute_infer"]["ns"] > before["inference_stats"]["compute_infer"]["ns"]
    assert after["last_inference"] >= started_ms
    # Runs by size: the rows they held add up to the inferences, their count to the executions.
    runs = {s["batch_size"]: s["compute_infer"]["count"] for s in after["batch_stats"]}
    assert sum(size * n for size, n in runs.items()) == after["inference_count"]
    assert sum(runs.values()) == after["execution_count"]
    assert after["inference_stats"]["cache_hit"] == {"count": 0, "ns": 0}


def test_statistics_of_every_model_of_one_model_and_of_one_version(client):
    everything = client.get_inference_statistics()["model_stats"]
    served = {(m.name, str(n)) for m in MODELS for n in range(1, len(m.versions) + 1)}
    assert {(s["name"], s["version"]) for s in everything} == served
    assert [s["version"] for s in client.get_inference_statistics("adder")["model_stats"]] == ["1", "2"]
    assert [s["version"] for s in client.get_inference_statistics("adder", "2")["model_stats"]] == ["2"]
    assert [s["version"] for s in client.get_inference_statistics("adder", "canary")["model_stats"]] == ["2"]
    with pytest.raises(InferenceServerException) as caught:
        client.get_inference_statistics("no-such-model")
    assert (caught.value.status(), caught.value.message()) == (
        "404",
        "Request for unknown model: 'no-such-model' is not found",
    )


def test_statistics_need_the_inference_token_unless_public(v2: V2Server, settings):
    settings.INFERENCE_PUBLIC = False
    assert v2.request("GET", "/v2/models/stats").status == 401
    response = v2.request("GET", "/v2/models/stats", headers={"Authorization": f"Bearer {v2.inference_token}"})
    assert response.status == 200


# --- classification ---------------------------------------------------------------------------------------


def test_classification_returns_the_top_classes_with_their_labels(client):
    scores = np.array([[0.1, 0.7, 0.05, 0.9, 0.2], [3.0, -1.0, 2.5, 0.0, 2.5]], np.float32)
    outputs = [httpclient.InferRequestedOutput("out", binary_data=False, class_count=3)]
    result = client.infer("scores", [x_input(scores)], outputs=outputs)
    [output] = result.get_response()["outputs"]
    assert (output["datatype"], output["shape"]) == ("BYTES", [2, 3])
    assert output["data"] == [
        "0.900000:3:owl",
        "0.700000:1:dog",
        "0.200000:4:yak",
        "3.000000:0:cat",
        "2.500000:2:fox",  # a tie keeps the lower index first
        "2.500000:4:yak",
    ]
    assert LABELS[3] == "owl"


def test_classification_as_binary_data_and_without_labels(client):
    scores = np.array([[0.1, 0.7, 0.05, 0.9, 0.2]], np.float32)
    outputs = [httpclient.InferRequestedOutput("out", binary_data=True, class_count=2)]
    result = client.infer("scores", [x_input(scores)], outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("out"), np.array([[b"0.900000:3:owl", b"0.700000:1:dog"]]))
    x = np.array([[1, 4, 2, 3]], np.float32)
    result = client.infer("adder", [x_input(x)], outputs=[httpclient.InferRequestedOutput("y", class_count=9)])
    # The adder has no labels.txt; asked for more classes than there are, all of them come back.
    np.testing.assert_array_equal(
        result.as_numpy("y"), np.array([[b"5.000000:1", b"4.000000:3", b"3.000000:2", b"2.000000:0"]])
    )


@pytest.mark.parametrize(
    ("model", "parameters", "message"),
    [
        ("scores", {"classification": 0}, "output 'out': classification must be a positive integer, got 0"),
        ("scores", {"classification": "3"}, "output 'out': classification must be a positive integer, got '3'"),
        ("echo", {"classification": 1}, "output 'out': classification needs a numeric output, not BYTES"),
    ],
)
def test_classification_that_cannot_be_done_is_a_400(v2: V2Server, model, parameters, message):
    datatype, data = ("BYTES", ["a"]) if model == "echo" else ("FP32", [1, 2, 3, 4, 5])
    shape = [1] if model == "echo" else [1, 5]
    body = {
        "inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": data}],
        "outputs": [{"name": "out", "parameters": parameters}],
    }
    response = v2.request("POST", f"/v2/models/{model}/infer", json_bytes(body))
    assert (response.status, response.json()) == (400, {"error": message})


def json_bytes(body: Any) -> bytes:
    import json

    return json.dumps(body).encode()


# --- model repository ---------------------------------------------------------------------------------------


def test_repository_index_lists_every_served_version_with_its_state(client, v2: V2Server):
    index = client.get_model_repository_index()
    served = {(m.name, str(n)) for m in MODELS for n in range(1, len(m.versions) + 1)}
    assert {(item["name"], item["version"]) for item in index} == served
    assert {item["state"] for item in index} == {"READY"}
    assert all(item["reason"] == "" for item in index)
    response = v2.request("POST", "/v2/repository/index", b'{"ready": true}')
    assert response.status == 200 and len(response.json()) == len(served)


@pytest.mark.parametrize(
    "body", [b"[1]", b'{"ready": "yes"}', b"{nope", b"[" * 5000 + b"]" * 5000], ids=["list", "string", "junk", "deep"]
)
def test_a_repository_index_request_that_is_not_one_is_a_400(v2: V2Server, body):
    response = v2.request("POST", "/v2/repository/index", body)
    assert response.status == 400
    assert response.json()["error"].startswith("the repository index request must be a JSON object")


@pytest.mark.parametrize("action", ["load", "unload"])
def test_load_and_unload_answer_that_models_are_loaded_by_promotion(client, action):
    with pytest.raises(InferenceServerException) as caught:
        getattr(client, f"{action}_model")("adder")
    assert caught.value.status() == "400"
    assert caught.value.message() == (
        f"models are not {action}ed on request: they are loaded by promotion in the registry. Point a served alias "
        "at a ready version (PUT /api/v1/models/adder/aliases/production, approved by a second person), or stop "
        "serving it (PATCH /api/v1/models/adder/aliases/<alias> with served false)"
    )
