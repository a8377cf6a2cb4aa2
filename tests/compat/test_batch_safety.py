"""Models whose first dimension is not a batch are never merged: every answer is that request's own.

The server merged concurrent requests along the first dimension of any model whose first dimension is
dynamic. A model that normalises over it (a softmax over dim 0) then answered each of two overlapping
requests with numbers computed over both, with status 200; and ``max_batch_size: 0``, Triton's way to
say "this model does not batch", was refused. Now validation runs two samples together and each alone
and serves a model whose outputs differ without merging, and ``max_batch_size: 0`` means never merge.

Triton's ``qa/L0_infer_variable/infer_variable_test.py`` runs its "nobatch" add/sub models
(OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, variable shapes, no batch dimension) over HTTP
(binary and JSON) and gRPC, with raw and classification outputs; ``test_triton_nobatch_*`` run the same
cases here with the real tritonclient against models registered with ``max_batch_size: 0``.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.compat.test_batching import batch_histogram
from tests.support.onnx_compat import NOBATCH_CASES, nobatch_name
from tests.support.v2server import V2Server

THREADS = 16
REQUESTS_EACH = 10
NUMPY = {"FP32": np.float32, "INT32": np.int32, "INT64": np.int64}
CLASSES = 3  # what infer_variable_test asks for


def rows_of(client: int, request: int) -> np.ndarray:
    """1-3 rows of 4, different for every request, so that merged ones would normalise over the wrong rows."""
    rows = 1 + (client + request) % 3
    values = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) / 7 + client * 0.5 - request * 0.25
    return values.astype(np.float32)


def test_a_model_normalising_over_its_first_dimension_answers_every_concurrent_request_as_ort_alone(v2: V2Server):
    before = batch_histogram(v2, "normalised")
    start = threading.Barrier(THREADS)
    answers: dict[tuple[int, int], Any] = {}
    errors: list[BaseException] = []

    def one(client: int) -> None:
        try:
            with httpclient.InferenceServerClient(v2.url, concurrency=1) as triton:
                start.wait(timeout=30)
                for request in range(REQUESTS_EACH):
                    x = rows_of(client, request)
                    item = httpclient.InferInput("x", list(x.shape), "FP32")
                    item.set_data_from_numpy(x, binary_data=request % 2 == 0)
                    result = triton.infer("normalised", [item])
                    answers[(client, request)] = result.as_numpy("y")
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(client,)) for client in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert errors == []
    assert len(answers) == THREADS * REQUESTS_EACH
    wrong = []
    for (client, request), y in answers.items():
        (alone,) = v2.reference("normalised").run(["y"], {"x": rows_of(client, request)})
        if y.shape != alone.shape or not np.array_equal(y, alone):
            wrong.append((client, request))
    assert wrong == [], f"{len(wrong)} of {len(answers)} answers differ from ONNX Runtime run on the request alone"
    after = batch_histogram(v2, "normalised")
    runs = after["count"] - before["count"]
    assert after["sum"] - before["sum"] == THREADS * REQUESTS_EACH
    assert after["single"] - before["single"] == runs  # every run held one request


def test_the_config_of_a_model_served_without_merging_says_it_does_not_batch(v2: V2Server):
    with httpclient.InferenceServerClient(v2.url) as triton:
        config = triton.get_model_config("normalised")
    assert config["max_batch_size"] == 0
    assert "dynamic_batching" not in config
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 4]}]
    assert config["output"] == [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1, 4]}]


@pytest.mark.parametrize("case", list(NOBATCH_CASES))
def test_triton_nobatch_model_config_keeps_every_dimension(v2: V2Server, case):
    _, out0, out1, shape = NOBATCH_CASES[case]
    with grpcclient.InferenceServerClient(v2.grpc_url) as triton:
        config = triton.get_model_config(nobatch_name(case), as_json=True)["config"]
    assert config.get("max_batch_size", 0) == 0
    assert "dynamic_batching" not in config
    dims = [str(-1)] * len(shape)  # gRPC's JSON writes int64 as strings
    assert [(t["name"], t["dims"]) for t in config["input"]] == [("INPUT0", dims), ("INPUT1", dims)]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("OUTPUT0", f"TYPE_{out0}", dims),
        ("OUTPUT1", f"TYPE_{out1}", dims),
    ]


def _inputs(case: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """INPUT0, INPUT1 and the expected OUTPUT0, OUTPUT1, with values whose sum and difference fit every type exactly."""
    inputs, out0, out1, shape = NOBATCH_CASES[case]
    rng = np.random.default_rng(seed)
    in0, in1 = (rng.integers(-1000, 1000, size=shape).astype(NUMPY[inputs]) for _ in range(2))
    return in0, in1, (in0 + in1).astype(NUMPY[out0]), (in0 - in1).astype(NUMPY[out1])


def _check_classes(classes: np.ndarray, expected: np.ndarray) -> None:
    """A model that does not batch is classified whole: the top 3 of every element, as "score:index"."""
    assert classes.shape == (CLASSES,)
    flat = expected.reshape(-1)
    scores = []
    for entry in classes:
        score, index = (entry.decode() if isinstance(entry, bytes) else entry).split(":")[:2]
        assert float(score) == pytest.approx(float(flat[int(index)]))
        scores.append(float(score))
    assert scores == sorted((float(v) for v in flat), reverse=True)[:CLASSES]


# infer_variable_test's raw_*, class_* and mix_* cases: which of OUTPUT0 and OUTPUT1 come back raw.
OUTPUTS = {"raw": (True, True), "class": (False, False), "mix": (True, False)}


@pytest.mark.parametrize("outputs", list(OUTPUTS))
@pytest.mark.parametrize("case", list(NOBATCH_CASES))
def test_triton_nobatch_cases_over_http_binary_http_json_and_grpc(v2: V2Server, case, outputs):
    inputs, _, _, shape = NOBATCH_CASES[case]
    in0, in1, out0, out1 = _inputs(case, seed=len(case) * 31 + len(outputs))
    raw0, raw1 = OUTPUTS[outputs]
    model = nobatch_name(case)
    for transport in ("http-binary", "http-json", "grpc"):
        if transport == "grpc":
            module: Any = grpcclient
            triton: Any = grpcclient.InferenceServerClient(v2.grpc_url)
        else:
            module = httpclient
            triton = httpclient.InferenceServerClient(v2.url)
        binary = transport == "http-binary"
        items = []
        for name, array in (("INPUT0", in0), ("INPUT1", in1)):
            item = module.InferInput(name, list(shape), inputs)
            if transport == "grpc":
                item.set_data_from_numpy(array)
            else:
                item.set_data_from_numpy(array, binary_data=binary)
            items.append(item)
        wanted = []
        for name, raw in (("OUTPUT0", raw0), ("OUTPUT1", raw1)):
            options: dict[str, Any] = {} if raw else {"class_count": CLASSES}
            if transport != "grpc":
                options["binary_data"] = binary and raw
            wanted.append(module.InferRequestedOutput(name, **options))
        with triton:
            result = triton.infer(model, items, outputs=wanted)
        for name, raw, expected in (("OUTPUT0", raw0, out0), ("OUTPUT1", raw1, out1)):
            got = result.as_numpy(name)
            if raw:
                assert got.dtype == expected.dtype, (transport, name)
                np.testing.assert_array_equal(got, expected, err_msg=f"{transport} {name}")
            else:
                _check_classes(got, expected)
