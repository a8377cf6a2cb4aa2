"""Stepped rollouts through a real ``modelyard serve`` inference process.

The registry is this test's (the API on the test database). The periodic check is
``registry.rollout.services.rollouts_advance``, the function the beat schedule runs; the test calls it
in a loop, as the scheduler would, so the steps are not paced by its interval. The inference process
is real: it splits production's requests from the desired state and reports its figures with its
heartbeat, which is all the check reads.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from registry.models import (
    AliasMove,
    AliasMoveKind,
    AliasRollout,
    AuditEvent,
    InferenceWorker,
    PromotionKind,
    PromotionRequest,
)
from registry.rollout.services import rollouts_advance
from tests.support.inference import infer_body
from tests.support.load import ClientThreads
from tests.support.onnx_models import fragile_add_model
from tests.support.polling import eventually
from tests.support.processes import ServeProcess
from tests.support.registry import create_model, promote, upload_versions

pytestmark = pytest.mark.django_db(transaction=True)

INFER = "/v2/models/demo/infer"
ROLLOUT = "/api/v1/models/demo/aliases/production/rollout"


@dataclass
class Answer:
    client: int
    status: int
    version: str
    offset: float | None  # y - x: the answering version's bias
    large: bool  # sent values the fragile candidate cannot take


class Clients(ClientThreads):
    """Keep-alive clients sending production requests back to back; ``large()`` switches their inputs."""

    def __init__(self, port: int, clients: int) -> None:
        self.port = port
        self.send_large = threading.Event()
        super().__init__(clients)

    def _run(self, client: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self._stop.is_set():
            large = self.send_large.is_set()
            x = np.full((2, 4), 100.0 if large else 3.0, dtype=np.float32)
            try:
                conn.request("POST", INFER, json.dumps(infer_body(x)), {"Content-Type": "application/json"})
                response = conn.getresponse()
                raw = response.read()
            except OSError:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                answer = Answer(client, 0, "", None, large)
            else:
                if response.status == 200:
                    body = json.loads(raw)
                    y = np.asarray(body["outputs"][0]["data"], dtype=np.float32)
                    answer = Answer(client, 200, body["model_version"], float(y[0] - x.reshape(-1)[0]), large)
                else:
                    answer = Answer(client, response.status, "", None, large)
            with self._lock:
                self.answers.append(answer)
        conn.close()

    def snapshot(self) -> list[Answer]:
        with self._lock:
            return list(self.answers)


def advance_until(done: Callable[[], bool], *, timeout: float, what: Callable[[], str]) -> None:
    """Run the periodic check every 0.2 s until ``done``, as the beat schedule would at a short interval."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {what()}")
        rollouts_advance()
        time.sleep(0.2)


def rollout_state(person) -> dict:
    response = person.get(ROLLOUT)
    assert response.status_code == 200, response.content
    return response.json()


def test_a_rollout_walks_its_steps_and_completes_with_no_failed_request(owner, approver, start_server):
    create_model(owner)
    upload_versions(owner, [1.0, 2.0])
    promote(owner, approver, 1)
    server = start_server("inf-rollout")
    eventually(lambda: server.request("POST", INFER, infer_body(np.ones((2, 4), np.float32)))[0] == 200, timeout=30)

    asked = owner.put(
        ROLLOUT,
        {"version": 2, "steps": [25, 60, 100], "step_seconds": 1, "min_requests": 15, "max_p99_ratio": 50},
    )
    assert asked.status_code == 202, asked.content  # production is protected: a second person approves
    assert asked.json()["state"] == "pending" and asked.json()["percent"] == 0
    promotion = PromotionRequest.objects.get(pk=asked.json()["promotion"])
    assert promotion.kind == PromotionKind.ROLLOUT and promotion.version.version == 2
    approved = approver.post(f"/api/v1/promotions/{promotion.pk}/approve", {"reason": "go"})
    assert approved.status_code == 200, approved.content
    assert rollout_state(owner)["state"] == "running" and rollout_state(owner)["percent"] == 25

    with Clients(server.port, 3) as load:
        advance_until(
            lambda: rollout_state(owner)["state"] == "completed", timeout=120, what=lambda: str(rollout_state(owner))
        )
        # After the move every new request is v2's.
        eventually(lambda: load.snapshot()[-1].version == "2", timeout=30)
        settled = len(load.snapshot())
        eventually(lambda: len(load.snapshot()) > settled + 20, timeout=30)
        tail = load.snapshot()[settled:]
    answers = load.snapshot()
    assert [a for a in answers if a.status != 200] == []
    assert {(a.version, a.offset) for a in answers} == {("1", 1.0), ("2", 2.0)}
    assert {a.version for a in tail} == {"2"}

    done = AliasRollout.objects.get(pk=asked.json()["id"])
    assert done.state == "completed" and done.step == 2 and done.alias.version.version == 2
    move = AliasMove.objects.filter(alias=done.alias).latest("moved_at")
    assert move.kind == AliasMoveKind.APPROVAL and move.promotion_id == promotion.pk and move.to_version.version == 2
    actions = list(AuditEvent.objects.filter(target="demo@production").values_list("action", flat=True))
    assert actions.count("rollout.start") == 1
    assert actions.count("rollout.step") == 2
    assert actions.count("rollout.complete") == 1
    steps = [e.after for e in AuditEvent.objects.filter(action="rollout.step").order_by("id")]
    assert [s["percent"] for s in steps] == [60, 100]
    assert all(s["passed"]["candidate"]["requests"] >= 15 for s in steps)


def test_a_failing_candidate_is_rolled_back_within_its_step_and_routing_keys_stick(owner, approver, start_server):
    create_model(owner)
    upload_versions(owner, [1.0])
    response = owner.upload("demo", [("model.onnx", fragile_add_model(bias=2.0).SerializeToString())])
    assert response.status_code == 201, response.content
    promote(owner, approver, 1)
    server: ServeProcess = start_server("inf-rollback")
    x = np.ones((2, 4), np.float32)
    eventually(lambda: server.request("POST", INFER, infer_body(x))[0] == 200, timeout=30)

    asked = owner.put(
        ROLLOUT,
        {"version": 2, "steps": [50, 100], "step_seconds": 3600, "min_requests": 10, "max_error_rate": 0.05},
    )
    approved = approver.post(f"/api/v1/promotions/{asked.json()['promotion']}/approve", {})
    assert approved.status_code == 200, approved.content

    def answered_by(key: str) -> str:
        status, body = server.request("POST", INFER, infer_body(x), headers={"Modelyard-Routing-Key": key})
        assert status == 200, body
        return body["model_version"]

    # The split is in place once a key lands on the candidate.
    eventually(lambda: any(answered_by(f"probe-{i}") == "2" for i in range(20)), timeout=30)
    # A routing key always lands on the same version; over many keys, both versions answer.
    first = {f"user-{i}": answered_by(f"user-{i}") for i in range(40)}
    assert all(answered_by(key) == version for key, version in first.items())
    assert set(first.values()) == {"1", "2"}
    # Over gRPC too, the same key lands on the same version as over REST.
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        tensor = grpcclient.InferInput("x", [2, 4], "FP32")
        tensor.set_data_from_numpy(x)
        for key in list(first)[:10]:
            result = client.infer("demo", [tensor], headers={"modelyard-routing-key": key})
            assert result.get_response().model_version == first[key]

    with Clients(server.port, 3) as load:
        eventually(lambda: len(load.snapshot()) > 30, timeout=30)
        load.send_large.set()  # from now on, the candidate fails every request it gets
        advance_until(
            lambda: rollout_state(owner)["state"] == "rolled_back", timeout=60, what=lambda: str(rollout_state(owner))
        )
        eventually(lambda: load.snapshot()[-1].large and load.snapshot()[-1].version == "1", timeout=30)
        settled = len(load.snapshot())
        eventually(lambda: len(load.snapshot()) > settled + 30, timeout=30)
        tail = load.snapshot()[settled:]
    answers = load.snapshot()

    state = rollout_state(owner)
    assert state["step"] == 0 and state["percent"] == 0  # rolled back within the step where it began failing
    assert state["end_reason"].startswith("error rate ") and "above the limit of 5.00%" in state["end_reason"]
    # Zero failed requests to the current version: every failure was the candidate's (its own figures), none
    # before the large values began, none once the split ended.
    assert all(a.status == 200 for a in answers if not a.large)
    assert all(a.status == 200 and a.version == "1" for a in tail)
    failed = [a for a in answers if a.status != 200]
    assert failed and all(a.status == 400 for a in failed), {a.status for a in failed}
    rows = {row["version"]: row for row in InferenceWorker.objects.get(worker_id="inf-rollback").loaded}
    assert rows[1]["totals"]["errors"] == 0 and rows[1]["totals"]["requests"] > 0
    assert AuditEvent.objects.filter(action="rollout.rolled_back", target="demo@production").count() == 1
    # Nothing moved: production still points to v1.
    assert AliasRollout.objects.get(pk=state["id"]).alias.version.version == 1
