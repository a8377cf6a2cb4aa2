"""Shadow traffic through real ``modelyard serve`` inference processes.

The registry is this test's (API on the test database); the inference processes are real, and mirror
a sample of production's requests to a candidate after answering. The report is read back through the
API, merged from the processes' heartbeats.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from registry.models import AliasShadow, AuditEvent, PromotionRequest, ShadowTally
from tests.support.inference import infer_body
from tests.support.onnx_models import add_model_bytes
from tests.support.polling import eventually
from tests.support.processes import ServeProcess
from tests.support.registry import create_model, promote, set_alias, upload_versions

pytestmark = pytest.mark.django_db(transaction=True)

INFER = "/v2/models/demo/infer"
SHADOW = "/api/v1/models/demo/aliases/production/shadow"


def infer(server: ServeProcess, x: np.ndarray) -> tuple[int, dict]:
    return server.request("POST", INFER, infer_body(x))


def report(person) -> dict:
    response = person.get(SHADOW)
    assert response.status_code == 200, response.content
    return response.json()


def expected_cosine(x: np.ndarray, a: float, b: float) -> float:
    """The cosine of (x + a) and (x + b), row by row: what the shadow should find."""
    p, c = (x + a).astype(np.float64), (x + b).astype(np.float64)
    return float(np.min(np.sum(p * c, axis=1) / (np.linalg.norm(p, axis=1) * np.linalg.norm(c, axis=1))))


def test_a_shadow_reports_the_known_difference_and_never_touches_the_answer(owner, approver, start_server):
    create_model(owner)
    upload_versions(owner, [1.0])
    response = owner.upload("demo", [("model.onnx", add_model_bytes(bias=1.25))])
    assert response.status_code == 201, response.content
    promote(owner, approver, 1)
    # Every request mirrored: the cost budget (tested in test_shadow_runner.py) would drop most of them.
    server = start_server("inf-shadow", extra_env={"MODELYARD_SHADOW_MAX_COST": "100"})
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    eventually(lambda: infer(server, x)[0] == 200, timeout=30, what="v1 never served")

    started = owner.put(SHADOW, {"version": 2, "sample": 1})
    assert started.status_code == 201, started.content
    assert started.json()["version"] == 2 and started.json()["running"] is True
    # The candidate loads beside the primary; the first mirrored requests can be dropped while it does.
    answers = []

    def compared_enough() -> bool:
        status, body = infer(server, x)
        answers.append((status, body))
        return report(owner)["report"]["compared"] >= 20

    eventually(compared_enough, timeout=60, what=lambda: f"report: {report(owner)}")
    # Every client answer is the primary's: x + 1, version 1.
    for status, body in answers:
        assert status == 200
        assert body["model_version"] == "1"
        assert body["outputs"][0]["data"] == (x + 1).reshape(-1).tolist()

    state = report(owner)
    out = state["report"]["outputs"]["y"]
    assert out["max_abs_diff"] == pytest.approx(0.25, abs=1e-6)
    assert out["mean_abs_diff"] == pytest.approx(0.25, abs=1e-6)
    cosine = expected_cosine(x, 1.0, 1.25)
    assert out["cosine_min"] == pytest.approx(cosine, abs=1e-7)
    # Percentiles are a bin's far edge: never better than the truth, and within 9 % of the distance from 1.
    assert out["cosine_p1"] <= cosine + 1e-9
    assert (1 - out["cosine_p1"]) <= (1 - cosine) * 2 ** (1 / 8) * 1.0001
    assert out["top1_agreement"] == 1.0  # adding a constant moves no row's largest value
    assert out["psi"] is not None and out["psi"] < 0.25
    assert state["report"]["candidate"]["errors"] == 0 and state["report"]["primary"]["errors"] == 0
    assert state["report"]["candidate"]["p50_ms"] > 0
    assert state["workers"] == 1
    assert ShadowTally.objects.filter(shadow_id=state["id"], worker_id="inf-shadow").exists()

    # A promotion request for the shadowed version carries the report as it stood.
    asked = set_alias(owner, "production", 2)
    assert asked.status_code == 202, asked.content
    kept = PromotionRequest.objects.get(pk=asked.json()["id"]).shadow_report
    assert kept["version"] == 2 and kept["report"]["compared"] >= 20
    assert kept["report"]["outputs"]["y"]["max_abs_diff"] == pytest.approx(0.25, abs=1e-6)
    # Approving it moves the alias, which ends the shadow: the alias serves the candidate now.
    approved = approver.post(f"/api/v1/promotions/{asked.json()['id']}/approve", {"reason": "ok"})
    assert approved.status_code == 200, approved.content
    ended = AliasShadow.objects.get(pk=state["id"])
    assert ended.ended_at is not None and ended.end_reason.startswith("promoted")
    actions = list(AuditEvent.objects.filter(target="demo@production").values_list("action", flat=True))
    assert actions.count("alias.shadow_start") == 1 and actions.count("alias.shadow_stop") == 1


def test_a_broken_shadow_never_fails_a_client_request(owner, approver, start_server):
    create_model(owner)
    upload_versions(owner, [1.0])
    # Width 5: every request of width 4 fails on this version's session.
    response = owner.upload("demo", [("model.onnx", add_model_bytes(bias=1.0, width=5))])
    assert response.status_code == 201, response.content
    promote(owner, approver, 1)
    server = start_server(
        "inf-shadow-broken", extra_env={"MODELYARD_SHADOW_QUEUE_SIZE": "2", "MODELYARD_SHADOW_MAX_COST": "100"}
    )
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    eventually(lambda: infer(server, x)[0] == 200, timeout=30, what="v1 never served")
    started = owner.put(SHADOW, {"version": 2})  # sample left out: 0.1
    assert started.status_code == 201, started.content
    assert started.json()["sample"] == 0.1

    statuses = []

    def failures_seen() -> bool:
        for _ in range(20):
            status, body = infer(server, x)
            statuses.append((status, body.get("model_version")))
        return report(owner)["report"]["candidate"]["errors"] >= 3

    eventually(failures_seen, timeout=90, what=lambda: f"report: {report(owner)}")
    assert set(statuses) == {(200, "1")}, [s for s in statuses if s != (200, "1")][:3]
    state = report(owner)["report"]
    assert state["compared"] == 0 and state["candidate"]["answered"] == 0
    assert "InvalidInput" in state["candidate"]["last_error"] or "dimension" in state["candidate"]["last_error"]
    assert state["candidate"]["error_rate"] == 1.0
    # Sampled near a tenth of the requests: far fewer mirrored than answered.
    assert state["requests"] + state["dropped"] < len(statuses)
    assert math.isclose(state["primary"]["error_rate"], 0.0)

    stopped = owner.delete(SHADOW)
    assert stopped.status_code == 200, stopped.content
    assert stopped.json()["running"] is False
