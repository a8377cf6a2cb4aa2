"""Stepped rollouts (weighted canaries) over the REST API: start, read, pause, resume, abort; the periodic check.

The inference processes are stood in for by ``registry.serving.worker_heartbeat`` with the cumulative totals an
inference process reports per loaded version (``TrafficTotals``); the check is ``rollouts_advance``, the function
the beat schedule runs. A step's clock is moved on by setting ``step_started_at`` back in the database, not by
sleeping. ``tests/inference/test_rollout_processes.py`` runs the same through a real inference process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone

from registry import promotions
from registry.errors import PermissionDenied
from registry.models import (
    PRODUCTION,
    Alias,
    AliasMove,
    AliasMoveKind,
    AliasRollout,
    AuditEvent,
    ModelVersion,
    PromotionKind,
    PromotionRequest,
    PromotionState,
    RegisteredModel,
    Role,
    VersionStatus,
    WebhookDelivery,
)
from registry.promotions import promotions_expire
from registry.rollout import services as rollouts
from registry.rollout.services import NEEDS_ROLE, rollouts_advance
from registry.serving import (
    LoadedRow,
    LoadState,
    SplitSpec,
    TrafficTotals,
    WorkerReport,
    desired_state,
    worker_heartbeat,
)
from tests.support.onnx_models import add_model_bytes
from tests.support.people import Person, make_person
from tests.support.registry import create_model, promote, set_alias, set_served, upload_versions

pytestmark = pytest.mark.django_db

STAGING = "/api/v1/models/demo/aliases/staging/rollout"
PROD = "/api/v1/models/demo/aliases/production/rollout"
FAST = 20  # latency bin of a 3.2 ms answer (TRAFFIC_LATENCY_BOUNDS[20] = 0.1 ms * 2**5)
SLOW = 40  # latency bin of a 102 ms answer (0.1 ms * 2**10)
ROLLOUT_EVENTS = [
    "rollout.started",
    "rollout.step",
    "rollout.paused",
    "rollout.resumed",
    "rollout.rolled_back",
    "rollout.completed",
    "rollout.aborted",
]


@pytest.fixture
def admin() -> Person:
    return make_person("root", Role.ADMIN)


@pytest.fixture
def versions(owner: Person) -> list[ModelVersion]:
    """demo v1, v2, v3 (``y = x + 1``, ``+ 2``, ``+ 3``), each ready."""
    create_model(owner)
    return upload_versions(owner, [1.0, 2.0, 3.0])


@pytest.fixture
def staging(owner: Person, admin: Person, versions: list[ModelVersion]) -> list[ModelVersion]:
    """Staging (unprotected) serves v1, now that an admin has made it served."""
    assert set_alias(owner, "staging", 1).status_code == 200
    set_served(admin, "staging", True)
    return versions


@pytest.fixture
def production(owner: Person, approver: Person, versions: list[ModelVersion]) -> list[ModelVersion]:
    """Production (protected, served) serves v1."""
    promote(owner, approver, 1)
    return versions


@pytest.fixture
def hook(admin: Person, settings: Any) -> int:
    """A webhook for every rollout event, registered through the API."""
    settings.WEBHOOK_ALLOW_PRIVATE = True
    response = admin.post("/api/v1/webhooks", {"url": "http://127.0.0.1:9/hook", "events": ROLLOUT_EVENTS})
    assert response.status_code == 201, response.content
    return int(response.json()["id"])


def traffic(requests: int, errors: int = 0, latency_bin: int = FAST) -> TrafficTotals:
    return TrafficTotals(requests=requests, errors=errors, latency={str(latency_bin): requests} if requests else {})


def heartbeat(
    current: TrafficTotals,
    candidate: TrafficTotals | None = None,
    *,
    worker: str = "w1",
    alias: str = "staging",
    percent: int = 5,
) -> None:
    """What an inference process serving ``alias`` (v1) and the candidate (v2) writes with its heartbeat."""
    loaded = [LoadedRow(model="demo", version=1, state=LoadState.READY, aliases=(alias,), totals=current)]
    if candidate is not None:
        loaded.append(
            LoadedRow(model="demo", version=2, state=LoadState.READY, splits={alias: percent}, totals=candidate)
        )
    worker_heartbeat(
        WorkerReport(
            worker_id=worker,
            host="h",
            pid=1,
            device="cpu",
            provider="CPUExecutionProvider",
            started_at=timezone.now(),
            loaded=tuple(loaded),
        )
    )


def age(seconds: float) -> None:
    """Move the running step's start back, as if it had run ``seconds`` longer."""
    AliasRollout.objects.filter(step_started_at__isnull=False).update(
        step_started_at=F("step_started_at") - timedelta(seconds=seconds)
    )


def start(person: Person, version: int = 2, path: str = STAGING, **body: Any) -> Any:
    return person.put(path, {"version": version, **body})


def started(person: Person, version: int = 2, path: str = STAGING, **body: Any) -> dict[str, Any]:
    response = start(person, version, path=path, **body)
    assert response.status_code in (201, 202), response.content
    return dict(response.json())


def current(person: Person, path: str = STAGING) -> dict[str, Any]:
    response = person.get(path)
    assert response.status_code == 200, response.content
    return dict(response.json())


def error_of(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["error"]


def actions(target: str = "demo@staging") -> list[str]:
    return [a for a in AuditEvent.objects.filter(target=target).order_by("seq").values_list("action", flat=True)]


def rollout_actions(target: str = "demo@staging") -> list[str]:
    return [a for a in actions(target) if a.startswith("rollout.")]


def deliveries() -> list[str]:
    return [str(e) for e in WebhookDelivery.objects.order_by("id").values_list("event", flat=True)]


def split_of(alias: str = "staging") -> SplitSpec | None:
    return desired_state().splits.get("demo", {}).get(alias)


# --- Starting ----------------------------------------------------------------------------------------------


def test_a_version_alone_starts_a_rollout_with_the_defaults_on_an_unprotected_alias(owner, staging, hook):
    response = start(owner)
    assert response.status_code == 201, response.content
    body = response.json()
    assert {k: body[k] for k in body if k not in ("id", "created_at", "step_elapsed")} == {
        "model": "demo",
        "alias": "staging",
        "version": 2,
        "base_version": 1,
        "state": "running",
        "steps": [5, 25, 50, 100],
        "step": 0,
        "percent": 5,
        "step_seconds": 300,
        "max_error_rate": 0.005,
        "max_p99_ratio": 1.2,
        "min_requests": 200,
        "promotion": None,
        "started_by": "owner",
        "ended_at": None,
        "end_reason": "",
        "last_check": None,
    }
    assert 0 <= body["step_elapsed"] < 5
    read = current(owner)
    assert read == {**body, "step_elapsed": read["step_elapsed"]} and read["step_elapsed"] >= body["step_elapsed"]

    [event] = AuditEvent.objects.filter(action="rollout.start")
    assert (event.actor, event.target, event.before) == ("owner", "demo@staging", None)
    assert event.after == {"rollout": body["id"], "version": 2, "percent": 5}
    assert deliveries() == ["rollout.started"]
    details = WebhookDelivery.objects.get().body
    assert '"event":"rollout.started"' in details and '"percent":5' in details

    state = desired_state()
    v1, v2 = staging[0], staging[1]
    assert state.routes["demo"]["staging"] == v1.pk
    assert state.splits == {"demo": {"staging": SplitSpec(rollout_id=body["id"], version_id=v2.pk, percent=5)}}
    assert state.versions[v2.pk].version == 2 and state.versions[v2.pk].model == "demo"


def test_limits_sent_are_kept(owner, staging):
    body = started(
        owner, steps=[10, 100], step_seconds=60, max_error_rate=0.1, max_p99_ratio=3, min_requests=7, reason="go"
    )
    assert (body["steps"], body["step_seconds"], body["max_error_rate"], body["max_p99_ratio"]) == (
        [10, 100],
        60,
        0.1,
        3,
    )
    assert (body["min_requests"], body["percent"]) == (7, 10)
    assert split_of() == SplitSpec(body["id"], staging[1].pk, 10)


def test_on_protected_production_a_rollout_waits_for_a_second_person(owner, approver, production, hook):
    response = start(owner, path=PROD, reason="canary")
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["state"], body["percent"], body["step"]) == ("pending", 0, 0)
    promotion = PromotionRequest.objects.get(pk=body["promotion"])
    assert (promotion.kind, promotion.version, promotion.base_version) == (
        PromotionKind.ROLLOUT,
        production[1],
        production[0],
    )
    assert (promotion.state, promotion.reason, promotion.requested_by.username) == ("pending", "canary", "owner")
    request = AuditEvent.objects.filter(action="promotion.request").latest("seq")
    assert request.after == {"alias": "production", "kind": "rollout", "version": 2, "rollout": body["id"]}
    assert split_of("production") is None  # nothing is split before the approval
    assert rollout_actions("demo@production") == []
    assert deliveries() == []

    # The requester cannot approve their own request.
    own = owner.post(f"/api/v1/promotions/{promotion.pk}/approve", {})
    assert own.status_code == 403, own.content

    approved = approver.post(f"/api/v1/promotions/{promotion.pk}/approve", {"reason": "ok"})
    assert approved.status_code == 200, approved.content
    now = current(owner, PROD)
    assert (now["state"], now["percent"], now["promotion"]) == ("running", 5, promotion.pk)
    assert split_of("production") == SplitSpec(body["id"], production[1].pk, 5)
    [begun] = AuditEvent.objects.filter(action="rollout.start")
    assert begun.actor == "approver"  # the approval began it
    assert deliveries() == ["rollout.started"]
    # Approving does not move production; only the last step will.
    assert Alias.objects.get(model__name="demo", name=PRODUCTION).version == production[0]


@pytest.mark.parametrize("decision", ["reject", "cancel"])
def test_a_refused_or_withdrawn_request_ends_the_pending_rollout_as_rejected(owner, approver, production, decision):
    body = started(owner, path=PROD)
    person = approver if decision == "reject" else owner
    decided = person.post(f"/api/v1/promotions/{body['promotion']}/{decision}", {"reason": "no"})
    assert decided.status_code == 200, decided.content
    state = "rejected" if decision == "reject" else "cancelled"
    now = current(owner, PROD)
    assert (now["state"], now["percent"]) == ("rejected", 0)
    assert now["end_reason"] == f"its promotion request was {state}" and now["ended_at"] is not None
    assert rollout_actions("demo@production") == ["rollout.reject"]
    assert split_of("production") is None
    # No longer live: another rollout may be asked for.
    assert start(owner, path=PROD).status_code == 202


def test_an_expired_request_ends_the_pending_rollout_as_rejected(owner, production):
    body = started(owner, path=PROD)
    PromotionRequest.objects.filter(pk=body["promotion"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert promotions_expire() == 1
    now = current(owner, PROD)
    assert (now["state"], now["end_reason"]) == ("rejected", "its promotion request was expired")


BAD_LIMITS: list[tuple[dict[str, Any], str]] = [
    ({"steps": []}, "steps: This list may not be empty."),
    ({"steps": [50, 25]}, "each step must be larger than the one before: [50, 25]"),
    ({"steps": [5, 5]}, "each step must be larger than the one before: [5, 5]"),
    ({"steps": [0, 100]}, "steps: 0: Ensure this value is greater than or equal to 1."),
    ({"steps": [5, 101]}, "steps: 1: Ensure this value is less than or equal to 100."),
    ({"steps": list(range(1, 22))}, "steps: Ensure this field has no more than 20 elements."),
    ({"steps": "abc"}, 'steps: Expected a list of items but got type "str".'),
    ({"steps": [True, 50]}, "steps: 0: A valid integer is required."),
    ({"step_seconds": 0}, "step_seconds: Ensure this value is greater than or equal to 1."),
    ({"max_error_rate": 2}, "max_error_rate: Ensure this value is less than or equal to 1."),
    ({"max_p99_ratio": 0}, "max_p99_ratio: Ensure this value is greater than or equal to 0.01."),
    ({"min_requests": 0}, "min_requests: Ensure this value is greater than or equal to 1."),
    ({"version": "x"}, "version: A valid integer is required."),
]


def test_bad_limits_are_refused(owner, staging):
    """One test for the whole table: each case needs the same three uploads, and refusing changes nothing."""
    answers = [(body, error_of(owner.put(STAGING, {"version": 2, **body}))) for body, _ in BAD_LIMITS]
    assert answers == [(body, (400, error)) for body, error in BAD_LIMITS]
    assert error_of(owner.put(STAGING, {})) == (400, "version: This field is required.")
    assert not AliasRollout.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="rollout.").exists()


def test_what_cannot_be_rolled_out(owner, admin, staging):
    assert error_of(start(owner, 9)) == (404, "model 'demo' has no version 9")
    assert error_of(start(owner, path="/api/v1/models/demo/aliases/nope/rollout")) == (
        404,
        "model 'demo' has no alias 'nope'",
    )
    assert error_of(start(owner, path="/api/v1/models/nope/aliases/staging/rollout")) == (404, "not found")
    assert error_of(start(owner, 1)) == (409, "alias 'staging' serves version 1 already")
    # Production is served but points to nothing yet.
    assert error_of(start(owner, path=PROD)) == (
        409,
        "alias 'production' points to no version yet: set it directly, there is nothing to compare",
    )
    ModelVersion.objects.filter(pk=staging[2].pk).update(status=VersionStatus.FAILED)
    assert error_of(start(owner, 3)) == (409, "version 3 is failed; only a ready version can be rolled out")
    set_served(admin, "staging", False)
    assert error_of(start(owner)) == (
        409,
        "alias 'staging' is not served, so there are no requests to split; serve it first",
    )
    assert not AliasRollout.objects.exists()


def test_one_live_rollout_per_alias(owner, staging):
    first = started(owner)
    response = start(owner, 3)
    assert response.status_code == 409, response.content
    assert response.json() == {
        "error": f"alias 'staging' has a rollout of version 2 running already (rollout {first['id']}); abort it first",
        "detail": {"rollout": first["id"]},
    }


def test_a_viewer_may_read_but_not_start_pause_resume_or_abort(owner, outsider, approver, staging):
    for person in (outsider, approver):  # an approver without the maintainer role neither
        assert error_of(start(person)) == (403, "this action needs the maintainer or admin role")
    started(owner)
    assert current(outsider)["state"] == "running"
    for action in ("pause", "resume", "abort"):
        assert error_of(outsider.post(f"{STAGING}/{action}", {})) == (
            403,
            "this action needs the maintainer or admin role",
        )
    assert current(owner)["state"] == "running"
    # The services refuse too, for callers other than the API (the pages).
    model = RegisteredModel.objects.get(name="demo")
    for change in (rollouts.rollout_pause, rollouts.rollout_resume, rollouts.rollout_abort):
        with pytest.raises(PermissionDenied, match=NEEDS_ROLE):
            change(model=model, alias_name="staging", actor=outsider.actor)
    with pytest.raises(PermissionDenied, match=NEEDS_ROLE):
        rollouts.rollout_start(model=model, alias_name="staging", version_number=3, actor=approver.actor)


def test_reading_the_rollout_of_an_alias_that_never_had_one(owner, staging):
    assert error_of(owner.get(STAGING)) == (404, "alias 'staging' of model 'demo' has never had a rollout")
    assert error_of(owner.get("/api/v1/models/demo/aliases/nope/rollout")) == (404, "model 'demo' has no alias 'nope'")
    assert error_of(owner.get("/api/v1/models/nope/aliases/staging/rollout")) == (404, "not found")


def test_reading_gives_the_live_rollout_else_the_last_one(owner, staging):
    first = started(owner)
    assert current(owner)["id"] == first["id"]
    assert owner.post(f"{STAGING}/abort", {}).status_code == 200
    assert (current(owner)["id"], current(owner)["state"]) == (first["id"], "aborted")
    second = started(owner, 3)
    assert (current(owner)["id"], current(owner)["version"]) == (second["id"], 3)
    assert owner.post(f"{STAGING}/abort", {}).status_code == 200
    assert (current(owner)["id"], current(owner)["state"]) == (second["id"], "aborted")


# --- The periodic check ------------------------------------------------------------------------------------


def test_a_step_passes_after_its_time_and_its_requests_and_the_last_one_moves_the_alias(owner, staging, hook):
    heartbeat(traffic(500))  # before the rollout: none of it counts
    body = started(owner, steps=[10, 50, 100], step_seconds=60, min_requests=10)
    rollout_id = body["id"]
    assert AliasRollout.objects.get(pk=rollout_id).baseline == {"w1": {"1": traffic(500).as_json()}}

    # Enough requests, but not the time: it waits, saying nothing of requests.
    heartbeat(traffic(600), traffic(20))
    assert rollouts_advance() == {rollout_id: "checked"}
    check = current(owner)["last_check"]
    assert (check["step"], check["candidate"]["requests"], check["current"]["requests"]) == (0, 20, 100)
    assert check["candidate"]["p99_ms"] == 3.2 and check["candidate"]["error_rate"] == 0.0
    assert "waiting" not in check

    # The time has passed: the next step begins, measured from the totals of now.
    age(61)
    assert rollouts_advance() == {rollout_id: "stepped"}
    now = current(owner)
    assert (now["state"], now["step"], now["percent"]) == ("running", 1, 50)
    assert now["step_elapsed"] < 5
    assert AliasRollout.objects.get(pk=rollout_id).baseline == {
        "w1": {"1": traffic(600).as_json(), "2": traffic(20).as_json()}
    }
    assert split_of() == SplitSpec(rollout_id, staging[1].pk, 50)
    step = AuditEvent.objects.get(action="rollout.step")
    assert step.before == {"step": 0, "percent": 10}
    assert (step.after["step"], step.after["percent"]) == (1, 50)
    assert step.after["passed"]["candidate"]["requests"] == 20

    # The time has passed but the new step has only 5 requests of its own: it waits and says so.
    heartbeat(traffic(700), traffic(25))
    age(61)
    assert rollouts_advance() == {rollout_id: "checked"}
    check = current(owner)["last_check"]
    assert (check["step"], check["candidate"]["requests"], check["current"]["requests"]) == (1, 5, 100)
    assert check["waiting"] == "5 of the 10 requests a step needs so far"
    assert current(owner)["step"] == 1

    # A second process's figures add to the first's (it had none when the step began: all of it counts).
    heartbeat(traffic(40), traffic(5), worker="w2")
    assert rollouts_advance() == {rollout_id: "stepped"}
    assert current(owner)["percent"] == 100
    assert AuditEvent.objects.filter(action="rollout.step").latest("seq").after["passed"]["candidate"]["requests"] == 10

    # The last step passed: the alias moves to the candidate and nothing is split any longer.
    heartbeat(traffic(700), traffic(40))
    age(61)
    assert rollouts_advance() == {rollout_id: "completed"}
    done = current(owner)
    assert (done["state"], done["percent"], done["end_reason"]) == ("completed", 0, "passed every step")
    assert done["ended_at"] is not None
    move = AliasMove.objects.filter(alias__name="staging").latest("moved_at")
    assert (move.kind, move.from_version, move.to_version, move.promotion) == (
        AliasMoveKind.SET,
        staging[0],
        staging[1],
        None,
    )
    assert move.reason == f"rollout {rollout_id} passed its 3 steps"
    state = desired_state()
    assert state.routes["demo"]["staging"] == staging[1].pk and state.splits == {}
    assert rollout_actions() == ["rollout.start", "rollout.step", "rollout.step", "rollout.complete"]
    assert actions()[-2:] == ["alias.set", "rollout.complete"]
    moved = AuditEvent.objects.filter(action="alias.set", target="demo@staging").latest("seq")
    assert moved.actor == "rollout" and moved.after["version"] == 2
    assert deliveries() == ["rollout.started", "rollout.step", "rollout.step", "rollout.completed"]
    assert rollouts_advance() == {}  # nothing runs any more


def test_a_rollout_on_production_completes_as_its_approved_promotion(owner, approver, production):
    body = started(owner, path=PROD, steps=[50, 100], step_seconds=1, min_requests=1)
    assert approver.post(f"/api/v1/promotions/{body['promotion']}/approve", {}).status_code == 200
    heartbeat(traffic(10), traffic(10), alias="production")
    age(2)
    assert rollouts_advance() == {body["id"]: "stepped"}
    heartbeat(traffic(10), traffic(20), alias="production")
    age(2)
    assert rollouts_advance() == {body["id"]: "completed"}
    move = AliasMove.objects.filter(alias__name=PRODUCTION).latest("moved_at")
    assert (move.kind, move.to_version, move.promotion_id) == (AliasMoveKind.APPROVAL, production[1], body["promotion"])
    assert PromotionRequest.objects.get(pk=body["promotion"]).state == PromotionState.APPROVED
    assert current(owner, PROD)["state"] == "completed"


def test_errors_on_the_candidate_roll_it_back_at_once(owner, staging, hook):
    body = started(owner)  # the defaults: 0.5% of at least 200 requests is one error
    heartbeat(traffic(100), traffic(10, errors=1))
    assert rollouts_advance() == {body["id"]: "checked"}  # one error may still be within the limit
    heartbeat(traffic(100), traffic(10, errors=1), worker="w2")  # a second process's error makes it two
    assert rollouts_advance() == {body["id"]: "rolled_back"}
    now = current(owner)
    assert (now["state"], now["percent"], now["step"]) == ("rolled_back", 0, 0)
    assert now["end_reason"] == "error rate 10.00% (2 of 20 requests) is above the limit of 0.50%"
    assert now["last_check"]["candidate"] == {"requests": 20, "errors": 2, "error_rate": 0.1, "p99_ms": 3.2}
    assert split_of() is None
    assert desired_state().routes["demo"]["staging"] == staging[0].pk
    assert rollout_actions() == ["rollout.start", "rollout.rolled_back"]
    event = AuditEvent.objects.get(action="rollout.rolled_back")
    assert event.actor == "rollout" and event.before == {"state": "running", "percent": 5}
    assert event.after == {"rollout": body["id"], "state": "rolled_back", "reason": now["end_reason"]}
    assert deliveries() == ["rollout.started", "rollout.rolled_back"]
    assert not AliasMove.objects.filter(to_version=staging[1]).exists()


def test_a_slow_candidate_is_rolled_back_once_both_versions_have_their_requests(owner, staging):
    body = started(owner, min_requests=20)
    heartbeat(traffic(19), traffic(20, latency_bin=SLOW))
    assert rollouts_advance() == {body["id"]: "checked"}  # the current version has too few to compare with
    heartbeat(traffic(20), traffic(20, latency_bin=SLOW))
    assert rollouts_advance() == {body["id"]: "rolled_back"}
    now = current(owner)
    assert now["state"] == "rolled_back"
    assert now["end_reason"] == ("p99 latency 102 ms is 31.88x the current version's 3.2 ms, above the limit of 1.2x")
    assert (now["last_check"]["candidate"]["p99_ms"], now["last_check"]["current"]["p99_ms"]) == (102.0, 3.2)


def test_a_candidate_as_fast_as_the_current_version_passes(owner, staging):
    body = started(owner, steps=[5, 100], step_seconds=1, min_requests=20, max_p99_ratio=1.2)
    heartbeat(traffic(20), traffic(20, latency_bin=FAST + 1))  # 3.81 ms against 3.2 ms: 1.19x
    age(2)
    assert rollouts_advance() == {body["id"]: "stepped"}


# --- Pause, resume, abort ----------------------------------------------------------------------------------


def test_a_paused_rollout_holds_its_share_and_its_clock_until_resumed(owner, staging, hook):
    body = started(owner, step_seconds=60, min_requests=1)
    age(30)
    paused = owner.post(f"{STAGING}/pause", {"reason": "looking"})
    assert paused.status_code == 200, paused.content
    frozen = paused.json()["step_elapsed"]
    assert paused.json()["state"] == "paused" and 30 <= frozen < 35
    assert split_of() == SplitSpec(body["id"], staging[1].pk, 5)  # the share is held

    # Paused, the clock stands still: the check looks at the figures (for a breach) but never moves it on.
    age(300)
    heartbeat(traffic(100), traffic(100))
    assert rollouts_advance() == {body["id"]: "checked"}
    now = current(owner)
    assert (now["state"], now["step"], now["step_elapsed"]) == ("paused", 0, frozen)
    assert now["last_check"]["candidate"]["requests"] == 100 and now["last_check"]["elapsed"] == frozen

    assert error_of(owner.post(f"{STAGING}/pause", {})) == (
        409,
        "alias 'staging' of model 'demo' has no running rollout",
    )
    resumed = owner.post(f"{STAGING}/resume", {})
    assert resumed.status_code == 200, resumed.content
    assert resumed.json()["state"] == "running" and frozen <= resumed.json()["step_elapsed"] < frozen + 5
    assert error_of(owner.post(f"{STAGING}/resume", {})) == (
        409,
        "alias 'staging' of model 'demo' has no paused rollout",
    )
    assert rollouts_advance() == {body["id"]: "checked"}  # 30 of its 60 seconds
    age(31)
    assert rollouts_advance() == {body["id"]: "stepped"}

    assert rollout_actions() == ["rollout.start", "rollout.pause", "rollout.resume", "rollout.step"]
    pause = AuditEvent.objects.get(action="rollout.pause")
    assert (pause.actor, pause.before, pause.after) == (
        "owner",
        {"state": "running"},
        {"rollout": body["id"], "reason": "looking"},
    )
    assert deliveries() == ["rollout.started", "rollout.paused", "rollout.resumed", "rollout.step"]


def test_abort_sends_every_request_back_to_the_current_version(owner, staging, hook):
    body = started(owner)
    aborted = owner.post(f"{STAGING}/abort", {"reason": "changed my mind"})
    assert aborted.status_code == 200, aborted.content
    now = aborted.json()
    assert (now["id"], now["state"], now["percent"], now["end_reason"]) == (
        body["id"],
        "aborted",
        0,
        "changed my mind",
    )
    assert split_of() is None
    assert rollouts_advance() == {}
    assert error_of(owner.post(f"{STAGING}/abort", {})) == (
        409,
        "alias 'staging' of model 'demo' has no pending or running or paused rollout",
    )
    assert error_of(owner.post(f"{STAGING}/pause", {})) == (
        409,
        "alias 'staging' of model 'demo' has no running rollout",
    )
    event = AuditEvent.objects.get(action="rollout.abort")
    assert (event.actor, event.after) == (
        "owner",
        {"rollout": body["id"], "state": "aborted", "reason": "changed my mind"},
    )
    assert deliveries() == ["rollout.started", "rollout.aborted"]


def test_a_paused_rollout_can_be_aborted_without_a_reason(owner, staging):
    started(owner)
    assert owner.post(f"{STAGING}/pause", {}).status_code == 200
    aborted = owner.post(f"{STAGING}/abort", {})
    assert aborted.status_code == 200, aborted.content
    assert (aborted.json()["state"], aborted.json()["end_reason"]) == ("aborted", "aborted")
    assert split_of() is None


def test_aborting_a_pending_rollout_withdraws_its_request(owner, approver, production):
    body = started(owner, path=PROD)
    aborted = owner.post(f"{PROD}/abort", {})
    assert aborted.status_code == 200, aborted.content
    assert (aborted.json()["state"], aborted.json()["percent"]) == ("aborted", 0)
    promotion = PromotionRequest.objects.get(pk=body["promotion"])
    assert (promotion.state, promotion.decision_reason) == (PromotionState.CANCELLED, "the rollout was aborted")
    approve = approver.post(f"/api/v1/promotions/{promotion.pk}/approve", {})
    assert error_of(approve) == (409, f"promotion request {promotion.pk} is already cancelled")
    assert current(owner, PROD)["state"] == "aborted"
    assert split_of("production") is None


# --- What changes under a running rollout ------------------------------------------------------------------


def test_moving_the_alias_meanwhile_aborts_the_rollout(owner, staging):
    body = started(owner)
    assert set_alias(owner, "staging", 3).status_code == 200
    assert rollouts_advance() == {body["id"]: "aborted"}
    now = current(owner)
    assert (now["state"], now["percent"]) == ("aborted", 0)
    assert now["end_reason"] == "alias 'staging' was moved to version 3 meanwhile"
    assert AuditEvent.objects.get(action="rollout.abort").actor == "rollout"
    assert desired_state().routes["demo"]["staging"] == staging[2].pk and split_of() is None


def test_a_candidate_no_longer_ready_or_an_alias_no_longer_served_aborts_it(owner, admin, staging):
    body = started(owner)
    ModelVersion.objects.filter(pk=staging[1].pk).update(status=VersionStatus.FAILED)
    assert rollouts_advance() == {body["id"]: "aborted"}
    assert current(owner)["end_reason"] == "version 2 is failed"

    ModelVersion.objects.filter(pk=staging[1].pk).update(status=VersionStatus.READY)
    second = started(owner)
    set_served(admin, "staging", False)
    assert rollouts_advance() == {second["id"]: "aborted"}
    assert current(owner)["end_reason"] == "alias 'staging' is no longer served"


# --- Concurrency: the locks each change takes -------------------------------------------------------------


class Held:
    """Stops one named thread inside a service function (its locks held) until ``go`` is set."""

    def __init__(self, real: Callable[..., Any], thread: str) -> None:
        self.real, self.thread = real, thread
        self.inside, self.go = threading.Event(), threading.Event()

    def __call__(self, *args: Any) -> Any:
        if threading.current_thread().name == self.thread:
            self.inside.set()
            self.go.wait(5)
        return self.real(*args)


def in_thread(name: str, call: Callable[[], Any], results: dict[str, Any]) -> threading.Thread:
    def run() -> None:
        try:
            results[name] = call()
        except Exception as exc:  # noqa: BLE001 - the test asserts there was none
            results[name] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
def test_aborting_a_pending_rollout_while_its_request_is_approved_does_not_deadlock(
    owner, approver, production, monkeypatch
):
    body = started(owner, path=PROD)
    model, requester, reviewer = RegisteredModel.objects.get(name="demo"), owner.actor, approver.actor
    held = Held(promotions.reviewer_conflict, "approve")  # the approval holds the model and the request here
    monkeypatch.setattr(promotions, "reviewer_conflict", held)
    results: dict[str, Any] = {}
    approving = in_thread(
        "approve", lambda: promotions.promotion_approve(promotion_id=body["promotion"], actor=reviewer), results
    )
    assert held.inside.wait(10)
    aborting = in_thread(
        "abort", lambda: rollouts.rollout_abort(model=model, alias_name=PRODUCTION, actor=requester), results
    )
    time.sleep(0.3)  # the abort reaches its first lock
    held.go.set()
    approving.join(20)
    aborting.join(20)
    # The abort waited for the approval (both take the model's row first), then aborted the running rollout.
    assert not isinstance(results["approve"], Exception), results["approve"]
    assert not isinstance(results["abort"], Exception), results["abort"]
    assert PromotionRequest.objects.get(pk=body["promotion"]).state == PromotionState.APPROVED
    assert AliasRollout.objects.get(pk=body["id"]).state == "aborted"
    assert rollout_actions("demo@production") == ["rollout.start", "rollout.abort"]


@pytest.mark.django_db(transaction=True)
def test_a_check_leaves_an_alias_being_moved_alone_and_then_aborts_the_rollout(owner, staging, monkeypatch):
    body = started(owner, steps=[100], step_seconds=1, min_requests=1)
    heartbeat(traffic(10), traffic(10))
    age(2)  # the check would complete it, moving staging to v2
    model, mover = RegisteredModel.objects.get(name="demo"), owner.actor
    held = Held(promotions.check_alias_signature, "move")  # alias_set holds the model and the alias here
    monkeypatch.setattr(promotions, "check_alias_signature", held)
    results: dict[str, Any] = {}
    moving = in_thread(
        "move",
        lambda: promotions.alias_set(model=model, alias_name="staging", version_number=3, actor=mover),
        results,
    )
    assert held.inside.wait(10)
    assert rollouts_advance() == {body["id"]: "skipped"}  # the alias is being moved: not now
    held.go.set()
    moving.join(20)
    assert not isinstance(results["move"], Exception), results["move"]
    assert rollouts_advance() == {body["id"]: "aborted"}
    assert current(owner)["end_reason"] == "alias 'staging' was moved to version 3 meanwhile"
    assert Alias.objects.get(model__name="demo", name="staging").version == staging[2]
    assert not AliasMove.objects.filter(to_version=staging[1]).exists()


def test_a_paused_rollout_still_splits_so_a_breach_still_rolls_it_back(owner, staging):
    body = started(owner, step_seconds=60, min_requests=10, max_error_rate=0.1)
    assert owner.post(f"{STAGING}/pause", {}).status_code == 200
    heartbeat(traffic(100), traffic(10, errors=5))
    assert rollouts_advance() == {body["id"]: "rolled_back"}
    ended = current(owner)
    assert (ended["state"], ended["percent"]) == ("rolled_back", 0)
    assert ended["end_reason"] == "error rate 50.00% (5 of 10 requests) is above the limit of 10.00%"
    assert split_of() is None


def test_a_breaking_signature_needs_force_and_a_reason_as_a_direct_set_does(owner, staging):
    response = owner.upload("demo", [("model.onnx", add_model_bytes(bias=1.0, width=5))])
    assert response.status_code == 201, response.content
    number = response.json()["version"]
    refused = owner.put(STAGING, {"version": number})
    assert refused.status_code == 409, refused.content
    assert refused.json()["error"].startswith(f"version {number} is not compatible with version 1 behind 'staging'")
    assert AliasRollout.objects.count() == 0
    assert owner.put(STAGING, {"version": number, "force": True}).status_code == 400  # a reason is needed
    forced = owner.put(STAGING, {"version": number, "force": True, "reason": "the new input width is intended"})
    assert forced.status_code == 201, forced.content
    assert forced.json()["state"] == "running"
