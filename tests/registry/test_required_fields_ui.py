"""Every POST form of the web UI works when submitted with only what it requires, the rest left as a browser sends it.

The forms are found the way a user finds them: each page of the URL conf is rendered for the people
who see its forms (``PAGES``), and every ``<form method="post">`` in it is read with its controls
(``tests/support/html_forms.py``). Each form is then submitted, with its CSRF token as a browser
sends it, filling only the controls it marks ``required`` or that the view needs (``FORMS``), every
other text box present and empty and no box ticked. It must succeed (a redirect, or the page or
answer it promises, never a "Refused" page or an error) and do what an empty field stands for:
nothing, or no change. An empty optional ``metadata`` field once made every upload from this UI
fail while 1,138 tests passed, because each test filled it.

A page the URL conf gains without a row in ``PAGES``, or a form without a row in ``FORMS``, fails
``test_every_page_is_in_the_table`` or ``test_every_post_form_of_every_page_is_in_the_table``.

The upload form is posted by the page's script (XMLHttpRequest, for its progress bar): it sends the
files, Description and Metadata as they are, with the CSRF token in a header. That is sent here as
the script sends it; ``tests/e2e/test_ui_journeys.py::test_1_an_upload_with_every_optional_field_left_empty_is_stored``
does the same in Chromium.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import numpy as np
import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client, TestCase
from django.urls import URLPattern, URLResolver, get_resolver, resolve

from tests.support.html_forms import Control, Form, browser_fields, post_forms
from tests.support.onnx_models import add_model_bytes
from tests.support.people import PASSWORD
from tests.support.required_world import MODEL, NEWCOMER, World, ok, put, session, use_world, world_for_module

pytestmark = pytest.mark.django_db

NEW_PASSWORD = "a brand new passphrase 42"
# Route parameters that name the object a form acts on; any other (approve, reject, cancel) names the action,
# and forms that differ in it are different forms.
OBJECT_PARAMETERS = {"name", "number", "alias", "promotion_id", "prefix", "username", "uidb64", "token", "job_id"}
# Not the web UI's pages: the REST API (tests/registry/test_required_fields_api.py) and Django's own admin.
OTHER_PREFIXES = ("api/", "admin/")


@pytest.fixture(scope="module")
def world(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with world_for_module(django_db_blocker, tmp_path_factory.mktemp("required-fields-ui")) as made:
        with django_db_blocker.unblock():
            _shadow_staging(made)
            _rollouts(made)
            _lifecycle(made)
            _queued_job(made)
        yield made


JOB: dict[str, str] = {}  # the id of root's queued inference job, whose page shows Cancel


def _rows_npz() -> bytes:
    out = io.BytesIO()
    np.savez(out, x=np.arange(8, dtype=np.float32).reshape(2, 4))
    return out.getvalue()


def _queued_job(world: World) -> None:
    root = world.people["root"]
    sent = {"model": MODEL, "version": "1", "input": SimpleUploadedFile("rows.npz", _rows_npz())}
    JOB["queued"] = ok(
        root.client.post("/api/v1/inference-jobs", sent, HTTP_AUTHORIZATION=f"Bearer {root.token}"), 202
    )["id"]


def _shadow_staging(world: World) -> None:
    """The model page's shadow forms need a served alias: 'staging' (v2) is served, and v1 shadows it."""
    people = world.people
    ok(people["root"].patch(f"/api/v1/models/{MODEL}/aliases/staging", {"served": True}), 200)
    ok(put(people["mia"], f"/api/v1/models/{MODEL}/aliases/staging/shadow", {"version": 1}), 201)


def _rollouts(world: World) -> None:
    """The model page's rollout forms: 'canary' and 'held' (served, on v1) roll v2 out, running on canary (pause,
    abort) and paused on held (resume); staging (served, on v2) has none, so it offers the start form."""
    people = world.people
    for alias in ("canary", "held"):
        ok(put(people["mia"], f"/api/v1/models/{MODEL}/aliases/{alias}", {"version": 1}), 200)
        ok(people["root"].patch(f"/api/v1/models/{MODEL}/aliases/{alias}", {"served": True}), 200)
        ok(put(people["mia"], f"/api/v1/models/{MODEL}/aliases/{alias}/rollout", {"version": 2}), 201)
    ok(people["mia"].post(f"/api/v1/models/{MODEL}/aliases/held/rollout/pause", {}), 200)


RETIRED = "retired"  # a model whose versions nothing uses, for the lifecycle forms
GONE = "gone"  # a model with no versions, which an admin may delete


def _lifecycle(world: World) -> None:
    """The version page's lifecycle forms: 'retired' v1 is active and unused (archive, hold, delete); v2 is archived
    and under legal hold (unarchive, release). 'gone' has no versions, so it may be deleted."""
    people = world.people
    ok(people["mia"].post("/api/v1/models", {"name": RETIRED}), 201)
    for bias in (5.0, 6.0):
        ok(people["mia"].upload(RETIRED, [("model.onnx", add_model_bytes(bias=bias))]), 201)
    ok(people["mia"].post(f"/api/v1/models/{RETIRED}/versions/2/archive", {}), 200)
    ok(people["root"].post(f"/api/v1/models/{RETIRED}/versions/2/hold", {"reason": "case 1"}), 200)
    ok(people["mia"].post("/api/v1/models", {"name": GONE}), 201)


@pytest.fixture(autouse=True)
def _world(world: World, settings: Any, tmp_path: Path) -> None:
    use_world(world, settings, tmp_path)


# --- Pages, and who sees which forms on them ----------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """Where a page is (from the world) and who renders it: each sees the forms their roles and part give them."""

    path: Callable[[World], str]
    viewers: tuple[str | None, ...] = ("mia",)  # None: nobody signed in
    # The same page of other objects, in states that show other forms (each rendered for the same viewers).
    more: tuple[Callable[[World], str], ...] = ()

    def paths(self, world: World) -> list[str]:
        return [self.path(world), *(path(world) for path in self.more)]


def _retired(number: int, then: str = "") -> Callable[[World], str]:
    return lambda world: f"/ui/models/{RETIRED}/versions/{number}{then}"


def _promotion_page(world: World) -> str:
    return f"/ui/promotions/{world.promotion}"


PAGES: dict[str, Page] = {
    "home": Page(lambda w: "/", ("mia", None)),
    "ui:models": Page(lambda w: "/ui/"),
    "ui:model": Page(lambda w: f"/ui/models/{MODEL}", ("mia", "ada", "root")),  # root sets signature requirements
    "ui:upload": Page(lambda w: f"/ui/models/{MODEL}/upload"),
    # mia archives and unarchives; root, an admin, also holds, releases and deletes.
    "ui:version": Page(lambda w: f"/ui/models/{MODEL}/versions/1", ("mia", "root"), (_retired(1), _retired(2))),
    "ui:version-delete": Page(_retired(1, "/delete"), ("root",)),
    "ui:version-card": Page(lambda w: f"/ui/models/{MODEL}/versions/1/card"),
    "ui:model-delete": Page(lambda w: f"/ui/models/{GONE}/delete", ("root",)),
    "ui:model-retention": Page(lambda w: f"/ui/models/{MODEL}/retention", ("mia", "root")),  # root may pick delete
    "ui:compare": Page(lambda w: f"/ui/models/{MODEL}/compare?a=1&b=2"),
    "ui:promote": Page(lambda w: f"/ui/models/{MODEL}/promote?alias=staging&version=1"),
    "ui:promotions": Page(lambda w: "/ui/promotions"),
    "ui:promotion": Page(_promotion_page, ("mia", "ada")),  # mia asked: she may cancel; ada decides
    "ui:audit": Page(lambda w: "/ui/audit", ("root",)),
    "ui:fleet": Page(lambda w: "/ui/fleet"),
    # Only root (an admin holds the inference role) submits and cancels; mia sees the pages, not the forms.
    "ui:jobs": Page(lambda w: "/ui/jobs", ("mia", "root")),
    "ui:job-new": Page(lambda w: "/ui/jobs/new", ("mia", "root")),
    "ui:job": Page(lambda w: f"/ui/jobs/{JOB['queued']}", ("root",)),
    "ui:tokens": Page(lambda w: "/ui/tokens"),
    "ui:users": Page(lambda w: "/ui/users", ("root",)),
    "login": Page(lambda w: "/accounts/login/", (None,)),
    "password_change": Page(lambda w: "/accounts/password_change/"),
    "password_reset_confirm": Page(lambda w: w.password_link, (None,)),
}
# Routes that only take the POST of a form on some page above.
POST_ONLY = {
    "logout",
    "ui:model-batching",
    "ui:alias-rollback",
    "ui:alias-signature",
    "ui:alias-cache",
    "ui:alias-shadow",
    "ui:alias-shadow-stop",
    "ui:alias-rollout",
    "ui:alias-rollout-pause",
    "ui:alias-rollout-resume",
    "ui:alias-rollout-abort",
    "ui:promotion-decide",
    "ui:version-archive",
    "ui:version-unarchive",
    "ui:version-hold",
    "ui:version-release",
    "ui:model-retention-preview",
    "ui:token-revoke",
    "ui:token-rotate",
    "ui:user",
    "ui:user-password-link",
    "ui:job-cancel",
}
# Routes that are neither a page nor a form's target: the GET redirects of the sign-in with an OpenID provider
# (a link on the login page; tests/e2e/test_oidc_browser.py follows them in Chromium).
REDIRECT_ONLY = {"oidc_login", "oidc_callback"}


# --- Forms: what each needs, and what success is --------------------------------------------------------

Check = Callable[[World, Any], None]


@dataclass(frozen=True)
class Submit:
    """How to submit one form: on which page, as whom, which of its several copies, filled with what."""

    page: str
    who: str | None
    status: int
    check: Check
    to: str = ""  # where a redirect (302) goes; a last "*" stands for the id the submission made
    fill: Callable[[World], dict[str, Any]] = lambda world: {}
    # Of a form shown once per alias, token or user: the copy whose address holds this.
    copy: Callable[[World], str] = lambda world: ""
    scripted: bool = False  # posted by the page's script with the CSRF token in a header, as the upload is
    runs_tasks: bool = False  # run what the request queues after commit (the upload's validation), as a server does
    at: Callable[[World], str] | None = None  # which of the page's addresses (``Page.more``); None: its first


def _model_created(world: World, response: Any) -> None:
    created = world.read("/api/v1/models/fresh")
    assert (created["description"], created["tags"], created["created_by"]) == ("", [], "mia")


def _model_cleared(world: World, response: Any) -> None:
    model = world.read(f"/api/v1/models/{MODEL}")
    assert (model["description"], model["tags"]) == ("", [])


def _batching_kept(world: World, response: Any) -> None:
    """The select sends the setting shown (off); an empty max batch size keeps the one set (8)."""
    model = world.read(f"/api/v1/models/{MODEL}")
    assert (model["batching"], model["max_batch_size"]) == ("off", 8)


def _staging_on(number: int, kind: str) -> Check:
    def check(world: World, response: Any) -> None:
        assert world.read(f"/api/v1/models/{MODEL}/aliases/staging")["version"] == number
        last = world.read(f"/api/v1/models/{MODEL}/aliases/staging/history")[-1]
        assert (last["to_version"], last["kind"], last["reason"]) == (number, kind, "")

    return check


def _signature_not_required(world: World, response: Any) -> None:
    """The box unticked and no signer named: no signature required, by nobody in particular; audited."""
    staging = world.read(f"/api/v1/models/{MODEL}/aliases/staging")
    assert (staging["require_signature"], staging["trusted_signers"]) == (False, [])
    (event,) = world.read("/api/v1/audit?action=alias.provenance")["results"]
    assert (event["actor"], event["target"]) == ("root", f"{MODEL}@staging")


def _cache_off(world: World, response: Any) -> None:
    """Both boxes empty: the alias caches nothing; audited all the same."""
    assert world.read(f"/api/v1/models/{MODEL}/aliases/staging")["cache"] is None
    (event,) = world.read("/api/v1/audit?action=alias.cache")["results"]
    assert (event["actor"], event["target"]) == ("root", f"{MODEL}@staging")


def _shadow_replaced(world: World, response: Any) -> None:
    """An empty Sample box: the default share, a tenth; the running shadow is replaced by the new one."""
    shadow = world.read(f"/api/v1/models/{MODEL}/aliases/staging/shadow")
    assert (shadow["version"], shadow["sample"], shadow["running"], shadow["started_by"]) == (1, 0.1, True, "mia")
    newest, started_with_the_world = world.read("/api/v1/audit?action=alias.shadow_start")["results"]
    assert (newest["actor"], newest["target"], newest["after"]["sample"]) == ("mia", f"{MODEL}@staging", 0.1)
    assert newest["before"]["shadow"] == started_with_the_world["after"]["shadow"]


def _shadow_stopped(world: World, response: Any) -> None:
    """No reason given: stopped, for no reason but that."""
    shadow = world.read(f"/api/v1/models/{MODEL}/aliases/staging/shadow")
    assert (shadow["running"], shadow["ended_by"], shadow["end_reason"]) == (False, "mia", "stopped")


def _rollout_started(world: World, response: Any) -> None:
    """Only the version chosen (the select's first, v1), every other box empty: the defaults; audited."""
    rollout = world.read(f"/api/v1/models/{MODEL}/aliases/staging/rollout")
    assert (rollout["version"], rollout["base_version"], rollout["state"], rollout["started_by"]) == (
        1,
        2,
        "running",
        "mia",
    )
    settings = {
        key: rollout[key] for key in ("steps", "step_seconds", "max_error_rate", "max_p99_ratio", "min_requests")
    }
    assert settings == {
        "steps": [5, 25, 50, 100],
        "step_seconds": 300,
        "max_error_rate": 0.005,
        "max_p99_ratio": 1.2,
        "min_requests": 200,
    }
    events = world.read("/api/v1/audit?action=rollout.start")["results"]
    assert (events[0]["actor"], events[0]["target"]) == ("mia", f"{MODEL}@staging")


def _rollout_now(alias: str, state: str, action: str, reason: str) -> Check:
    """The alias's rollout is in ``state``, and the change is audited as mia's with no reason given."""

    def check(world: World, response: Any) -> None:
        rollout = world.read(f"/api/v1/models/{MODEL}/aliases/{alias}/rollout")
        assert (rollout["state"], rollout["end_reason"]) == (state, reason)
        event = world.read(f"/api/v1/audit?action={action}")["results"][0]
        assert (event["actor"], event["target"], event["after"]["reason"]) == ("mia", f"{MODEL}@{alias}", reason)

    return check


def _version_cleared(world: World, response: Any) -> None:
    version = world.read(f"/api/v1/models/{MODEL}/versions/1")
    assert (version["description"], version["tags"]) == ("", [])


def _retired_state(number: int, state: str, hold: str | None, action: str, reason: str) -> Check:
    """The version's lifecycle and hold after the form, and the audit event it wrote (by whom, with what reason)."""

    def check(world: World, response: Any) -> None:
        lifecycle = world.read(f"/api/v1/models/{RETIRED}/versions/{number}")["lifecycle"]
        assert (lifecycle["state"], (lifecycle["hold"] or {}).get("reason")) == (state, hold)
        (event,) = world.read(f"/api/v1/audit?action={action}&model={RETIRED}")["results"][:1]
        assert (event["target"], event["after"]["reason"]) == (f"{RETIRED}/{number}", reason)

    return check


def _retired_deleted(world: World, response: Any) -> None:
    deleted = world.read(f"/api/v1/models/{RETIRED}/versions/1")["lifecycle"]["deleted"]
    assert (deleted["by"], deleted["reason"]) == ("root", "obsolete")


def _model_gone(world: World, response: Any) -> None:
    assert world.status_of(f"/api/v1/models/{GONE}") == 404
    (event,) = world.read(f"/api/v1/audit?action=model.delete&model={GONE}")["results"]
    assert (event["actor"], event["after"]) == ("root", {"reason": "unused"})


def _no_retention_rule(world: World, response: Any) -> None:
    """Both numbers empty: no rule, which demo already had, so nothing changed and nothing was audited."""
    assert world.read(f"/api/v1/models/{MODEL}/retention")["rule"] is None
    assert world.read("/api/v1/audit?action=model.retention")["results"] == []


def _previewed_no_rule(world: World, response: Any) -> None:
    assert "With no rule, nothing is archived or deleted automatically." in response.content.decode()
    assert world.read(f"/api/v1/models/{MODEL}/retention")["rule"] is None


def _uploaded(world: World, response: Any) -> None:
    assert response.json()["url"] == f"/ui/models/{MODEL}/versions/3"
    version = world.read(f"/api/v1/models/{MODEL}/versions/3")
    assert (version["status"], version["description"], version["metadata"], version["tags"]) == ("ready", "", {}, [])


def _job_submitted(world: World, response: Any) -> None:
    job_id = response["Location"].rsplit("/", 1)[-1]
    job = world.read(f"/api/v1/inference-jobs/{job_id}")
    # Empty alias, format, outputs and result format: the version named, the format from the suffix, all outputs.
    assert (job["version"], job["ref"], job["format"], job["rows"], job["created_by"]) == (1, "1", "npz", 2, "root")


def _job_cancelled(world: World, response: Any) -> None:
    assert response["Location"] == f"/ui/jobs/{JOB['queued']}"
    assert world.read(f"/api/v1/inference-jobs/{JOB['queued']}")["state"] == "cancelled"


def _decided(state: str, production: int | None, by: str) -> Check:
    def check(world: World, response: Any) -> None:
        promotion = world.read(f"/api/v1/promotions/{world.promotion}")
        assert (promotion["state"], promotion["decided_by"], promotion["decision_reason"]) == (state, by, "")
        assert world.read(f"/api/v1/models/{MODEL}/aliases/production")["version"] == production

    return check


def _token_created(world: World, response: Any) -> None:
    tokens = world.read("/api/v1/tokens?user=mia")["results"]
    newest = tokens[0]
    assert (newest["name"], newest["expires_at"], newest["revoked_at"]) == ("", None, None)
    assert f"Token {newest['prefix']} created." in response.content.decode()


def _token_rotated(world: World, response: Any) -> None:
    # An empty overlap is the default, 24 hours; the new token keeps the old one's name.
    tokens = {token["prefix"]: token for token in world.read("/api/v1/tokens?user=mia")["results"]}
    newest = max(tokens.values(), key=lambda token: token["created_at"])
    assert (newest["name"], newest["rotated_from"]) == ("spare", world.spare_token)
    assert tokens[world.spare_token]["expires_at"] is not None
    assert f"Token {newest['prefix']} created." in response.content.decode()


def _token_revoked(world: World, response: Any) -> None:
    tokens = {token["prefix"]: token for token in world.read("/api/v1/tokens?user=mia")["results"]}
    assert tokens[world.spare_token]["revoked_at"] is not None


def _invited(world: World, response: Any) -> None:
    """No password given: the user has none, and the page hands over a set-password link instead; no role ticked."""
    user = get_user_model().objects.get(username="invitee")
    assert not user.has_usable_password()
    assert "/accounts/reset/" in response.content.decode()
    assert world.read("/api/v1/audit?action=user.create")["results"][0]["after"]["roles"] == []


def _access_set(world: World, response: Any) -> None:
    """No box ticked: no roles, and no signing in."""
    assert not get_user_model().objects.get(username=NEWCOMER).is_active
    (revoked,) = world.read("/api/v1/audit?action=user.roles.revoke")["results"]
    assert (revoked["actor"], revoked["target"]) == ("root", NEWCOMER)


def _link_made(world: World, response: Any) -> None:
    assert "/accounts/reset/" in response.content.decode()
    events = world.read("/api/v1/audit?action=user.password.link")["results"]
    assert [event["target"] for event in events] == [NEWCOMER, NEWCOMER]  # the world's, and this one


def _signed_out(world: World, response: Any) -> None:
    assert response.wsgi_request.user.is_anonymous


def _signed_in(world: World, response: Any) -> None:
    assert response.wsgi_request.user.get_username() == "mia"


def _password_changed(world: World, response: Any) -> None:
    assert get_user_model().objects.get(username="mia").check_password(NEW_PASSWORD)


def _password_set(world: World, response: Any) -> None:
    assert get_user_model().objects.get(username=NEWCOMER).check_password(NEW_PASSWORD)


def _new_passwords(world: World) -> dict[str, Any]:
    return {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD}


FORMS: dict[str, Submit] = {
    "ui:models": Submit(
        "ui:models", "mia", 302, _model_created, "/ui/models/fresh/upload", lambda w: {"name": "fresh"}
    ),
    "ui:model": Submit("ui:model", "mia", 302, _model_cleared, f"/ui/models/{MODEL}"),
    "ui:model-batching": Submit("ui:model", "mia", 302, _batching_kept, f"/ui/models/{MODEL}"),
    "ui:alias-rollback": Submit(
        "ui:model", "mia", 302, _staging_on(1, "rollback"), f"/ui/models/{MODEL}", copy=lambda w: "/aliases/staging/"
    ),
    "ui:alias-signature": Submit(
        "ui:model",
        "root",
        302,
        _signature_not_required,
        f"/ui/models/{MODEL}",
        copy=lambda w: "/aliases/staging/",
    ),
    "ui:alias-cache": Submit(
        "ui:model",
        "root",
        302,
        _cache_off,
        f"/ui/models/{MODEL}",
        copy=lambda w: "/aliases/staging/",
    ),
    "ui:alias-shadow": Submit(
        "ui:model",
        "mia",
        302,
        _shadow_replaced,
        f"/ui/models/{MODEL}#shadow-staging",
        copy=lambda w: "/aliases/staging/",
    ),
    "ui:alias-shadow-stop": Submit(
        "ui:model",
        "mia",
        302,
        _shadow_stopped,
        f"/ui/models/{MODEL}#shadow-staging",
        copy=lambda w: "/aliases/staging/",
    ),
    "ui:alias-rollout": Submit(
        "ui:model",
        "mia",
        302,
        _rollout_started,
        f"/ui/models/{MODEL}#rollout-staging",
        copy=lambda w: "/aliases/staging/",
    ),
    "ui:alias-rollout-pause": Submit(
        "ui:model",
        "mia",
        302,
        _rollout_now("canary", "paused", "rollout.pause", ""),
        f"/ui/models/{MODEL}#rollout-canary",
        copy=lambda w: "/aliases/canary/",
    ),
    "ui:alias-rollout-resume": Submit(
        "ui:model",
        "mia",
        302,
        _rollout_now("held", "running", "rollout.resume", ""),
        f"/ui/models/{MODEL}#rollout-held",
        copy=lambda w: "/aliases/held/",
    ),
    "ui:alias-rollout-abort": Submit(
        "ui:model",
        "mia",
        302,
        _rollout_now("canary", "aborted", "rollout.abort", "aborted"),
        f"/ui/models/{MODEL}#rollout-canary",
        copy=lambda w: "/aliases/canary/",
    ),
    "ui:version": Submit("ui:version", "mia", 302, _version_cleared, f"/ui/models/{MODEL}/versions/1"),
    "ui:version-archive": Submit(
        "ui:version",
        "mia",
        302,
        _retired_state(1, "archived", None, "version.archive", ""),
        f"/ui/models/{RETIRED}/versions/1",
        at=_retired(1),
    ),
    "ui:version-unarchive": Submit(
        "ui:version",
        "mia",
        302,
        _retired_state(2, "active", "case 1", "version.unarchive", ""),
        f"/ui/models/{RETIRED}/versions/2",
        at=_retired(2),
    ),
    "ui:version-hold": Submit(
        "ui:version",
        "root",
        302,
        _retired_state(1, "active", "case 2", "version.hold", "case 2"),
        f"/ui/models/{RETIRED}/versions/1",
        lambda w: {"reason": "case 2"},
        at=_retired(1),
    ),
    "ui:version-release": Submit(
        "ui:version",
        "root",
        302,
        _retired_state(2, "archived", None, "version.release", "case closed"),
        f"/ui/models/{RETIRED}/versions/2",
        lambda w: {"reason": "case closed"},
        at=_retired(2),
    ),
    "ui:version-delete": Submit(
        "ui:version-delete",
        "root",
        302,
        _retired_deleted,
        f"/ui/models/{RETIRED}/versions/1",
        lambda w: {"reason": "obsolete"},
    ),
    "ui:model-delete": Submit("ui:model-delete", "root", 302, _model_gone, "/ui/", lambda w: {"reason": "unused"}),
    "ui:model-retention": Submit("ui:model-retention", "mia", 302, _no_retention_rule, f"/ui/models/{MODEL}/retention"),
    "ui:model-retention-preview": Submit("ui:model-retention", "mia", 200, _previewed_no_rule),
    "ui:upload": Submit(
        "ui:upload",
        "mia",
        201,
        _uploaded,
        fill=lambda w: {"file": [("model.onnx", add_model_bytes(bias=3.0))]},
        scripted=True,
        runs_tasks=True,
    ),
    "ui:promote": Submit("ui:promote", "mia", 302, _staging_on(1, "set"), f"/ui/models/{MODEL}"),
    # The world's production points to no version yet: the job names one (every other box left empty).
    "ui:job-new": Submit(
        "ui:job-new",
        "root",
        302,
        _job_submitted,
        "/ui/jobs/*",
        lambda w: {"model": MODEL, "version": "1", "input": [("rows.npz", _rows_npz())]},
    ),
    "ui:job-cancel": Submit("ui:job", "root", 302, _job_cancelled, "/ui/jobs/*"),
    "ui:promotion-decide decision=approve": Submit(
        "ui:promotion", "ada", 302, _decided("approved", 1, "ada"), "/ui/promotions"
    ),
    "ui:promotion-decide decision=reject": Submit(
        "ui:promotion", "ada", 302, _decided("rejected", None, "ada"), "/ui/promotions"
    ),
    "ui:promotion-decide decision=cancel": Submit(
        "ui:promotion", "mia", 302, _decided("cancelled", None, "mia"), "/ui/promotions"
    ),
    "ui:tokens": Submit("ui:tokens", "mia", 200, _token_created),
    "ui:token-revoke": Submit(
        "ui:tokens", "mia", 302, _token_revoked, "/ui/tokens", copy=lambda w: f"/{w.spare_token}/"
    ),
    "ui:token-rotate": Submit("ui:tokens", "mia", 200, _token_rotated, copy=lambda w: f"/{w.spare_token}/rotate"),
    "ui:users": Submit("ui:users", "root", 200, _invited, fill=lambda w: {"username": "invitee"}),
    "ui:user": Submit("ui:users", "root", 302, _access_set, "/ui/users", copy=lambda w: f"/ui/users/{NEWCOMER}"),
    "ui:user-password-link": Submit(
        "ui:users", "root", 200, _link_made, copy=lambda w: f"/ui/users/{NEWCOMER}/password-link"
    ),
    "logout": Submit("ui:models", "mia", 302, _signed_out, "/accounts/login/"),
    "login": Submit("login", None, 302, _signed_in, "/ui/", lambda w: {"username": "mia", "password": PASSWORD}),
    "password_change": Submit(
        "password_change",
        "mia",
        302,
        _password_changed,
        "/ui/",
        lambda w: {"old_password": PASSWORD, **_new_passwords(w)},
    ),
    "password_reset_confirm": Submit(
        "password_reset_confirm", None, 302, _password_set, "/accounts/login/", _new_passwords
    ),
}


# --- Reading pages as a browser ---------------------------------------------------------------------------


def ui_routes() -> dict[str, str]:
    """Every named route of the URL conf but the API's and the admin's, as {name: route}."""

    def walk(patterns: list[Any], prefix: str, namespace: str) -> Iterator[tuple[str, str]]:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                inner = f"{namespace}{pattern.namespace}:" if pattern.namespace else namespace
                yield from walk(pattern.url_patterns, route, inner)
            elif isinstance(pattern, URLPattern) and pattern.name:
                yield f"{namespace}{pattern.name}", route

    return {
        name: route for name, route in walk(get_resolver().url_patterns, "", "") if not route.startswith(OTHER_PREFIXES)
    }


def form_key(address: str) -> str:
    """The route a form posts to, with the parameters that name an action rather than an object."""
    match = resolve(urlsplit(address).path)
    verbs = " ".join(f"{key}={value}" for key, value in sorted(match.kwargs.items()) if key not in OBJECT_PARAMETERS)
    return f"{match.view_name} {verbs}".strip()


def browser(who: str | None) -> Client:
    """A browser of ``who`` (None: nobody signed in), whose posts are CSRF-checked as a real browser's are."""
    return session(who, enforce_csrf_checks=True) if who else Client(enforce_csrf_checks=True)


def render(client: Client, path: str) -> tuple[str, str]:
    """(the page's HTML, the path it ended at): redirects followed, as the set-password link redirects."""
    response = client.get(path, follow=True)
    assert response.status_code == 200, (path, response.status_code)
    return response.content.decode(), response.request["PATH_INFO"]


def forms_on(html: str, at: str) -> dict[str, list[tuple[Form, Control | None]]]:
    """Each submission the page offers (form and button), by the key of where it posts."""
    found: dict[str, list[tuple[Form, Control | None]]] = {}
    for form in post_forms(html, at):
        for address, button in form.targets():
            found.setdefault(form_key(address), []).append((form, button))
    return found


# --- The tests --------------------------------------------------------------------------------------------


def test_every_page_is_in_the_table():
    """A new page gets a row in PAGES (or POST_ONLY), and so its forms are looked for."""
    routes = ui_routes()
    missing = sorted(set(routes) - set(PAGES) - POST_ONLY - REDIRECT_ONLY)
    assert not missing, f"add to PAGES (or POST_ONLY) where {missing} is and who sees its forms"
    gone = sorted((set(PAGES) | POST_ONLY | REDIRECT_ONLY) - set(routes))
    assert not gone, f"PAGES or POST_ONLY names routes the URL conf no longer has: {gone}"


def test_every_post_form_of_every_page_is_in_the_table(world):
    """Every POST form any page shows anyone is in FORMS, and every form in FORMS is on a page."""
    seen: dict[str, set[str]] = {}
    scripted: set[str] = set()
    for name, page in PAGES.items():
        for who, path in [(who, path) for path in page.paths(world) for who in page.viewers]:
            html, at = render(browser(who), path)
            for key, submissions in forms_on(html, at).items():
                seen.setdefault(key, set()).add(f"{name} as {who or 'nobody'}")
                if any("js-only" in form.classes for form, _ in submissions):
                    scripted.add(key)
    missing = {key: sorted(pages) for key, pages in seen.items() if key not in FORMS}
    assert not missing, f"add to FORMS how to submit these forms with only their required fields: {missing}"
    assert sorted(set(FORMS) - set(seen)) == [], "FORMS names forms no page shows"
    assert {key.split()[0] for key in seen} >= POST_ONLY
    # A form only a script sends (class js-only) is sent as its script sends it, not as a plain form.
    assert scripted == {key for key, submit in FORMS.items() if submit.scripted}


@pytest.mark.parametrize("key", sorted(FORMS))
def test_form_succeeds_with_only_its_required_fields(world, key: str):
    submit = FORMS[key]
    client = browser(submit.who)
    html, at = render(client, (submit.at or PAGES[submit.page].path)(world))
    copies = [
        (form, button)
        for form, button in forms_on(html, at).get(key, [])
        if submit.copy(world) in (button.formaction if button and button.formaction else form.action)
    ]
    assert copies, f"{at} shows {submit.who} no form that posts to {key}"
    form, button = copies[0]
    fields = browser_fields(form, button, submit.fill(world))
    address = button.formaction if button is not None and button.formaction else form.action
    with TestCase.captureOnCommitCallbacks(execute=submit.runs_tasks):
        response = post(client, address, form, fields, scripted=submit.scripted)
    sent = [(name, value if isinstance(value, str) else "<file>") for name, value in fields]
    assert response.status_code == submit.status, (
        f"POST {address} with {sent}: {response.status_code} {response.content[:1500]!r}"
    )
    if response.status_code == 302 and submit.to.endswith("*"):
        assert response["Location"].startswith(submit.to[:-1]), response["Location"]
    elif response.status_code == 302:
        assert response["Location"] == submit.to
    else:
        assert 'role="alert"' not in response.content.decode(), response.content.decode()
    submit.check(world, response)


# The GET forms' required boxes, by the route they send to: "what served at" on the model page, and the
# alias to promote (shown filled).
GET_FILL: dict[str, dict[str, Any]] = {"ui:model": {"at": "2026-01-31T12:00"}, "ui:promote": {"alias": "staging"}}


def test_every_get_form_of_every_page_answers_when_sent_empty(world):
    """The search, filter and pick forms (method GET) sent as they are shown, every box empty: the page, no error."""
    sent = []
    for page in PAGES.values():
        for who, path in [(who, path) for path in page.paths(world) for who in page.viewers]:
            client = browser(who)
            html, at = render(client, path)
            for form in post_forms(html, at, method="get"):
                for address, button in form.targets():
                    fields = browser_fields(form, button, GET_FILL.get(form_key(address), {}))
                    response = client.get(urlsplit(address).path, fields)
                    assert response.status_code == 200, (at, address, fields, response.status_code)
                    assert 'role="alert"' not in response.content.decode(), (at, address, fields)
                    sent.append(form_key(address))
    assert {"ui:models", "ui:compare", "ui:promote", "ui:audit", "ui:model"} <= set(sent)


def post(client: Client, address: str, form: Form, fields: list[tuple[str, Any]], *, scripted: bool) -> Any:
    """POST as the browser would: urlencoded or multipart as the form says; a scripted form as its script sends it."""
    if scripted:
        # ui.js: FormData of the files, description and metadata; the CSRF token goes in X-CSRFToken.
        token = dict(fields)["csrfmiddlewaretoken"]
        data: dict[str, list[Any]] = {}
        for name, value in fields:
            if name != "csrfmiddlewaretoken":
                data.setdefault(name, []).append(_part(value))
        return client.post(address, data, HTTP_X_CSRFTOKEN=token, HTTP_ACCEPT="application/json")
    if form.enctype == "multipart/form-data":
        data = {}
        for name, value in fields:
            data.setdefault(name, []).append(_part(value))
        return client.post(address, data)
    return client.post(address, urlencode(fields), content_type="application/x-www-form-urlencoded")


def _part(value: Any) -> Any:
    if isinstance(value, tuple):
        name, data = value
        return SimpleUploadedFile(name, data, content_type="application/octet-stream")
    return value
