"""``registry.serving``, the seam the inference runtime reads and writes the registry through.

The desired state, the worker report and the fleet come back as typed rows; "online" has one
definition, used by the fleet API, the fleet page and ``PUT alias?wait=``; the /v2 token check
refuses what the REST API refuses.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from registry import serving
from registry.access import services
from registry.audit.chain import SYSTEM
from registry.models import PRODUCTION, ApiToken, InferenceWorker, Role
from registry.serving import Laggard, LoadedRow, LoadState, ServedFile, WorkerReport
from tests.support.people import make_person
from tests.support.registry import create_model, promote, set_alias, upload_versions

pytestmark = pytest.mark.django_db


def report(worker_id: str, *rows: LoadedRow) -> WorkerReport:
    return WorkerReport(
        worker_id=worker_id,
        host="h",
        pid=7,
        device="cpu",
        provider="CPUExecutionProvider",
        started_at=timezone.now(),
        loaded=rows,
    )


def seen_ago(worker_id: str, seconds: float) -> None:
    InferenceWorker.objects.filter(worker_id=worker_id).update(heartbeat_at=timezone.now() - timedelta(seconds=seconds))


def ready(version: int, *aliases: str, model: str = "demo") -> LoadedRow:
    return LoadedRow(model=model, version=version, state=LoadState.READY, aliases=aliases, provider="CPU")


def test_desired_state_holds_the_served_versions_as_typed_rows(owner, approver):
    create_model(owner)
    v1, _ = upload_versions(owner, [1.0, 2.0])
    assert serving.desired_state().versions == {}  # production points nowhere yet
    promote(owner, approver, 1)
    assert set_alias(owner, "staging", 2).status_code == 200  # not served: not desired

    state = serving.desired_state()
    assert dict(state.routes) == {"demo": {PRODUCTION: v1.pk}}
    [spec] = state.versions.values()
    file = v1.files.get()
    assert (spec.version_id, spec.model, spec.version, spec.sha256, spec.model_file) == (
        v1.pk,
        "demo",
        1,
        v1.sha256,
        "model.onnx",
    )
    assert spec.files == (ServedFile("model.onnx", file.storage_key, file.sha256, file.size_bytes),)
    assert spec.signature == v1.signature
    assert (spec.strategy, spec.max_batch_size, spec.max_queue_delay_us, spec.max_queue_size) == (
        "blue-green",
        32,
        0,
        1024,
    )


def test_a_worker_report_is_written_as_json_and_read_back_as_the_same_rows():
    rows = (
        LoadedRow(
            model="demo",
            version=1,
            state=LoadState.READY,
            aliases=("production", "staging"),
            load_seconds=0.25,
            memory_bytes=1024,
            provider="CPUExecutionProvider",
            note="CUDAExecutionProvider not available",
        ),
        LoadedRow(model="demo", version=2, state=LoadState.FAILED, error="HashMismatch: x", attempts=2),
    )
    sent = report("w-1", *rows)
    serving.worker_heartbeat(sent)

    stored = InferenceWorker.objects.get(worker_id="w-1")
    assert stored.loaded[1] == {
        "model": "demo",
        "version": 2,
        "aliases": [],
        "state": "failed",
        "error": "HashMismatch: x",
        "load_seconds": None,
        "memory_bytes": None,
        "provider": "",
        "note": "",
        "attempts": 2,
        "instances": 0,
        "batching": None,
        "batching_reason": "",
        "traffic": [],
        "totals": {"requests": 0, "errors": 0, "latency": {}},
        "splits": {},
        "shadows": [],
    }
    [worker] = serving.fleet_list()
    assert worker.loaded == rows
    assert (worker.worker_id, worker.host, worker.pid, worker.online, worker.errors) == ("w-1", "h", 7, True, ())
    assert worker.started_at == sent.started_at

    serving.worker_heartbeat(report("w-1"))  # the next beat replaces the row
    assert InferenceWorker.objects.get().loaded == []


@pytest.mark.parametrize(("heartbeat", "online_for"), [(1.0, 15.0), (5.0, 15.0), (10.0, 30.0)])
def test_online_means_three_heartbeats_and_at_least_15_seconds(settings, heartbeat, online_for):
    settings.FLEET_HEARTBEAT_SECONDS = heartbeat
    assert serving.offline_after() == timedelta(seconds=online_for)
    for worker_id in ("fresh", "stale"):
        serving.worker_heartbeat(report(worker_id))
    # 5 s either side of the line: a loaded machine can pause this test for seconds between two statements.
    seen_ago("fresh", online_for - 5)
    seen_ago("stale", online_for + 5)
    assert [(w.worker_id, w.online) for w in serving.fleet_list()] == [("fresh", True), ("stale", False)]
    assert [w.worker_id for w in serving.fleet_list(online_only=True)] == ["fresh"]


def test_the_fleet_api_and_page_use_the_one_definition_of_online(owner, settings):
    settings.FLEET_HEARTBEAT_SECONDS = 5.0  # offline after 15 s
    for worker_id in ("fresh", "stale"):
        serving.worker_heartbeat(report(worker_id, ready(1, PRODUCTION)))
    seen_ago("fresh", 8)  # 7 s inside the line: the two requests below may wait seconds on a loaded machine
    seen_ago("stale", 25)
    workers = owner.get("/api/v1/fleet").json()
    assert [(w["worker_id"], w["online"]) for w in workers] == [("fresh", True), ("stale", False)]
    assert workers[0]["loaded"] == [ready(1, PRODUCTION).as_json()]
    assert [w["worker_id"] for w in owner.get("/api/v1/fleet?online=true").json()] == ["fresh"]
    owner.client.force_login(get_user_model().objects.get(username=owner.username))
    page = owner.client.get("/ui/fleet")
    assert [(row["worker"].worker_id, row["online"]) for row in page.context["workers"]] == [
        ("fresh", True),
        ("stale", False),
    ]


def test_fleet_list_is_one_query(django_assert_num_queries):
    for i in range(5):
        serving.worker_heartbeat(report(f"w-{i}", ready(1, PRODUCTION)))
    with django_assert_num_queries(1):
        assert len(serving.fleet_list()) == 5


def test_laggards_are_the_online_workers_that_do_not_serve_the_version_yet():
    serving.worker_heartbeat(report("a-done", ready(1), ready(2, PRODUCTION)))
    serving.worker_heartbeat(report("b-old", ready(1, PRODUCTION)))
    serving.worker_heartbeat(
        report(
            "c-failed",
            ready(1, PRODUCTION),
            LoadedRow(model="demo", version=2, state=LoadState.FAILED, error="HashMismatch: sha256 mismatch"),
        )
    )
    serving.worker_heartbeat(report("d-loading", LoadedRow(model="demo", version=2, state=LoadState.LOADING)))
    serving.worker_heartbeat(report("e-other-alias", ready(2, "staging")))
    serving.worker_heartbeat(report("f-gone", ready(1, PRODUCTION)))
    seen_ago("f-gone", 3600)  # offline workers are not waited for

    behind = serving.fleet_laggards(model="demo", alias=PRODUCTION, version=2)
    assert behind == [
        Laggard("b-old", serving=1, state="not loaded", error=""),
        Laggard("c-failed", serving=1, state="failed", error="HashMismatch: sha256 mismatch"),
        Laggard("d-loading", serving=None, state="loading", error=""),
        Laggard("e-other-alias", serving=None, state="ready", error=""),
    ]
    assert behind[1].as_json() == {
        "worker_id": "c-failed",
        "serving": 1,
        "state": "failed",
        "error": "HashMismatch: sha256 mismatch",
    }
    # Back to v1: the worker that moved on is behind now, and so are those that never served production.
    assert serving.fleet_wait(model="demo", alias=PRODUCTION, version=1, timeout=0) == [
        Laggard("a-done", serving=2, state="ready", error=""),
        Laggard("d-loading", serving=None, state="not loaded", error=""),
        Laggard("e-other-alias", serving=None, state="not loaded", error=""),
    ]


def test_token_may_infer_refuses_what_the_api_refuses():
    allowed = [make_person("client", Role.INFERENCE).token, make_person("root", Role.ADMIN).token]
    viewer = make_person("viewer", Role.VIEWER).token
    revoked_token, revoked = services.token_create(username="r", create_user=True, roles=[Role.INFERENCE], actor=SYSTEM)
    services.token_revoke(token=revoked_token, actor=SYSTEM)
    expired_token, expired = services.token_create(username="e", create_user=True, roles=[Role.INFERENCE], actor=SYSTEM)
    ApiToken.objects.filter(pk=expired_token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    inactive_token, inactive = services.token_create(
        username="i", create_user=True, roles=[Role.INFERENCE], actor=SYSTEM
    )
    inactive_token.user.is_active = False
    inactive_token.user.save()

    assert [serving.token_may_infer(raw) for raw in allowed] == [True, True]
    for refused in (viewer, revoked, expired, inactive, allowed[0] + "x", "my_abc_def"):
        assert serving.token_may_infer(refused) is False, refused
    # Only a live token that lacks the role is known (a 403 on /v2); every other refusal is a 401.
    assert serving.token_inference_access(viewer) is serving.InferenceAccess.NO_ROLE
    for refused in (revoked, expired, inactive, allowed[0] + "x", "my_abc_def"):
        assert serving.token_inference_access(refused) is serving.InferenceAccess.REFUSED, refused
    assert serving.token_shaped(allowed[0]) is True
    assert [serving.token_shaped(raw) for raw in ("", "Bearer x", "my_", "my__x", "my_a\x00_b")] == [False] * 5
