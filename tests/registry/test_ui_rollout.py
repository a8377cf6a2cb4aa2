"""Stepped rollouts in the web UI: each alias's rollout on the model page, started, paused, resumed and aborted
there by maintainers, and the review page of a protected alias's rollout request.

The inference processes are stood in for by ``registry.serving.worker_heartbeat`` with the cumulative totals
an inference process reports per loaded version; the periodic check is ``rollouts_advance``. A step's clock is
moved on by setting ``step_started_at`` back in the database (``tests/registry/test_rollout_api.py`` does the
same).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from django.db.models import F
from django.utils import timezone
from django.utils.html import escape

from registry.models import (
    AliasRollout,
    AuditEvent,
    PromotionKind,
    PromotionRequest,
    PromotionState,
    RegisteredModel,
    Role,
    RolloutState,
)
from registry.rollout import services as rollouts
from registry.rollout.services import rollouts_advance
from registry.serving import LoadedRow, LoadState, TrafficTotals, WorkerReport, worker_heartbeat
from tests.support.html_forms import Form, browser_fields, post_forms
from tests.support.people import Person, make_person
from tests.support.registry import create_model, promote, set_alias, set_served, upload_versions

pytestmark = pytest.mark.django_db

MODEL_PAGE = "/ui/models/demo"
STAGING = "/ui/models/demo/aliases/staging/rollout"
PRODUCTION = "/ui/models/demo/aliases/production/rollout"
FAST = 20  # latency bin of a 3.2 ms answer (TRAFFIC_LATENCY_BOUNDS[20] = 0.1 ms * 2**5)
SLOWER = 24  # latency bin of a 6.4 ms answer (0.1 ms * 2**6)
ROLE_MESSAGE = "starting, pausing, resuming or aborting a rollout needs the maintainer or admin role"


@pytest.fixture
def served(mia: Person, ana: Person) -> RegisteredModel:
    """production (protected, served) and staging (unprotected, served) serve v1; v2 is ready."""
    create_model(mia)
    upload_versions(mia, [1.0, 2.0])
    promote(mia, ana, 1)
    assert set_alias(mia, "staging", 1).status_code == 200
    set_served(make_person("root", Role.ADMIN), "staging", True)
    return RegisteredModel.objects.get(name="demo")


def traffic(requests: int, errors: int = 0, latency_bin: int = FAST) -> TrafficTotals:
    return TrafficTotals(requests=requests, errors=errors, latency={str(latency_bin): requests} if requests else {})


def heartbeat(current: TrafficTotals, candidate: TrafficTotals, *, percent: int = 10) -> None:
    """What an inference process serving staging (v1) and splitting it with the candidate (v2) reports."""
    worker_heartbeat(
        WorkerReport(
            worker_id="w1",
            host="h",
            pid=1,
            device="cpu",
            provider="CPUExecutionProvider",
            started_at=timezone.now(),
            loaded=(
                LoadedRow(model="demo", version=1, state=LoadState.READY, aliases=("staging",), totals=current),
                LoadedRow(
                    model="demo", version=2, state=LoadState.READY, splits={"staging": percent}, totals=candidate
                ),
            ),
        )
    )


def age(seconds: float) -> None:
    """Move the running step's start back, as if it had run ``seconds`` longer."""
    AliasRollout.objects.filter(step_started_at__isnull=False).update(
        step_started_at=F("step_started_at") - timedelta(seconds=seconds)
    )


def roll_out(model: RegisteredModel, person: Person, alias: str = "staging", **settings: Any) -> AliasRollout:
    return rollouts.rollout_start(model=model, alias_name=alias, version_number=2, actor=person.actor, **settings)


def page(person: Person) -> str:
    response = person.client.get(MODEL_PAGE)
    assert response.status_code == 200
    return str(response.content.decode())


def forms_to(html: str, address: str) -> list[Form]:
    """The forms of the model page that post to ``address``, with a button or as their action."""
    return [form for form in post_forms(html, MODEL_PAGE) if any(target == address for target, _ in form.targets())]


def send(person: Person, form: Form, fill: dict[str, Any], *, to: str = "") -> Any:
    """Submit ``form`` as a browser does, with only ``fill`` filled in, by the button that posts to ``to``."""
    targets = [(address, button) for address, button in form.targets() if not to or address == to]
    assert len(targets) == 1, (to, form.targets())
    address, button = targets[0]
    fields = browser_fields(form, button, fill)
    return person.client.post(address, urlencode(fields), content_type="application/x-www-form-urlencoded")


def section(html: str, alias: str) -> str:
    """The alias's box in the Rollouts section, up to the next alias's box or the Versions heading."""
    start = html.index(f'id="rollout-{alias}" data-rollout-alias="{alias}"')
    ends = [i for i in (html.find('data-rollout-alias="', start + 40), html.find("<h2>Versions</h2>", start)) if i > 0]
    return html[start : min(ends)]


# --- Starting -----------------------------------------------------------------------------------------


def test_the_start_form_sent_with_only_the_version_starts_a_rollout_with_the_defaults(mia, served):
    html = page(mia)
    assert '<td data-rollout class="small"><a class="muted" href="#rollout-staging">none</a></td>' in html
    assert "Never rolled out." in section(html, "staging")
    (form,) = forms_to(html, STAGING)

    response = send(mia, form, {"version": "2"})  # every optional box empty, as a browser sends it

    assert (response.status_code, response["Location"]) == (302, "/ui/models/demo#rollout-staging")
    rollout = AliasRollout.objects.get(alias__name="staging")
    assert (rollout.state, rollout.version.version, rollout.base_version.version, rollout.promotion) == (
        RolloutState.RUNNING,
        2,
        1,
        None,
    )
    assert (
        rollout.steps,
        rollout.step_seconds,
        rollout.max_error_rate,
        rollout.max_p99_ratio,
        rollout.min_requests,
        rollout.started_by.username,
    ) == ([5, 25, 50, 100], 300, 0.005, 1.2, 200, "mia")
    event = AuditEvent.objects.get(action="rollout.start")
    assert (event.actor, event.target, event.after) == (
        "mia",
        "demo@staging",
        {"rollout": rollout.pk, "version": 2, "percent": 5},
    )

    after = page(mia)
    assert (
        "The rollout of v2 on &#x27;staging&#x27; started: step 1 of 4, 5% of its requests; inference processes "
        "start splitting on their next pass."
    ) in after
    assert '<td data-rollout class="small"><a href="#rollout-staging">v2</a> running: step 1 of 4, 5%</td>' in after
    box = section(after, "staging")
    assert '<span class="badge ok" data-rollout-state>running</span>' in box
    assert "<strong>step 1 of 4: 5% of requests</strong> go to v2;" in box
    assert re.search(r"<span data-rollout-elapsed>\d+ s of 5 min</span>", box)
    assert "Steps 5%, 25%, 50%, 100% of the requests, each run for 5 min and passed with at least 200 requests" in box
    assert (
        "error rate is above 0.5%, or, once both versions have 200 requests in the step, when its p99 latency is "
        "above 1.2x the current version's" in box
    )
    assert "Not checked yet" in box
    assert not forms_to(after, STAGING)  # one live rollout per alias: abort it first
    (control,) = forms_to(after, f"{STAGING}/pause")
    assert sorted(address for address, _ in control.targets()) == [f"{STAGING}/abort", f"{STAGING}/pause"]


def test_the_start_form_takes_every_setting(mia, served):
    (form,) = forms_to(page(mia), STAGING)

    response = send(
        mia,
        form,
        {
            "version": "2",
            "steps": "10%, 50 100",
            "step_seconds": "60",
            "max_error_rate": "0.01",
            "max_p99_ratio": "1.5",
            "min_requests": "50",
            "reason": "try it",
        },
    )

    assert response.status_code == 302, response.content.decode()
    rollout = AliasRollout.objects.get(alias__name="staging")
    assert (
        rollout.steps,
        rollout.step_seconds,
        rollout.max_error_rate,
        rollout.max_p99_ratio,
        rollout.min_requests,
    ) == (
        [10, 50, 100],
        60,
        0.01,
        1.5,
        50,
    )
    box = section(page(mia), "staging")
    assert "Steps 10%, 50%, 100% of the requests, each run for 1 min and passed with at least 50 requests" in box
    assert (
        "error rate is above 1%, or, once both versions have 50 requests in the step, when its p99 latency is "
        "above 1.5x" in box
    )


def test_on_a_protected_alias_the_start_waits_for_approval_and_links_the_request(mia, served):
    (form,) = forms_to(page(mia), PRODUCTION)
    assert "Request a rollout</button>" in page(mia)

    response = send(mia, form, {"version": "2", "reason": "canary it"})

    assert (response.status_code, response["Location"]) == (302, "/ui/models/demo#rollout-production")
    rollout = AliasRollout.objects.get(alias__name="production")
    promotion = PromotionRequest.objects.get(state=PromotionState.PENDING)
    assert rollout.state == RolloutState.PENDING and rollout.promotion == promotion
    assert (promotion.kind, promotion.version.version, promotion.reason) == (PromotionKind.ROLLOUT, 2, "canary it")
    assert not AuditEvent.objects.filter(action="rollout.start").exists()
    event = AuditEvent.objects.filter(action="promotion.request").latest("seq")
    assert (event.actor, event.after["kind"], event.after["rollout"]) == ("mia", "rollout", rollout.pk)

    html = page(mia)
    assert (
        f'<a href="/ui/promotions/{promotion.pk}">Promotion request {promotion.pk}</a> opened: the stepped rollout '
        "of v2 on &#x27;production&#x27; waits for another approver to approve it, and starts then."
    ) in html
    assert '<td data-rollout class="small"><a href="#rollout-production">v2</a> pending</td>' in html
    box = section(html, "production")
    assert '<span class="badge pending" data-rollout-state>pending</span>' in box
    assert f'of <a href="/ui/promotions/{promotion.pk}">promotion request {promotion.pk}</a>; once approved' in box
    (control,) = forms_to(html, f"{PRODUCTION}/abort")
    assert [address for address, _ in control.targets()] == [f"{PRODUCTION}/abort"]  # no pause before it runs


def test_aborting_a_pending_rollout_cancels_its_request(mia, served):
    rollout = roll_out(served, mia, "production")
    (control,) = forms_to(page(mia), f"{PRODUCTION}/abort")

    response = send(mia, control, {})

    assert (response.status_code, response["Location"]) == (302, "/ui/models/demo#rollout-production")
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.ABORTED and rollout.promotion.state == PromotionState.CANCELLED
    html = page(mia)
    assert (
        f"The rollout of v2 on &#x27;production&#x27; was aborted before it started; its promotion request "
        f"{rollout.promotion_id} was cancelled."
    ) in html
    assert forms_to(html, PRODUCTION)  # a new one may be asked for


# --- Watching -----------------------------------------------------------------------------------------


def test_the_model_page_shows_the_step_and_the_last_checks_figures(mia, served):
    roll_out(served, mia, steps=[10, 50, 100], step_seconds=60, min_requests=100)
    heartbeat(current=traffic(300, errors=3), candidate=traffic(40, latency_bin=SLOWER))
    assert set(rollouts_advance().values()) == {"checked"}

    box = section(page(mia), "staging")
    assert "<strong>step 1 of 3: 10% of requests</strong> go to v2;" in box
    assert re.search(r"<span data-rollout-elapsed>\d+ s of 1 min</span>", box)
    assert re.search(
        r'<p class="small" data-rollout-check>Last check <time datetime="[^"]+">[^<]+</time> \(step 1, \d+ s in\)', box
    )
    assert (
        '<tr data-side="candidate">\n      <td>v2 (candidate)</td>\n      <td class="num">40</td>\n'
        '      <td class="num">0 (0%)</td>\n      <td class="num">6.4 ms</td>'
    ) in box
    assert (
        '<tr data-side="current">\n      <td>v1 (current)</td>\n      <td class="num">300</td>\n'
        '      <td class="num">3 (1%)</td>\n      <td class="num">3.2 ms</td>'
    ) in box
    assert "data-rollout-waiting" not in box

    age(61)  # the step has run its time, with too few requests on the candidate to pass
    assert set(rollouts_advance().values()) == {"checked"}
    box = section(page(mia), "staging")
    assert re.search(r"<span data-rollout-elapsed>1 min \d+ s of 1 min</span>", box)
    assert (
        '<p class="flash warn" data-rollout-waiting>The step has run its time and waits for requests: 40 of the 100 '
        "requests a step needs so far.</p>"
    ) in box

    heartbeat(current=traffic(900), candidate=traffic(150))
    assert set(rollouts_advance().values()) == {"stepped"}
    html = page(mia)
    assert '<a href="#rollout-staging">v2</a> running: step 2 of 3, 50%</td>' in html
    assert "<strong>step 2 of 3: 50% of requests</strong> go to v2;" in section(html, "staging")


def test_an_ended_rollout_shows_its_state_and_why(mia, served):
    roll_out(served, mia, min_requests=10)
    heartbeat(current=traffic(100), candidate=traffic(20, errors=6))
    assert set(rollouts_advance().values()) == {"rolled_back"}

    html = page(mia)
    assert (
        '<td data-rollout class="small"><a class="muted" href="#rollout-staging">none live; v2 rolled_back</a></td>'
    ) in html
    box = section(html, "staging")
    assert "No rollout live; the last one was:" in box
    assert '<span class="badge bad" data-rollout-state>rolled_back</span>' in box
    assert (
        "<span data-rollout-end-reason>error rate 30.00% (6 of 20 requests) is above the limit of 0.50%</span>"
    ) in box
    assert '<td class="num">6 (30%)</td>' in box  # the figures the breach was found in
    assert forms_to(html, STAGING)  # another may start


# --- Pause, resume, abort -----------------------------------------------------------------------------


def test_pause_resume_and_abort_work_and_are_audited(mia, served):
    rollout = roll_out(served, mia)
    (control,) = forms_to(page(mia), f"{STAGING}/pause")

    paused = send(mia, control, {"reason": "lunch"}, to=f"{STAGING}/pause")

    assert (paused.status_code, paused["Location"]) == (302, "/ui/models/demo#rollout-staging")
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.PAUSED
    event = AuditEvent.objects.get(action="rollout.pause")
    assert (event.actor, event.target, event.after) == (
        "mia",
        "demo@staging",
        {"rollout": rollout.pk, "reason": "lunch"},
    )
    html = page(mia)
    assert (
        "The rollout of v2 on &#x27;staging&#x27; is paused at 5% of its requests (step 1 of 4); the step&#x27;s "
        "clock stopped."
    ) in html
    assert '<a href="#rollout-staging">v2</a> paused: step 1 of 4, 5%</td>' in html
    box = section(html, "staging")
    assert (
        '<span class="badge warn" data-rollout-state>paused</span>' in box and "its clock stopped while paused" in box
    )
    (control,) = forms_to(html, f"{STAGING}/resume")
    assert sorted(address for address, _ in control.targets()) == [f"{STAGING}/abort", f"{STAGING}/resume"]

    resumed = send(mia, control, {}, to=f"{STAGING}/resume")

    assert resumed.status_code == 302
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.RUNNING
    assert AuditEvent.objects.get(action="rollout.resume").actor == "mia"
    html = page(mia)
    assert "The rollout of v2 on &#x27;staging&#x27; runs on: step 1 of 4, 5% of its requests." in html
    (control,) = forms_to(html, f"{STAGING}/pause")

    aborted = send(mia, control, {"reason": "wrong version"}, to=f"{STAGING}/abort")

    assert aborted.status_code == 302
    rollout.refresh_from_db()
    assert (rollout.state, rollout.end_reason, rollout.percent) == (RolloutState.ABORTED, "wrong version", 0)
    event = AuditEvent.objects.get(action="rollout.abort")
    assert (event.actor, event.after["reason"]) == ("mia", "wrong version")
    html = page(mia)
    assert "The rollout of v2 on &#x27;staging&#x27; was aborted: every request goes to v1 again." in html
    box = section(html, "staging")
    assert '<span class="badge neutral" data-rollout-state>aborted</span>' in box
    assert "<span data-rollout-end-reason>wrong version</span>" in box
    assert not forms_to(html, f"{STAGING}/pause") and not forms_to(html, f"{STAGING}/abort")
    assert forms_to(html, STAGING)


def test_a_change_with_no_rollout_to_change_shows_the_refusal(mia, served):
    response = mia.client.post(f"{STAGING}/pause", {"reason": ""})

    assert response.status_code == 409
    message = "alias 'staging' of model 'demo' has no running rollout"
    assert f'<div class="flash error" role="alert">{escape(message)}</div>' in response.content.decode()

    roll_out(served, mia)
    resume = mia.client.post(f"{STAGING}/resume", {"reason": ""})
    assert resume.status_code == 409
    assert escape("alias 'staging' of model 'demo' has no paused rollout") in resume.content.decode()

    unknown = mia.client.post("/ui/models/demo/aliases/nope/rollout/abort", {"reason": ""})
    assert unknown.status_code == 404
    assert escape("model 'demo' has no alias 'nope'") in unknown.content.decode()


# --- Refusals -----------------------------------------------------------------------------------------


def test_a_viewer_is_refused_with_the_message(vic, mia, served):
    html = page(vic)
    assert not [form for form in post_forms(html, MODEL_PAGE) if "/rollout" in form.action]

    refused = vic.client.post(STAGING, {"version": "2", "steps": "", "step_seconds": ""})

    assert refused.status_code == 403
    assert f'<div class="flash error" role="alert">{ROLE_MESSAGE}</div>' in refused.content.decode()
    assert not AliasRollout.objects.exists()
    denied = AuditEvent.objects.get(action="access.denied")
    assert (denied.actor, denied.target) == ("vic", f"POST {STAGING}")

    rollout = roll_out(served, mia)
    for change in ("pause", "resume", "abort"):
        response = vic.client.post(f"{STAGING}/{change}", {"reason": ""})
        assert response.status_code == 403 and ROLE_MESSAGE in response.content.decode()
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.RUNNING
    assert AuditEvent.objects.filter(action="access.denied", actor="vic").count() == 4


@pytest.mark.parametrize(
    ("sent", "status", "message"),
    [
        ({"version": "2", "steps": "50, 25"}, 400, "each step must be larger than the one before: [50, 25]"),
        ({"version": "2", "steps": "5, 150"}, 400, "each step is a whole percentage from 1 to 100: [5, 150]"),
        (
            {"version": "2", "steps": "5, half"},
            400,
            "steps: each step is a whole percentage, separated by commas or spaces, e.g. 5, 25, 50, 100; not 'half'",
        ),
        ({"version": "2", "max_error_rate": "2"}, 400, "max_error_rate: Ensure this value is less than or equal to 1."),
        ({"version": "9"}, 404, "model 'demo' has no version 9"),
        ({"version": "1"}, 409, "alias 'staging' serves version 1 already"),
        ({"version": "two"}, 400, "version: Enter a whole number."),
    ],
)
def test_a_refused_start_shows_the_error_on_the_page(mia, served, sent, status, message):
    response = mia.client.post(STAGING, sent)

    assert response.status_code == status
    assert f'<div class="flash error" role="alert">{escape(message)}</div>' in response.content.decode()
    assert response.context["model"].name == "demo"  # the model page, with its forms
    assert not AliasRollout.objects.exists()


def test_a_second_rollout_on_the_alias_is_refused_naming_the_first(mia, served):
    first = roll_out(served, mia)

    response = mia.client.post(STAGING, {"version": "2"})

    assert response.status_code == 409
    message = f"alias 'staging' has a rollout of version 2 running already (rollout {first.pk}); abort it first"
    assert escape(message) in response.content.decode()


def test_an_alias_not_served_offers_no_start_form(mia, served):
    set_alias(mia, "canary", 1)

    html = page(mia)

    assert "'canary' is not served, so it has no requests to split." in section(html, "canary")
    assert not forms_to(html, "/ui/models/demo/aliases/canary/rollout")
    refused = mia.client.post("/ui/models/demo/aliases/canary/rollout", {"version": "2"})
    assert refused.status_code == 409
    assert "is not served, so there are no requests to split; serve it first" in refused.content.decode()


# --- The review page ----------------------------------------------------------------------------------


def test_the_review_page_of_a_rollout_request_shows_its_steps_and_limits(mia, ana, served):
    rollout = roll_out(served, mia, "production", steps=[10, 50, 100], step_seconds=120, reason="canary it")
    promotion = rollout.promotion
    assert promotion is not None

    response = ana.client.get(f"/ui/promotions/{promotion.pk}")

    assert response.status_code == 200
    html = response.content.decode()
    assert "stepped rollout of v2 on 'production' of demo" in html
    assert f'<div class="box" id="rollout-request" data-rollout="{rollout.pk}">' in html
    assert "This asks for a <strong>stepped rollout</strong> of v2 on 'production'. Approving starts it" in html
    assert "rather than moving the alias" in html
    assert "Steps 10%, 50%, 100% of the requests, each run for 2 min and passed with at least 200 requests" in html
    assert (
        "error rate is above 0.5%, or, once both versions have 200 requests in the step, when its p99 latency is "
        "above 1.2x" in html
    )
    assert '<span class="badge pending" data-rollout-state>pending</span>' in html
    assert response.context["diff"] is not None  # the candidate is compared with what production serves
    assert 'id="shadow-none"' not in html  # a rollout's request carries no shadow report
    assert (
        "Start the stepped rollout of v2 on 'production' of demo (10%, 50%, 100% of its requests)? "
        "Its first step begins at once; the alias moves only after the last step passes."
    ) in html
    listed = ana.client.get("/ui/promotions").content.decode()
    assert f'<tr data-promotion="{promotion.pk}">' in listed and ">stepped rollout</span>" in listed

    approved = ana.client.post(f"/ui/promotions/{promotion.pk}/approve", {"reason": "go"})

    assert approved.status_code == 302
    rollout.refresh_from_db()
    assert (rollout.state, rollout.percent, rollout.alias.version.version) == (RolloutState.RUNNING, 10, 1)
    review = ana.client.get(f"/ui/promotions/{promotion.pk}").content.decode()
    assert '<span class="badge ok" data-rollout-state>running</span>' in review
    assert "<strong>step 1 of 3: 10% of requests</strong>" in review
    assert 'href="/ui/models/demo#rollout-production"' in review
