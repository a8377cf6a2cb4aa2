"""Every operation of the REST API, as ``/api/schema/`` documents it, works with only its required fields.

A client that sends what the schema requires and nothing else, or fills a form with every optional
field left empty (``curl -F description=``, a browser's empty box), must get the documented success
and the effect an empty field stands for: nothing, or no change. An empty optional ``metadata``
field once made every upload from the web UI fail while 1,138 tests passed, because each test
filled it.

The bodies are built from the schema (``tests/support/openapi.py``): for JSON, the required fields
alone, then again with each optional string the schema lets be "" sent as ""; for multipart and
urlencoded forms, the required fields with every optional field present and empty. ``CALLS`` says
for each operation who sends it, against which registry state, the status it answers and what it
must have done. An operation the schema gains without a row in ``CALLS`` fails
``test_every_documented_operation_is_in_the_table``: add its row.

The registry state (``tests/support/required_world.py``: people, a model with two validated
versions, aliases, a pending promotion, a webhook, a derive job, a spare token) is made once for
the module through the API, and each test runs in a savepoint of it.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import TestCase

from storage import get_storage
from tests.support.jobs_by_hand import run_job
from tests.support.onnx_models import add_model_bytes
from tests.support.openapi import (
    EMPTY_FIELDS,
    EMPTY_STRINGS,
    REQUIRED_ONLY,
    Body,
    Operation,
    api_schema,
    body_kinds,
    operations,
    query_parameters,
    query_string,
    request_bodies,
    response_problems,
)
from tests.support.required_world import HOOK_URL, MODEL, World, ok, session, use_world, world_for_module

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def world(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with world_for_module(django_db_blocker, tmp_path_factory.mktemp("required-fields-api")) as made:
        yield made


@pytest.fixture(autouse=True)
def _world(world: World, settings: Any, tmp_path: Path) -> None:
    use_world(world, settings, tmp_path)


# --- What each operation needs and does ---------------------------------------------------------------

# (the world, the body sent or None, the answer's JSON or, for a file, the response itself)
Check = Callable[[World, Body | None, Any], None]


@dataclass(frozen=True)
class Call:
    """How to send one operation: who, to which path, with which required values; what success is."""

    who: str
    status: int
    params: Callable[[World], dict[str, Any]] = lambda world: {}
    values: Callable[[World], dict[str, Any]] = lambda world: {}
    check: Check | None = None
    session: bool = False  # signed in through the browser, not with a token
    runs_tasks: bool = False  # run what the request queues after commit (the upload's validation), as a server does
    prepare: Callable[[World], None] | None = None  # more state than the world's, made in the test's savepoint


def _emptied(body: Body | None) -> set[str]:
    return set(body.empty) if body is not None else set()


def _model_after(world: World, body: Body | None, answer: Any) -> None:
    after = world.read(f"/api/v1/models/{MODEL}")
    emptied = _emptied(body)
    # An empty description or tag list clears it; an empty instances means "by provider" (null); any other
    # empty field leaves the setting as it was.
    assert after["description"] == ("" if "description" in emptied else "a demo model")
    assert after["tags"] == ([] if "tags" in emptied else ["t1"])
    assert (after["serving_strategy"], after["batching"], after["max_batch_size"]) == ("blue-green", "off", 8)
    assert after["instances"] is None
    assert answer == after


def _version_after(world: World, body: Body | None, answer: Any) -> None:
    after = world.read(f"/api/v1/models/{MODEL}/versions/1")
    emptied = _emptied(body)
    assert after["description"] == ("" if "description" in emptied else "first")
    assert after["tags"] == ([] if "tags" in emptied else ["v1tag"])
    # Its lineage was empty; empty lineage fields leave it so (and need no uploader's say).
    assert (after["source_run_url"], after["source_commit"], after["source_datasets"], after["derived_from"]) == (
        "",
        "",
        [],
        None,
    )
    assert answer == after


def _model_created(world: World, body: Body | None, answer: Any) -> None:
    created = world.read("/api/v1/models/fresh")
    assert (created["name"], created["description"], created["tags"], created["created_by"]) == ("fresh", "", [], "mia")


def _version_uploaded(world: World, body: Body | None, answer: Any) -> None:
    version = world.read(f"/api/v1/models/{MODEL}/versions/3")
    assert (version["status"], version["description"], version["metadata"], version["tags"]) == ("ready", "", {}, [])
    assert [f["name"] for f in version["files"]] == ["model.onnx"]
    # Lineage fields sent empty set nothing.
    lineage = (version["source_run_url"], version["source_commit"], version["source_datasets"], version["derived_from"])
    assert lineage == ("", "", [], None)


def _staging_on(number: int, kind: str) -> Check:
    def check(world: World, body: Body | None, answer: Any) -> None:
        assert world.read(f"/api/v1/models/{MODEL}/aliases/staging")["version"] == number
        last = world.read(f"/api/v1/models/{MODEL}/aliases/staging/history")[-1]  # oldest first
        assert (last["to_version"], last["kind"], last["reason"]) == (number, kind, "")

    return check


def _staging_flags_kept(world: World, body: Body | None, answer: Any) -> None:
    staging = world.read(f"/api/v1/models/{MODEL}/aliases/staging")
    assert (staging["version"], staging["protected"], staging["served"]) == (2, False, False)
    # An empty limit is no limit (null); an empty trusted signers field is none (any trusted signer).
    assert (staging["max_slowdown_percent"], staging["min_cosine"], staging["max_abs_diff"]) == (None, None, None)
    assert (staging["require_signature"], staging["trusted_signers"]) == (False, [])
    assert answer["alias"] == "staging"


def _signed(world: World, body: Body | None, answer: Any) -> None:
    assert (answer["signed"], answer["problems"], [s["kind"] for s in answer["signers"]]) == (True, [], ["registry"])


def _decided(state: str, production: int | None, by: str) -> Check:
    def check(world: World, body: Body | None, answer: Any) -> None:
        promotion = world.read(f"/api/v1/promotions/{world.promotion}")
        assert (promotion["state"], promotion["decided_by"], promotion["decision_reason"]) == (state, by, "")
        assert world.read(f"/api/v1/models/{MODEL}/aliases/production")["version"] == production

    return check


def _derive_queued(world: World, body: Body | None, answer: Any) -> None:
    job = world.read(f"/api/v1/derive-jobs/{answer['id']}")
    assert (job["recipe"], job["source_version"], job["status"], job["requested_by"]) == (
        "ort-optimized",
        1,
        "pending",
        "mia",
    )
    assert job["options"] == world.read(f"/api/v1/derive-jobs/{world.derive_job}")["options"]  # the defaults


def _benchmarks_queued(world: World, body: Body | None, answer: Any) -> None:
    assert answer and all((row["version"], row["status"]) == (1, "pending") for row in answer)


def _token_created(world: World, body: Body | None, answer: Any) -> None:
    assert (answer["user"], answer["name"], answer["expires_at"]) == ("mia", "", None)
    assert (answer["roles"], answer["models"]) == (None, [])  # unlimited: all of her roles, every model
    assert answer["token"]
    listed = world.read("/api/v1/tokens?user=mia")["results"]
    assert answer["prefix"] in [token["prefix"] for token in listed]


def _token_rotated(world: World, body: Body | None, answer: Any) -> None:
    # Without an overlap given, the old token keeps working for 24 hours; the new one has its name and limits.
    assert (answer["user"], answer["name"], answer["rotated_from"]) == ("mia", "spare", world.spare_token)
    assert (answer["roles"], answer["models"]) == (None, [])
    listed = {token["prefix"]: token for token in world.read("/api/v1/tokens?user=mia")["results"]}
    assert listed[world.spare_token]["expires_at"] is not None and answer["prefix"] in listed


def _priority_set(world: World, body: Body | None, answer: Any) -> None:
    # Only an admin's PATCH with a class changes it; without one (or empty) the token stays as it was.
    priority = "high" if body is not None and body.fields.get("priority") else "normal"
    assert (answer["prefix"], answer["priority"]) == (world.spare_token, priority)
    listed = {token["prefix"]: token for token in world.read("/api/v1/tokens?user=mia")["results"]}
    assert listed[world.spare_token]["priority"] == priority


def _service_account(world: World) -> None:
    ok(world.people["root"].post("/api/v1/service-accounts", {"username": "pipeline"}), 201)


def _service_account_created(world: World, body: Body | None, answer: Any) -> None:
    created = world.read("/api/v1/service-accounts/pipeline")
    assert (created["owner"], created["roles"], created["description"]) == ("root", [], "")
    assert answer == created


def _service_account_gone(world: World, body: Body | None, answer: Any) -> None:
    assert world.status_of("/api/v1/service-accounts/pipeline") == 404


def _token_revoked(world: World, body: Body | None, answer: Any) -> None:
    listed = {token["prefix"]: token for token in world.read("/api/v1/tokens?user=mia")["results"]}
    assert listed[world.spare_token]["revoked_at"] is not None


def _webhook_created(world: World, body: Body | None, answer: Any) -> None:
    hook = world.read(f"/api/v1/webhooks/{answer['id']}")
    assert (hook["url"], hook["events"], hook["model"], hook["active"]) == (
        HOOK_URL,
        ["promotion.rejected"],
        None,
        True,
    )
    assert len(answer["secret"]) >= 32  # an empty secret asks for a generated one


def _webhook_after(world: World, body: Body | None, answer: Any) -> None:
    hook = world.read(f"/api/v1/webhooks/{world.webhook}")
    # An empty model is no model filter (null), as when it is created; any other empty field changes nothing.
    model = None if "model" in _emptied(body) else MODEL
    assert (hook["url"], hook["events"], hook["model"], hook["active"]) == (HOOK_URL, ["alias.moved"], model, False)
    assert answer == hook


def _webhook_gone(world: World, body: Body | None, answer: Any) -> None:
    assert world.status_of(f"/api/v1/webhooks/{world.webhook}") == 404


def _card_downloaded(world: World, body: Body | None, answer: Any) -> None:
    assert answer["Content-Disposition"] == f'attachment; filename="{MODEL}-v1-card.md"'
    assert answer.content.decode().startswith(f"# Model card: {MODEL} v1\n")


def _model_downloaded(world: World, body: Body | None, answer: Any) -> None:
    """With ``?file=`` empty, as without it: the version's .onnx model."""
    (model_file,) = world.read(f"/api/v1/models/{MODEL}/versions/1")["files"]
    assert (answer["X-Content-SHA256"], answer["Content-Length"]) == (
        model_file["sha256"],
        str(model_file["size_bytes"]),
    )


def _serve_staging(world: World) -> None:
    """'staging' served (it points to version 2): what a shadow or a rollout needs."""
    ok(world.people["root"].patch(f"/api/v1/models/{MODEL}/aliases/staging", {"served": True}), 200)


def _shadowed_staging(world: World) -> None:
    _serve_staging(world)
    ok(world.people["mia"].put(f"/api/v1/models/{MODEL}/aliases/staging/shadow", {"version": 1}), 201)


def _rolling_staging(paused: bool = False) -> Callable[[World], None]:
    def prepare(world: World) -> None:
        _serve_staging(world)
        ok(world.people["mia"].put(f"/api/v1/models/{MODEL}/aliases/staging/rollout", {"version": 1}), 201)
        if paused:
            ok(world.people["mia"].post(f"/api/v1/models/{MODEL}/aliases/staging/rollout/pause", {}), 200)

    return prepare


def _shadow_started(world: World, body: Body | None, answer: Any) -> None:
    shadow = world.read(f"/api/v1/models/{MODEL}/aliases/staging/shadow")
    assert (shadow["version"], shadow["serving"], shadow["sample"], shadow["running"]) == (1, 2, 0.1, True)
    assert answer["id"] == shadow["id"]


def _shadow_stopped(world: World, body: Body | None, answer: Any) -> None:
    shadow = world.read(f"/api/v1/models/{MODEL}/aliases/staging/shadow")
    assert (shadow["running"], shadow["ended_by"], shadow["end_reason"]) == (False, "mia", "stopped")


def _policy_written(world: World, body: Body | None, answer: Any) -> None:
    policy = world.read(f"/api/v1/models/{MODEL}/aliases/staging/policy")
    assert (policy["number"], policy["builtin"], policy["rules"], policy["reason"]) == (1, False, [], "")
    assert answer == policy


def _policy_evaluated(world: World, body: Body | None, answer: Any) -> None:
    # The built-in policy: version 1 has version 2's signature, so its one rule passes.
    assert answer["policy"] == 0 and answer["builtin"] is True and answer["passed"] is True
    assert [r["name"] for r in answer["rules"]] == ["compatible-signature"]


def _rollout_is(state: str, reason: str = "") -> Check:
    def check(world: World, body: Body | None, answer: Any) -> None:
        rollout = world.read(f"/api/v1/models/{MODEL}/aliases/staging/rollout")
        assert (rollout["version"], rollout["base_version"], rollout["state"]) == (1, 2, state)
        # Only the version sent: the defaults.
        assert (rollout["steps"], rollout["step_seconds"], rollout["min_requests"]) == ([5, 25, 50, 100], 300, 200)
        assert (rollout["max_error_rate"], rollout["max_p99_ratio"]) == (0.005, 1.2)
        assert rollout["end_reason"] == reason
        assert answer["id"] == rollout["id"]

    return check


_ONE_BY_ONE = {"keep_last": 1, "keep_days": 1}


def _retention_set(world: World, body: Body | None, answer: Any) -> None:
    # Only the numbers sent: the rule archives (its default).
    assert answer == world.read(f"/api/v1/models/{MODEL}/retention")
    assert answer == {"model": MODEL, "rule": {**_ONE_BY_ONE, "then": "archive"}}


def _retention_rule(world: World) -> None:
    ok(world.people["mia"].put(f"/api/v1/models/{MODEL}/retention", _ONE_BY_ONE), 200)


def _retention_removed(world: World, body: Body | None, answer: Any) -> None:
    assert answer == world.read(f"/api/v1/models/{MODEL}/retention") == {"model": MODEL, "rule": None}


def _retention_previewed(world: World, body: Body | None, answer: Any) -> None:
    # The world's two versions are the newest and were made just now: nothing to do, nothing spared.
    assert (answer["rule"], answer["actions"], answer["kept"]) == ({**_ONE_BY_ONE, "then": "archive"}, [], [])
    assert world.read(f"/api/v1/models/{MODEL}/retention")["rule"] is None  # a preview saves nothing


def _third_version(world: World) -> None:
    """A version nothing uses (the world's two are aliased or named by its promotion request)."""
    person = world.people["mia"]
    with TestCase.captureOnCommitCallbacks(execute=True):
        number = ok(person.upload(MODEL, [("model.onnx", add_model_bytes(bias=3.0))]), 201)["version"]
    assert number == 3


def _archived_third(world: World) -> None:
    _third_version(world)
    ok(world.people["mia"].post(f"/api/v1/models/{MODEL}/versions/3/archive", {}), 200)


def _held_third(world: World) -> None:
    _third_version(world)
    ok(world.people["root"].post(f"/api/v1/models/{MODEL}/versions/3/hold", {"reason": "case"}), 200)


def _lifecycle_is(state: str, *, held: bool = False, reason: str = "") -> Check:
    def check(world: World, body: Body | None, answer: Any) -> None:
        version = world.read(f"/api/v1/models/{MODEL}/versions/3")
        assert version["lifecycle"]["state"] == state
        assert (version["lifecycle"]["hold"] is not None) == held
        if state == "deleted":
            assert version["lifecycle"]["deleted"]["reason"] == reason
            assert version["lifecycle"]["deleted"]["files_removed"] is True
        assert answer["version"] == 3

    return check


def _empty_model(world: World) -> None:
    ok(world.people["mia"].post("/api/v1/models", {"name": "empty"}), 201)


def _model_gone(world: World, body: Body | None, answer: Any) -> None:
    assert world.status_of("/api/v1/models/empty") == 404


def _staging_cleared(world: World, body: Body | None, answer: Any) -> None:
    assert world.read(f"/api/v1/models/{MODEL}/aliases/staging")["version"] is None
    assert answer["version"] is None


def _version_3(world: World) -> dict[str, Any]:
    return {"name": MODEL, "version": 3}


def _version_1(world: World) -> dict[str, Any]:
    return {"name": MODEL, "version": 1}


def _staging(world: World) -> dict[str, Any]:
    return {"name": MODEL, "alias": "staging"}


def _promotion(world: World) -> dict[str, Any]:
    return {"id": world.promotion}


def _webhook(world: World) -> dict[str, Any]:
    return {"id": world.webhook}


def _model(world: World) -> dict[str, Any]:
    return {"name": MODEL}


# Inference jobs: root (an admin holds the inference role) runs them on production, once ada approved it.
_MADE: dict[str, str] = {}  # what a prepare made for the test's path: a job's id, a request's id
_ROWS = np.arange(8, dtype=np.float32).reshape(2, 4)


def _rows_npz() -> bytes:
    out = io.BytesIO()
    np.savez(out, x=_ROWS)
    return out.getvalue()


def _production(world: World) -> None:
    ok(world.people["ada"].post(f"/api/v1/promotions/{world.promotion}/approve", {}), 200)
    storage = get_storage()
    if not storage.exists("inputs/rows.npz"):
        storage.write("inputs/rows.npz", io.BytesIO(_rows_npz()))


def _queued_job(world: World) -> None:
    _production(world)
    named = {"model": MODEL, "input_url": "inputs/rows.npz"}
    _MADE["job"] = ok(world.people["root"].post("/api/v1/inference-jobs", named), 202)["id"]


def _finished_job(world: World) -> None:
    _queued_job(world)
    run_job(_MADE["job"])


def _async_request(world: World) -> None:
    _production(world)
    path = f"/api/v1/models/{MODEL}/infer-async"
    _MADE["request"] = ok(world.people["root"].post(path, _v2_body(world)), 202)["id"]


def _job_input(world: World) -> dict[str, Any]:
    return {
        "model": MODEL,
        "input": SimpleUploadedFile("rows.npz", _rows_npz()),
        "input_url": "inputs/rows.npz",
    }


def _v2_body(world: World) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def _job(world: World) -> dict[str, Any]:
    return {"job_id": _MADE["job"]}


def _job_queued_on_production(world: World, body: Body | None, answer: Any) -> None:
    job = world.read(f"/api/v1/inference-jobs/{answer['id']}")
    # Nothing but the model and the input: production's version, the format from the suffix, every output.
    assert (job["ref"], job["version"], job["format"], job["rows"], job["state"]) == (
        "production",
        1,
        "npz",
        2,
        "queued",
    )
    assert job == answer


def _job_cancelled(world: World, body: Body | None, answer: Any) -> None:
    assert world.read(f"/api/v1/inference-jobs/{_MADE['job']}")["state"] == "cancelled" == answer["state"]


def _result_downloaded(world: World, body: Body | None, answer: Any) -> None:
    with np.load(io.BytesIO(b"".join(answer.streaming_content)), allow_pickle=False) as result:
        np.testing.assert_array_equal(result["y"], _ROWS + 1)


def _request_queued(world: World, body: Body | None, answer: Any) -> None:
    assert answer["state"] == "queued"
    assert world.read(f"/api/v1/inference-jobs/{answer['id']}")["ref"] == "production"


def _read(who: str = "mia", params: Callable[[World], dict[str, Any]] = lambda world: {}) -> Call:
    """A read: only its path, answered 200."""
    return Call(who, 200, params=params)


CALLS: dict[str, Call] = {
    # Writes, each with its body's required fields only.
    "v1_models_create": Call("mia", 201, values=lambda w: {"name": "fresh"}, check=_model_created),
    "v1_models_partial_update": Call("mia", 200, params=_model, check=_model_after),
    "v1_models_retention_update": Call("mia", 200, params=_model, values=lambda w: _ONE_BY_ONE, check=_retention_set),
    "v1_models_retention_destroy": Call("mia", 200, params=_model, check=_retention_removed, prepare=_retention_rule),
    "v1_models_retention_preview_create": Call(
        "mia", 200, params=_model, values=lambda w: _ONE_BY_ONE, check=_retention_previewed
    ),
    "v1_models_aliases_update": Call(
        "mia", 200, params=_staging, values=lambda w: {"version": 1}, check=_staging_on(1, "set")
    ),
    "v1_models_aliases_partial_update": Call("root", 200, params=_staging, check=_staging_flags_kept),
    "v1_models_aliases_rollback_create": Call("mia", 200, params=_staging, check=_staging_on(1, "rollback")),
    "v1_models_versions_create": Call(
        "mia",
        201,
        params=_model,
        values=lambda w: {"file": [SimpleUploadedFile("model.onnx", add_model_bytes(bias=3.0))]},
        check=_version_uploaded,
        runs_tasks=True,
    ),
    "v1_models_versions_partial_update": Call("mia", 200, params=_version_1, check=_version_after),
    "v1_models_versions_benchmarks_create": Call("mia", 202, params=_version_1, check=_benchmarks_queued),
    "v1_models_versions_derive_create": Call(
        "mia", 202, params=_version_1, values=lambda w: {"recipe": "ort-optimized"}, check=_derive_queued
    ),
    "v1_models_versions_archive_create": Call(
        "mia", 200, params=_version_3, check=_lifecycle_is("archived"), prepare=_third_version
    ),
    "v1_models_versions_unarchive_create": Call(
        "mia", 200, params=_version_3, check=_lifecycle_is("active"), prepare=_archived_third
    ),
    "v1_models_versions_hold_create": Call(
        "root",
        200,
        params=_version_3,
        values=lambda w: {"reason": "case"},
        check=_lifecycle_is("active", held=True),
        prepare=_third_version,
    ),
    "v1_models_versions_release_create": Call(
        "root",
        200,
        params=_version_3,
        values=lambda w: {"reason": "closed"},
        check=_lifecycle_is("active"),
        prepare=_held_third,
    ),
    "v1_models_versions_destroy": Call(
        "root",
        200,
        params=_version_3,
        values=lambda w: {"reason": "cleanup"},
        check=_lifecycle_is("deleted", reason="cleanup"),
        prepare=_third_version,
        runs_tasks=True,
    ),
    "v1_models_destroy": Call(
        "root",
        204,
        params=lambda w: {"name": "empty"},
        values=lambda w: {"reason": "typo"},
        check=_model_gone,
        prepare=_empty_model,
    ),
    "v1_models_aliases_destroy": Call("mia", 200, params=_staging, check=_staging_cleared),
    "v1_promotions_approve_create": Call("ada", 200, params=_promotion, check=_decided("approved", 1, "ada")),
    "v1_promotions_reject_create": Call("ada", 200, params=_promotion, check=_decided("rejected", None, "ada")),
    "v1_promotions_cancel_create": Call("mia", 200, params=_promotion, check=_decided("cancelled", None, "mia")),
    "v1_models_aliases_shadow_update": Call(
        "mia", 201, params=_staging, values=lambda w: {"version": 1}, check=_shadow_started, prepare=_serve_staging
    ),
    "v1_models_aliases_shadow_destroy": Call(
        "mia", 200, params=_staging, check=_shadow_stopped, prepare=_shadowed_staging
    ),
    "v1_models_aliases_policy_update": Call(
        "mia", 201, params=_staging, values=lambda w: {"rules": []}, check=_policy_written
    ),
    "v1_models_aliases_policy_evaluate_create": Call(
        "mia", 200, params=_staging, values=lambda w: {"version": 1}, check=_policy_evaluated
    ),
    "v1_models_aliases_rollout_update": Call(
        "mia",
        201,
        params=_staging,
        values=lambda w: {"version": 1},
        check=_rollout_is("running"),
        prepare=_serve_staging,
    ),
    "v1_models_aliases_rollout_pause_create": Call(
        "mia", 200, params=_staging, check=_rollout_is("paused"), prepare=_rolling_staging()
    ),
    "v1_models_aliases_rollout_resume_create": Call(
        "mia", 200, params=_staging, check=_rollout_is("running"), prepare=_rolling_staging(paused=True)
    ),
    "v1_models_aliases_rollout_abort_create": Call(
        "mia", 200, params=_staging, check=_rollout_is("aborted", "aborted"), prepare=_rolling_staging()
    ),
    "v1_tokens_create": Call("mia", 201, session=True, check=_token_created),
    "v1_tokens_destroy": Call("mia", 204, params=lambda w: {"prefix": w.spare_token}, check=_token_revoked),
    "v1_tokens_rotate_create": Call(
        "mia", 201, session=True, params=lambda w: {"prefix": w.spare_token}, check=_token_rotated
    ),
    "v1_tokens_partial_update": Call(
        "root",
        200,
        params=lambda w: {"prefix": w.spare_token},
        values=lambda w: {"priority": "high"},
        check=_priority_set,
    ),
    "v1_service_accounts_create": Call(
        "root", 201, values=lambda w: {"username": "pipeline"}, check=_service_account_created
    ),
    "v1_service_accounts_destroy": Call(
        "root", 204, params=lambda w: {"username": "pipeline"}, check=_service_account_gone, prepare=_service_account
    ),
    "v1_webhooks_create": Call(
        "root", 201, values=lambda w: {"url": HOOK_URL, "events": ["promotion.rejected"]}, check=_webhook_created
    ),
    "v1_webhooks_partial_update": Call("root", 200, params=_webhook, check=_webhook_after),
    "v1_webhooks_destroy": Call("root", 204, params=_webhook, check=_webhook_gone),
    "v1_inference_jobs_create": Call(
        "root", 202, values=_job_input, check=_job_queued_on_production, prepare=_production
    ),
    "v1_inference_jobs_cancel_create": Call("root", 200, params=_job, check=_job_cancelled, prepare=_queued_job),
    "v1_models_infer_async_create": Call(
        "root", 202, params=_model, values=_v2_body, check=_request_queued, prepare=_production
    ),
    # Reads: their path parameters and required query only; the answer's status is what they are checked for.
    "v1_audit_list": _read("root"),
    "v1_audit_export_retrieve": Call("root", 200, values=lambda w: {"format": "jsonl"}),
    "v1_audit_verify_retrieve": _read("root"),
    "v1_derive_jobs_retrieve": _read(params=lambda w: {"id": w.derive_job}),
    "v1_fleet_list": _read(),
    "v1_inference_jobs_list": _read("root"),
    "v1_inference_jobs_retrieve": Call("root", 200, params=_job, prepare=_queued_job),
    "v1_inference_jobs_result_retrieve": Call(
        "root", 200, params=_job, check=_result_downloaded, prepare=_finished_job
    ),
    "v1_models_infer_async_retrieve": Call(
        "root", 202, params=lambda w: {"name": MODEL, "job_id": _MADE["request"]}, prepare=_async_request
    ),
    "v1_me_retrieve": _read(),
    "v1_models_list": _read(),
    "v1_models_retrieve": _read(params=_model),
    "v1_models_retention_retrieve": _read(params=_model),
    "v1_models_aliases_list": _read(params=_model),
    "v1_models_aliases_retrieve": _read(params=_staging),
    "v1_models_aliases_history_list": _read(params=_staging),
    "v1_models_aliases_policy_retrieve": _read(params=_staging),
    "v1_models_aliases_shadow_retrieve": Call("mia", 200, params=_staging, prepare=_shadowed_staging),
    "v1_models_aliases_rollout_retrieve": Call("mia", 200, params=_staging, prepare=_rolling_staging()),
    "v1_models_versions_list": _read(params=_model),
    "v1_models_versions_retrieve": _read(params=_version_1),
    "v1_models_versions_benchmarks_list": _read(params=_version_1),
    "v1_models_versions_derive_list": _read(params=_version_1),
    "v1_models_versions_download_retrieve": Call("mia", 200, params=_version_1, check=_model_downloaded),
    "v1_models_versions_card_retrieve": Call("mia", 200, params=_version_1, check=_card_downloaded),
    "v1_models_versions_provenance_retrieve": Call("mia", 200, params=_version_1, check=_signed),
    "v1_signing_keys_retrieve": _read(),
    "v1_promotions_list": _read(),
    "v1_promotions_retrieve": _read(params=_promotion),
    "v1_tokens_list": _read(),
    "v1_service_accounts_list": _read("root"),
    "v1_service_accounts_retrieve": Call(
        "root", 200, params=lambda w: {"username": "pipeline"}, prepare=_service_account
    ),
    "v1_webhooks_list": _read("root"),
    "v1_webhooks_retrieve": _read("root", params=_webhook),
    "v1_webhooks_deliveries_list": _read("root", params=_webhook),
}


EMPTY_QUERY = "optional query empty"


def _cases() -> Iterator[Any]:
    """One test per body a client may send (or none), with the required query only; then one more with every
    optional query parameter present and empty, for the operations that have any."""
    schema = api_schema()
    for operation in operations(schema):
        if operation.operation_id not in CALLS:
            continue  # test_every_documented_operation_is_in_the_table names it
        kinds = body_kinds(schema, operation) or [("no body", "")]
        for variant, content_type in kinds:
            label = f"{content_type}, {variant}" if content_type else variant
            yield pytest.param(operation, variant, content_type, False, id=f"{operation.operation_id}-{label}")
        if query_parameters(operation)[1]:
            variant, content_type = kinds[0]
            yield pytest.param(operation, variant, content_type, True, id=f"{operation.operation_id}-{EMPTY_QUERY}")


def test_every_documented_operation_is_in_the_table():
    """A new endpoint gets a row in CALLS, and with it a test that sends only its required fields."""
    documented = {operation.operation_id: operation for operation in operations(api_schema())}
    missing = sorted(set(documented) - set(CALLS))
    assert not missing, f"add to CALLS how to send {missing} with only the required fields, and what it does"
    gone = sorted(set(CALLS) - set(documented))
    assert not gone, f"CALLS names operations the schema no longer has: {gone}"
    for operation_id, call in CALLS.items():
        assert call.status in documented[operation_id].statuses, (operation_id, call.status)


def test_the_schema_a_client_reads_is_the_one_the_tests_walk(world):
    response = world.people["mia"].get("/api/schema/?format=json")
    assert response.status_code == 200
    assert response.json() == api_schema()


@pytest.mark.parametrize(("operation", "variant", "content_type", "empty_query"), list(_cases()))
def test_operation_succeeds_with_only_its_required_fields(
    world, operation: Operation, variant: str, content_type: str, empty_query: bool
):
    call = CALLS[operation.operation_id]
    if call.prepare is not None:
        call.prepare(world)
    values = call.values(world)
    path = operation.path.format(**call.params(world)) + query_string(operation, values, optional_empty=empty_query)
    body = None
    if content_type:
        bodies = request_bodies(api_schema(), operation, values)
        body = next(b for b in bodies if (b.variant, b.content_type) == (variant, content_type))
    response = send(world, call, operation.method, path, body)
    assert response.status_code == call.status, (
        f"{operation.method.upper()} {path} with {body.fields if body else 'no body'}"
        f"{' as ' + body.label if body else ''}: {response.status_code} {response.content[:800]!r}"
    )
    # The answer is what the schema says it is, field by field: a client generated from it can read it.
    assert response_problems(api_schema(), operation, response) == [], f"{operation.method.upper()} {path}"
    if call.check is not None:
        answer = response.json() if response.get("Content-Type") == "application/json" else response
        call.check(world, body, answer)


def send(world: World, call: Call, method: str, path: str, body: Body | None) -> Any:
    person = world.people[call.who]
    client = session(person.username) if call.session else person.client
    headers = {} if call.session else {"Authorization": f"Bearer {person.token}"}
    data, content_type = body.encode() if body is not None else (b"", "application/octet-stream")
    if method == "get":
        return client.get(path, headers=headers)
    with TestCase.captureOnCommitCallbacks(execute=call.runs_tasks):
        return client.generic(method.upper(), path, data, content_type=content_type, headers=headers)


def test_the_variants_cover_each_kind_of_body():
    """The walk sends JSON with only what is required, JSON with empty strings, and forms with empty fields."""
    variants = {case.values[1] for case in _cases()}
    assert variants == {REQUIRED_ONLY, EMPTY_STRINGS, EMPTY_FIELDS, "no body"}
    assert any(case.values[3] for case in _cases())
