"""The batcher's queue through the real server: full queue, request timeouts, clients that went away.

The ``gated`` model (max_queue_size 1) runs through a gate the test holds shut, so what is running
and what is queued is known at every step; nothing depends on timing.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.v2server import HOST, Response, V2Server

PATH = "/v2/models/gated/infer"


def body(value: float, **parameters: Any) -> bytes:
    request: dict[str, Any] = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [value] * 4}]}
    if parameters:
        request["parameters"] = parameters
    return json.dumps(request).encode()


def sample(v2: V2Server, metric: str, **labels: str) -> float:
    for family in text_string_to_metric_families(v2.metrics()):
        for s in family.samples:
            if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class Gate:
    """Holds every ONNX Runtime run of one loaded version until opened."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.running = threading.Event()

    def wrap(self, run: Callable[..., Any]) -> Callable[..., Any]:
        def gated(feeds: dict[str, Any], output_names: list[str] | None = None) -> Any:
            self.running.set()
            assert self.open.wait(30), "the gate was never opened"
            return run(feeds, output_names)

        return gated

    def close(self) -> None:
        self.open.clear()
        self.running.clear()


@pytest.fixture
def gate(v2: V2Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    loaded = v2.loaded("gated")
    held = Gate()
    monkeypatch.setattr(loaded, "run", held.wrap(loaded.run))
    yield held
    held.open.set()


def in_background(v2: V2Server, payload: bytes) -> tuple[threading.Thread, list[Response]]:
    out: list[Response] = []
    thread = threading.Thread(target=lambda: out.append(v2.request("POST", PATH, payload)))
    thread.start()
    return thread, out


def queued(v2: V2Server) -> float:
    return sample(v2, "modelyard_queue_depth", model="gated", version="1")


def ran(v2: V2Server) -> float:
    """How many requests have reached ONNX Runtime (the batch-size histogram's sum)."""
    return sample(v2, "modelyard_batch_requests_sum", model="gated")


def test_full_queue_answers_503_with_retry_after_at_once(v2, gate):
    first, first_out = in_background(v2, body(1))
    assert gate.running.wait(20)  # the first request is inside ONNX Runtime, held by the gate
    second, second_out = in_background(v2, body(2))
    wait_for(lambda: queued(v2) == 1, "the second request to queue")

    refused = v2.request("POST", PATH, body(3))

    assert refused.status == 503
    assert refused.headers["retry-after"] == "1"
    assert refused.json() == {"error": "model 'gated' is overloaded: the queue is full (1 requests)"}
    gate.open.set()
    first.join(20)
    second.join(20)
    assert [r.status for r in first_out + second_out] == [200, 200]
    assert first_out[0].json()["outputs"][0]["data"] == [4.0] * 4
    assert second_out[0].json()["outputs"][0]["data"] == [5.0] * 4


def test_request_past_its_timeout_gets_a_clear_error_and_never_runs(v2, gate):
    before = ran(v2)
    blocker, blocker_out = in_background(v2, body(1))
    assert gate.running.wait(20)
    late, late_out = in_background(v2, body(2, timeout=1000))  # 1 ms, and it waits behind the gate
    wait_for(lambda: queued(v2) == 1, "the late request to queue")

    gate.open.set()
    blocker.join(20)
    late.join(20)

    assert blocker_out[0].status == 200
    assert late_out[0].status == 504
    assert late_out[0].json() == {"error": "the request timed out in the queue before it ran (timeout 1000 us)"}
    assert ran(v2) == before + 1  # only the blocker


def test_request_whose_client_went_away_is_dropped_before_it_runs(v2, gate):
    gone_before = sample(v2, "modelyard_inference_requests_total", model="gated", status="499")
    before = ran(v2)
    blocker, blocker_out = in_background(v2, body(1))
    assert gate.running.wait(20)
    conn = http.client.HTTPConnection(HOST, v2.port, timeout=10)
    conn.request("POST", PATH, body=body(9))
    wait_for(lambda: queued(v2) == 1, "the abandoned request to queue")
    conn.close()  # the client hangs up without reading its answer
    wait_for(
        lambda: sample(v2, "modelyard_inference_requests_total", model="gated", status="499") == gone_before + 1,
        "the server to notice the client went away",
    )

    gate.open.set()
    blocker.join(20)
    after = v2.request("POST", PATH, body(5))  # the dropped request left no trace in the queue

    assert blocker_out[0].status == 200
    assert after.status == 200
    assert after.json()["outputs"][0]["data"] == list(np.full(4, 8.0))
    assert ran(v2) == before + 2  # the blocker and the last one; never the abandoned request


def test_unknown_model_names_share_one_metrics_label(v2: V2Server):
    before = sample(v2, "modelyard_inference_requests_total", model="_unknown", status="404")
    for name in ("no-such-model-a", "no-such-model-b"):
        assert v2.request("POST", f"/v2/models/{name}/infer", b'{"inputs": []}').status == 404
    assert sample(v2, "modelyard_inference_requests_total", model="_unknown", status="404") == before + 2
    assert "no-such-model-a" not in v2.metrics()
