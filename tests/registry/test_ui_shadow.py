"""Shadow traffic in the web UI: the report a promotion request carries on its review page, and each alias's
shadow on the model page, started and stopped there by maintainers."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import numpy as np
import pytest
from django.utils.html import escape

from onnxkit.agreement import Tally
from registry.models import AliasShadow, AuditEvent, PromotionRequest, RegisteredModel, ShadowTally
from registry.shadow import services as shadows
from tests.support.html_forms import Form, browser_fields, post_forms
from tests.support.people import Person
from tests.support.registry import create_model, promote, set_alias, upload_versions

pytestmark = pytest.mark.django_db

MODEL_PAGE = "/ui/models/demo"
START = "/ui/models/demo/aliases/production/shadow"
STOP = "/ui/models/demo/aliases/production/shadow/stop"
NOT_MEASURED = '<span class="muted">not measured yet</span>'


@pytest.fixture
def serving_v1(mia: Person, ana: Person) -> RegisteredModel:
    """production (protected, served) serves v1 (y = x + 1); v2 (bias 2) is ready and compatible."""
    create_model(mia)
    upload_versions(mia, [1.0, 2.0])
    promote(mia, ana, 1)
    return RegisteredModel.objects.get(name="demo")


def tally() -> dict[str, Any]:
    """Three requests compared (class scores that agree on one row of two), one the candidate failed, one dropped."""
    primary = np.array([[0.1, 0.9], [0.8, 0.2]], dtype=np.float32)
    candidate = np.array([[0.2, 0.8], [0.3, 0.7]], dtype=np.float32)
    counted = Tally()
    for _ in range(3):
        counted.record(
            primary={"y": primary}, primary_seconds=0.001, candidate={"y": candidate}, candidate_seconds=0.002
        )
    counted.record(
        primary={"y": primary},
        primary_seconds=0.001,
        candidate=None,
        candidate_seconds=0.002,
        candidate_error="RuntimeError: boom",
    )
    counted.dropped("queue_full")
    return counted.as_json()


def shadow_v2(model: RegisteredModel, person: Person, *, sample: float = 0.25, counted: bool = True) -> AliasShadow:
    shadow = shadows.shadow_start(
        model=model, alias_name="production", version_number=2, sample=sample, actor=person.actor
    )
    if counted:
        ShadowTally.objects.create(shadow=shadow, worker_id="inf-1", tally=tally())
    return shadow


def request_v2(person: Person) -> PromotionRequest:
    response = set_alias(person, "production", 2)
    assert response.status_code == 202, response.content
    return PromotionRequest.objects.get(pk=response.json()["id"])


def form_posting_to(html: str, address: str) -> Form:
    (form,) = [form for form in post_forms(html, MODEL_PAGE) if form.action == address]
    return form


def send(person: Person, form: Form, fill: dict[str, Any]) -> Any:
    """Submit ``form`` as a browser does, with only ``fill`` filled in."""
    fields = browser_fields(form, form.buttons[0] if form.buttons else None, fill)
    return person.client.post(form.action, urlencode(fields), content_type="application/x-www-form-urlencoded")


# --- The review page ----------------------------------------------------------------------------------


def test_the_review_page_shows_the_shadow_report_the_request_carries(mia, ana, serving_v1):
    shadow_v2(serving_v1, mia)
    promotion = request_v2(mia)
    assert promotion.shadow_report is not None and promotion.shadow_report["report"]["compared"] == 3

    response = ana.client.get(f"/ui/promotions/{promotion.pk}")

    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="shadow-none"' not in html
    assert f'id="shadow-report" data-shadow="{promotion.shadow_report["id"]}"' in html
    summary = response.context["shadow"]
    assert (summary["version"], summary["serving"], summary["sample_percent"], summary["running"]) == (
        2,
        1,
        "25%",
        True,
    )
    assert "<strong>v2</strong> (candidate) against\n  <strong>v1</strong> (serving)" in html
    assert "on 25% of the requests" in html
    assert "<span data-shadow-counts>3 compared of 4 mirrored, 1 dropped (queue_full 1)</span>" in html
    assert (
        '<tr data-side="primary">\n      <td>v1 (serving)</td>\n      <td class="num">4</td>\n'
        '      <td class="num">0 (0%)</td>\n      <td class="num">1.13 ms</td>\n      <td class="num">1.13 ms</td>'
    ) in html
    assert (
        '<tr data-side="candidate">\n      <td>v2 (candidate)</td>\n      <td class="num">3</td>\n'
        '      <td class="num">1 (25%)</td>\n      <td class="num">2.26 ms</td>\n      <td class="num">2.26 ms</td>'
    ) in html
    assert '<span class="bad">RuntimeError: boom</span>' in html
    y = promotion.shadow_report["report"]["outputs"]["y"]
    # The cosines and the drift as onnxkit.agreement bins them (its tests pin those); the rest is exact.
    cosines = [f"{y[key]:.9g}" for key in ("cosine_p1", "cosine_p50", "cosine_min")]
    assert 0.5 < y["cosine_min"] < 0.7 and y["psi"] > 0
    cells = "".join(f'<td class="num">{value}</td>' for value in (*cosines, "0.5", "0.3", "50%", f"{y['psi']:.4g}"))
    assert (
        '<tr data-output="y">\n      <td><code>y</code></td>\n      <td class="num">6</td>\n'
        f'      {cells}\n      <td class="num">0</td>'
    ) in html


def test_a_report_with_nothing_measured_yet_says_so(mia, ana, serving_v1):
    shadow_v2(serving_v1, mia, counted=False)
    promotion = request_v2(mia)

    html = ana.client.get(f"/ui/promotions/{promotion.pk}").content.decode()

    assert "<span data-shadow-counts>0 compared of 0 mirrored, 0 dropped</span>" in html
    assert "Nothing compared yet" in html
    assert f'<td class="num">{NOT_MEASURED}</td>' in html  # p50 and p99 of each version
    assert '<td colspan="10" class="empty">No output compared yet.</td>' in html


def test_a_stored_report_missing_values_still_renders(mia, ana, serving_v1):
    """A report is kept as JSON with the request: read it as it is, whatever is null or missing."""
    promotion = request_v2(mia)
    promotion.shadow_report = {"version": 2, "report": {"outputs": {"y": {"rows": 4, "cosine_p1": None}}}}
    promotion.save(update_fields=["shadow_report"])

    response = ana.client.get(f"/ui/promotions/{promotion.pk}")

    assert response.status_code == 200
    html = response.content.decode()
    assert '<tr data-output="y">' in html and NOT_MEASURED in html
    assert '<td class="num">n/a</td>' in html  # compared rows, but no class scores: top-1 does not apply


def test_the_review_page_without_a_shadow_says_only_the_offline_comparison_is_available(mia, ana, serving_v1):
    promotion = request_v2(mia)
    assert promotion.shadow_report is None

    response = ana.client.get(f"/ui/promotions/{promotion.pk}")

    assert response.status_code == 200
    assert response.context["shadow"] is None
    assert (
        '<p class="muted" id="shadow-none">v2 was not shadowed on \'production\' before this request, so '
        "only the offline comparison above is available.</p>"
    ) in response.content.decode()


# --- The model page -----------------------------------------------------------------------------------


def test_the_model_page_shows_each_aliases_running_shadow(mia, serving_v1):
    shadow_v2(serving_v1, mia)

    html = mia.client.get(MODEL_PAGE).content.decode()

    worst = shadows.shadow_current(serving_v1, "production").report["outputs"]["y"]["cosine_p1"]
    assert (
        '<td data-shadow class="small"><a href="#shadow-production">v2</a> on 25%: 3 compared, worst cosine p1 '
        f"{worst:.9g}</td>"
    ) in html
    assert 'id="shadow-production" data-shadow-alias="production"' in html
    assert '<tr data-output="y">' in html
    assert form_posting_to(html, STOP)
    assert "Replace the shadow</button>" in html


def test_a_running_shadow_with_nothing_counted_yet_says_not_measured(mia, serving_v1):
    shadow_v2(serving_v1, mia, counted=False)

    html = mia.client.get(MODEL_PAGE).content.decode()

    assert f"v2</a> on 25%: 0 compared, worst cosine p1 {NOT_MEASURED}</td>" in html


def test_the_start_form_sent_with_only_the_version_mirrors_a_tenth(mia, serving_v1):
    page = mia.client.get(MODEL_PAGE).content.decode()
    assert '<a class="muted" href="#shadow-production">none running</a>' in page
    form = form_posting_to(page, START)

    response = send(mia, form, {"version": "2"})  # the Sample box left empty, as a browser sends it

    assert (response.status_code, response["Location"]) == (302, "/ui/models/demo#shadow-production")
    shadow = AliasShadow.objects.get(alias__name="production", ended_at__isnull=True)
    assert (shadow.version.version, shadow.sample, shadow.started_by.username) == (2, 0.1, "mia")
    event = AuditEvent.objects.get(action="alias.shadow_start")
    assert (event.actor, event.target, event.after["sample"]) == ("mia", "demo@production", 0.1)
    after = mia.client.get(MODEL_PAGE).content.decode()
    assert "v2 now shadows &#x27;production&#x27; on 10% of its requests" in after
    assert '<a href="#shadow-production">v2</a> on 10%: 0 compared' in after


def test_the_stop_form_ends_the_shadow(mia, serving_v1):
    shadow = shadow_v2(serving_v1, mia)
    form = form_posting_to(mia.client.get(MODEL_PAGE).content.decode(), STOP)

    response = send(mia, form, {})  # no reason given

    assert (response.status_code, response["Location"]) == (302, "/ui/models/demo#shadow-production")
    shadow.refresh_from_db()
    assert shadow.ended_at is not None and (shadow.ended_by.username, shadow.end_reason) == ("mia", "stopped")
    assert AuditEvent.objects.filter(action="alias.shadow_stop", actor="mia").count() == 1
    html = mia.client.get(MODEL_PAGE).content.decode()
    assert "The shadow of v2 on &#x27;production&#x27; stopped." in html
    assert "No shadow running; the last one was:" in html and '<span class="badge neutral">ended</span>' in html
    assert not [form for form in post_forms(html, MODEL_PAGE) if form.action == STOP]
    assert "Start a shadow</button>" in html


def test_a_viewer_is_refused_with_the_message(vic, mia, serving_v1):
    page = vic.client.get(MODEL_PAGE).content.decode()
    assert not [form for form in post_forms(page, MODEL_PAGE) if "/shadow" in form.action]

    refused = vic.client.post(START, {"version": "2", "sample": ""})

    assert refused.status_code == 403
    message = "starting or stopping a shadow needs the maintainer or admin role"
    assert f'<div class="flash error" role="alert">{message}</div>' in refused.content.decode()
    assert not AliasShadow.objects.exists()
    denied = AuditEvent.objects.get(action="access.denied")
    assert (denied.actor, denied.target) == ("vic", f"POST {START}")

    shadow_v2(serving_v1, mia)
    stop = vic.client.post(STOP, {"reason": ""})
    assert stop.status_code == 403 and message in stop.content.decode()
    assert AliasShadow.objects.get().ended_at is None


@pytest.mark.parametrize(
    ("sent", "status", "message"),
    [
        ({"version": "9"}, 404, "model 'demo' has no version 9"),
        ({"version": "1"}, 409, "alias 'production' serves version 1 already; shadow another version"),
        ({"version": "2", "sample": "5"}, 400, "sample must be above 0 and at most 1 (a share of the requests), not 5"),
        ({"version": "two"}, 400, "version: Enter a whole number."),
    ],
)
def test_a_refused_start_shows_the_error_on_the_page(mia, serving_v1, sent, status, message):
    response = mia.client.post(START, sent)

    assert response.status_code == status
    assert f'<div class="flash error" role="alert">{escape(message)}</div>' in response.content.decode()
    assert response.context["model"].name == "demo"  # the model page, with its forms
    assert not AliasShadow.objects.exists()


def test_refusals_of_the_alias_show_on_the_page(mia, serving_v1):
    unknown = mia.client.post("/ui/models/demo/aliases/nope/shadow", {"version": "2"})
    assert unknown.status_code == 404
    assert escape("model 'demo' has no alias 'nope'") in unknown.content.decode()

    nothing = mia.client.post(STOP, {"reason": ""})
    assert nothing.status_code == 404
    assert escape("alias 'production' of model 'demo' has no running shadow") in nothing.content.decode()

    staging = mia.client.post("/ui/models/demo/aliases/staging/shadow", {"version": "2"})
    assert staging.status_code == 404  # the page sets existing aliases only
    assert escape("model 'demo' has no alias 'staging'") in staging.content.decode()


def test_an_alias_not_served_offers_no_start_form(mia, serving_v1):
    set_alias(mia, "staging", 1)

    html = mia.client.get(MODEL_PAGE).content.decode()

    assert "'staging' is not served, so it has no requests to mirror." in html
    assert not [form for form in post_forms(html, MODEL_PAGE) if form.action.endswith("/staging/shadow")]
    refused = mia.client.post("/ui/models/demo/aliases/staging/shadow", {"version": "2"})
    assert refused.status_code == 409
    assert "is not served, so it has no requests to mirror; serve it first" in refused.content.decode()
