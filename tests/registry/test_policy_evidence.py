"""What a policy's rules see: every variable read from what the registry stores, and null until it exists.

The candidate is a real fp16 derivation of v1 (its accuracy delta measured by the derive job), the
benchmarks are recorded through the service the inference processes use, the shadow report is
written by a heartbeat as an inference process writes it, and the signatures are the registry's own.
Each rule below tests one variable against those stored values; the same rules fail, with the reason
for the missing evidence, before it exists.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from onnxkit.agreement import Tally
from registry.models import ModelVersion, PromotionRequest, Role
from registry.serving import ShadowTallyRow, WorkerReport, worker_heartbeat
from tests.registry.test_measured_promotion import derive_fp16, record_benchmark, upload_v1
from tests.support.people import Person, login_person, make_person
from tests.support.registry import promote, set_served

pytestmark = pytest.mark.django_db(transaction=True)

POLICY = "/api/v1/models/demo/aliases/production/policy"
# One rule per variable, each true of the stored evidence once it all exists.
RULES = [
    {"name": "candidate", "expr": 'candidate.number == 2 && candidate.status == "ready" && candidate.size_bytes > 0'},
    {"name": "candidate-labels", "expr": '"fp16" in candidate.tags && candidate.metadata.dataset == "imagenet"'},
    {"name": "current", "expr": "current.number == 1 && current.uploaded_by == 'mia'"},
    {"name": "signature", "expr": "size(signature.breaking) == 0 && size(signature.changes) == 0"},
    {"name": "provenance", "expr": "provenance.signed && size(provenance.signers) == 0"},
    {"name": "benchmark", "expr": 'benchmark.provider == "CPUExecutionProvider" && benchmark.slowdown_percent <= 10'},
    {"name": "accuracy", "expr": "accuracy.cosine > 0.999 && accuracy.max_abs_diff < 0.01"},
    {"name": "shadow", "expr": "shadow.compared >= 3 && shadow.outputs.all(o, shadow.outputs[o].cosine_p1 > 0.99)"},
    {"name": "requester", "expr": 'requester.user == "mia" && "maintainer" in requester.roles'},
    {"name": "approvals", "expr": 'approvals.exists(a, a.user == "ana" && "approver" in a.roles)'},
]
SCORES = np.array([[0.0, 1.0, 2.0, 3.0], [3.0, 2.0, 1.0, 0.0]], dtype=np.float32)


@pytest.fixture(autouse=True)
def _unhurried(settings: Any) -> None:
    """Rules run under a deadline no busy CI machine reaches (the engine's tests test the deadline)."""
    settings.POLICY_EVAL_TIMEOUT_MS = 10_000


@pytest.fixture
def mia() -> Person:
    return login_person("mia", Role.MAINTAINER, Role.APPROVER)


@pytest.fixture
def candidate(mia: Person, ana: Person) -> ModelVersion:
    """production (protected, served) serves v1, benchmarked; v2 is its fp16 derivation, labelled, not yet measured."""
    v1 = upload_v1(mia)
    record_benchmark(v1, throughput32=1000.0, p99_ms=10.0)
    promote(mia, ana, 1)
    set_served(make_person("root", Role.ADMIN), "production", True)
    v2 = derive_fp16(mia, v1)
    ModelVersion.objects.filter(pk=v2.pk).update(tags=["fp16"], metadata={"dataset": "imagenet"})
    # The policy, through its own four eyes (production is protected).
    asked = mia.put(POLICY, {"rules": RULES})
    assert asked.status_code == 202, asked.content
    assert ana.post(f"/api/v1/promotions/{asked.json()['promotion']}/approve", {}).status_code == 200
    return v2


def results(person: Person) -> dict[str, tuple[bool, str]]:
    response = person.post(f"{POLICY}/evaluate", {"version": 2})
    assert response.status_code == 200, response.content
    return {r["name"]: (r["passed"], r["why"]) for r in response.json()["rules"]}


def shadow_report_of(mia: Person, requests: int) -> None:
    """A shadow of v2 on production, and an inference process's tally of ``requests`` mirrored requests."""
    started = mia.put("/api/v1/models/demo/aliases/production/shadow", {"version": 2})
    assert started.status_code == 201, started.content
    tally = Tally()
    for _ in range(requests):
        tally.record(
            primary={"y": SCORES}, primary_seconds=0.002, candidate={"y": SCORES + 1e-4}, candidate_seconds=0.003
        )
    worker_heartbeat(
        WorkerReport(
            worker_id="worker-a",
            host="host-a",
            pid=1,
            device="cpu",
            provider="CPUExecutionProvider",
            started_at=datetime(2026, 1, 1, tzinfo=UTC),
            loaded=(),
            shadows=(ShadowTallyRow(started.json()["id"], tally.as_json()),),
        )
    )


def test_before_the_evidence_exists_rules_fail_saying_what_is_missing(mia: Person, candidate: ModelVersion) -> None:
    found = results(mia)

    assert found["benchmark"] == (False, "no benchmark yet")
    assert found["shadow"] == (False, "no shadow report yet")
    assert found["approvals"] == (False, "decided at approval")
    # What is stored from the start already holds.
    for name in ("candidate", "candidate-labels", "current", "signature", "provenance", "accuracy", "requester"):
        assert found[name] == (True, ""), name


def test_every_kind_of_stored_evidence_reaches_the_rules(mia: Person, ana: Person, candidate: ModelVersion) -> None:
    record_benchmark(candidate, throughput32=1900.0, p99_ms=5.9)
    shadow_report_of(mia, requests=3)

    found = results(mia)

    assert {name: passed for name, (passed, _) in found.items()} == {
        **{rule["name"]: True for rule in RULES},
        "approvals": False,  # decided at approval
    }
    asked = mia.put("/api/v1/models/demo/aliases/production", {"version": 2, "reason": "measured"})
    assert asked.status_code == 202, asked.content
    assert ana.post(f"/api/v1/promotions/{asked.json()['id']}/approve", {}).status_code == 200
    promotion = PromotionRequest.objects.get(pk=asked.json()["id"])
    assert promotion.policy_results_at_approval is not None
    assert all(r["passed"] for r in promotion.policy_results_at_approval["rules"])
    assert promotion.state == "approved"


def test_a_slower_candidate_and_a_small_shadow_fail_with_their_messages(mia: Person, candidate: ModelVersion) -> None:
    record_benchmark(candidate, throughput32=800.0, p99_ms=12.0)  # 20 % below v1's 1000 rows/s
    shadow_report_of(mia, requests=2)

    found = results(mia)

    assert found["benchmark"] == (False, "rule benchmark failed")
    assert found["shadow"] == (False, "rule shadow failed")
