"""The web UI's whole jobs in real Chromium, against a real ``modelyard serve --role all`` (tests/support/ui.py).

One browser for the module, a context per person. Registry state is made through the services in
this process (the server shares the test database and the artifact folder); everything the tests
are about is done in the browser. Screenshots land in build/screenshots.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import requests
from django.contrib.auth import get_user_model
from django.utils import timezone
from playwright.sync_api import expect

from registry import promotions, services, serving, tasks
from registry.access import services as access
from registry.audit.chain import Actor
from registry.models import (
    PRODUCTION,
    AliasMove,
    AuditEvent,
    InferenceWorker,
    ModelVersion,
    PromotionRequest,
    RegisteredModel,
    Role,
)
from registry.serving import LoadedRow, LoadState, TrafficBucket, WorkerReport
from registry.uploads import LocalUpload, version_upload
from tests.support.onnx_models import add_model_bytes
from tests.support.polling import eventually
from tests.support.ui import LAPTOP, PHONE, UiServer, csp_violations, csrf_token, login, person, shoot

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.usefixtures("shared_storage")]

X = [[0.5, 1.0, 1.5, 2.0]]
MINUS = "\u2212"


def upload(model: str, actor: Actor, **kwargs: Any) -> ModelVersion:
    """A version uploaded and validated here, through the one upload service."""
    data = add_model_bytes(**kwargs)
    version = version_upload(
        model=RegisteredModel.objects.get(name=model), source=LocalUpload([("model.onnx", data)]), actor=actor
    )
    version.refresh_from_db()
    assert version.status == "ready", version.errors
    return version


def promote(model: str, number: int, requester: Actor, approver: Actor, **kwargs: Any) -> None:
    outcome = promotions.alias_set(
        model=RegisteredModel.objects.get(name=model),
        alias_name=PRODUCTION,
        version_number=number,
        actor=requester,
        reason="setup",
        **kwargs,
    )
    assert outcome.promotion is not None
    promotions.promotion_approve(promotion_id=outcome.promotion.pk, actor=approver, reason="setup")


def confirm(page: Any) -> None:
    """Answer the page's confirmation <dialog> with its confirm button."""
    dialog = page.locator("dialog#confirm")
    dialog.wait_for(state="visible")
    dialog.locator("button[value=yes]").click()


def infer(server: UiServer, token: str) -> Any:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": X[0]}]}
    response = requests.post(
        f"{server.url}/v2/models/demo/infer", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    return response


# --- 1. Upload with a progress bar, then validation to ready --------------------------------------------


PROGRESS_WATCH = """() => {
  window.progressSeen = [];
  const bar = document.getElementById("progress");
  new MutationObserver(() => window.progressSeen.push([bar.value, bar.max]))
    .observe(bar, { attributes: true, attributeFilter: ["value", "max"] });
  const seen = () => window.progressSeen.push([bar.value, bar.max]);
  bar.addEventListener("change", seen);
}"""

DROP_FILES = """([modelBase64, tokenizer, weightBytes]) => {
  const bytes = Uint8Array.from(atob(modelBase64), (c) => c.charCodeAt(0));
  const transfer = new DataTransfer();
  transfer.items.add(new File([new Uint8Array(weightBytes).fill(7)], "weights.bin"));
  transfer.items.add(new File([tokenizer], "vocab.json", { type: "application/json" }));
  transfer.items.add(new File([bytes], "model.onnx"));
  const drop = document.getElementById("drop");
  drop.dispatchEvent(new DragEvent("dragover", { dataTransfer: transfer, bubbles: true, cancelable: true }));
  drop.dispatchEvent(new DragEvent("drop", { dataTransfer: transfer, bubbles: true, cancelable: true }));
}"""


def test_1_maintainer_uploads_with_progress_and_sees_the_version_ready(server, browser):
    mia = person("mia", Role.MAINTAINER)
    services.model_create(name="demo", description="sentence embeddings", tags=["nlp"], actor=mia)
    page = login(browser, server.url, "mia")
    page.goto(f"{server.url}/ui/models/demo")
    page.get_by_role("link", name="Upload a version").click()
    page.wait_for_url(f"{server.url}/ui/models/demo/upload")
    shoot(page, "upload-empty")

    model = add_model_bytes(bias=2.0)
    tokenizer = '{"vocab": {"hello": 1}}'
    weights = 3 * 1024 * 1024
    page.evaluate(DROP_FILES, [base64.b64encode(model).decode(), tokenizer, weights])
    names = page.locator(".filelist li")
    assert names.all_inner_texts()[0].startswith("model.onnx (model)")  # dropped last, sent first
    assert names.count() == 3
    page.fill("#id_description", "first cut")
    page.fill("#id_metadata", '{"run": "42"}')
    shoot(page, "upload-dropped")
    page.get_by_role("button", name="Upload").click()
    page.wait_for_url(f"{server.url}/ui/models/demo/versions/1", timeout=60_000)
    page.locator("#status .badge").filter(has_text="ready").wait_for()
    signature = page.locator("table.signature")
    assert "x" in signature.inner_text() and "FP32" in signature.inner_text() and "[-1, 4]" in signature.inner_text()
    assert page.get_by_role("status").first.inner_text() == "Version 1 uploaded."
    files = page.locator("#files tbody tr")
    assert files.count() == 3
    href = page.locator("#files a", has_text="vocab.json").get_attribute("href")
    download = page.request.get(f"{server.url}{href}")
    assert download.status == 200 and download.body() == tokenizer.encode()
    assert download.headers["x-content-sha256"] == hashlib.sha256(tokenizer.encode()).hexdigest()
    shoot(page, "version-ready")

    version = ModelVersion.objects.get(model__name="demo", version=1)
    assert (version.status, version.description, version.metadata) == ("ready", "first cut", {"run": "42"})
    assert [f.name for f in version.files.order_by("id")] == ["model.onnx", "weights.bin", "vocab.json"]
    assert version.size_bytes == len(model) + weights + len(tokenizer)
    assert csp_violations(page) == []


def test_1_an_upload_with_every_optional_field_left_empty_is_stored(server, browser):
    """The default path: only the model chosen, Description and Metadata left as the page shows them."""
    mia = person("mia", Role.MAINTAINER)
    services.model_create(name="demo", actor=mia)
    page = login(browser, server.url, "mia")
    page.goto(f"{server.url}/ui/models/demo/upload")
    page.set_input_files("#id_file", files=[{"name": "model.onnx", "mimeType": "", "buffer": add_model_bytes()}])
    assert page.input_value("#id_description") == "" and page.input_value("#id_metadata") == ""
    page.get_by_role("button", name="Upload").click()
    page.wait_for_url(f"{server.url}/ui/models/demo/versions/1", timeout=60_000)
    page.locator("#status .badge").filter(has_text="ready").wait_for()
    assert page.get_by_role("status").first.inner_text() == "Version 1 uploaded."
    version = ModelVersion.objects.get(model__name="demo", version=1)
    assert (version.status, version.description, version.metadata, version.tags) == ("ready", "", {}, [])
    assert csp_violations(page) == []


def test_1_a_maintainer_edits_a_versions_description_and_tags_then_clears_them(server, browser):
    mia = person("mia", Role.MAINTAINER)
    services.model_create(name="demo", actor=mia)
    upload("demo", mia)
    page = login(browser, server.url, "mia")
    page.goto(f"{server.url}/ui/models/demo/versions/1")
    assert page.locator("#version-tags").inner_text() == "—"
    page.locator("#version-edit summary").click()
    page.fill("#version-edit #id_description", "epoch 7, better recall")
    page.fill("#version-edit #id_tags", "candidate, run:42")
    page.locator("#version-edit").get_by_role("button", name="Save").click()
    page.wait_for_url(f"{server.url}/ui/models/demo/versions/1")
    assert page.get_by_role("status").first.inner_text() == "Version 1 saved."
    assert page.locator("#version-description").inner_text() == "epoch 7, better recall"
    assert page.locator("#version-tags .tag").all_inner_texts() == ["candidate", "run:42"]
    shoot(page, "version-edited")

    # Both fields are optional: emptied, they clear.
    page.locator("#version-edit summary").click()
    page.fill("#version-edit #id_description", "")
    page.fill("#version-edit #id_tags", "")
    page.locator("#version-edit").get_by_role("button", name="Save").click()
    page.wait_for_url(f"{server.url}/ui/models/demo/versions/1")
    assert page.get_by_role("status").first.inner_text() == "Version 1 saved."
    assert page.locator("#version-tags").inner_text() == "—"
    version = ModelVersion.objects.get(model__name="demo", version=1)
    assert (version.description, version.tags) == ("", [])
    changes = [(e.actor, e.before, e.after) for e in AuditEvent.objects.filter(action="version.update").order_by("seq")]
    assert changes == [
        (
            "mia",
            {"description": "", "tags": []},
            {"description": "epoch 7, better recall", "tags": ["candidate", "run:42"]},
        ),
        (
            "mia",
            {"description": "epoch 7, better recall", "tags": ["candidate", "run:42"]},
            {"description": "", "tags": []},
        ),
    ]
    assert csp_violations(page) == []


def test_1_progress_bar_moves_while_the_bytes_go(server, browser):
    person("max", Role.MAINTAINER)
    services.model_create(name="demo", actor=Actor(user=get_user_model().objects.get(username="max")))
    page = login(browser, server.url, "max")
    page.goto(f"{server.url}/ui/models/demo/upload")
    page.evaluate(DROP_FILES, [base64.b64encode(add_model_bytes()).decode(), "{}", 4 * 1024 * 1024])
    page.evaluate(PROGRESS_WATCH)
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": 2 * 1024 * 1024},
    )
    # Hold the navigation that follows the upload, so the recorded progress can be read.
    page.route(re.compile(r".*/versions/1$"), lambda route: route.abort())
    page.get_by_role("button", name="Upload").click()
    page.wait_for_function("() => window.progressSeen && window.progressSeen.some(([v, m]) => m > 1 && v >= m)")
    seen = page.evaluate("window.progressSeen")
    total = max(m for _, m in seen)
    partial = {v for v, m in seen if m == total and 0 < v < total}
    assert len(partial) >= 2, seen  # the bar moved through several values before it was full
    shoot(page, "upload-sent")


def test_1_a_version_still_validating_updates_its_page_by_itself(server, browser):
    mia = person("mia", Role.MAINTAINER)
    services.model_create(name="demo", actor=mia)
    version = upload("demo", mia)
    # As if a worker had not got to it yet.
    ModelVersion.objects.filter(pk=version.pk).update(status="pending", validation_attempts=0, signature={})
    page = login(browser, server.url, "mia")
    page.goto(f"{server.url}/ui/models/demo/versions/1")
    assert page.locator("#status .badge").inner_text() == "pending"
    assert page.locator("table.signature").inner_text().count("input") == 0
    tasks.validate_version(version.pk)  # the worker gets to it
    page.locator("#status .badge").filter(has_text="ready").wait_for()  # no reload by the test
    assert "[-1, 4]" in page.locator("table.signature").inner_text()


# --- 2 and 3. Request promotion; another approver reviews, confirms, and it serves ----------------------


def test_2_3_request_promotion_then_another_approver_approves_and_it_serves(server, browser):
    mia = person("mia", Role.MAINTAINER, Role.APPROVER)
    person("ana", Role.APPROVER)
    boss = person("boss", Role.APPROVER)
    services.model_create(name="demo", actor=mia)
    upload("demo", mia, bias=1.0)
    upload("demo", mia, bias=2.0)
    promote("demo", 1, mia, boss)
    _, inference_token = access.token_create(username="client", create_user=True, roles=[Role.INFERENCE])

    # 2. The maintainer asks for v2 on production, and cannot approve it.
    page = login(browser, server.url, "mia")
    page.goto(f"{server.url}/ui/models/demo")
    page.get_by_role("link", name="Request promotion").click()
    assert page.locator("#choose-version").input_value() == "2"
    assert "needs approval" in page.locator("#needs-approval").inner_text()
    assert "No breaking change" in page.locator("#compatible").inner_text()
    page.fill("#id_reason", "better recall on the eval set")
    shoot(page, "promote-request")
    page.get_by_role("button", name="Request promotion").click()
    promotion = PromotionRequest.objects.get(state="pending")
    page.wait_for_url(f"{server.url}/ui/promotions/{promotion.pk}")
    assert f"Promotion request {promotion.pk} opened" in page.get_by_role("status").first.inner_text()
    assert page.locator("#why-not").inner_text() == (
        "You requested this promotion; another approver must approve it. You can cancel it."
    )
    assert page.get_by_role("button", name="Approve").count() == 0

    # 3. The approver, in a second context, reviews the diff and approves after confirming.
    review = login(browser, server.url, "ana")
    review.goto(f"{server.url}/ui/promotions")
    review.locator(f"#pending tr[data-promotion='{promotion.pk}']").get_by_role("link", name="Review").click()
    review.wait_for_url(f"{server.url}/ui/promotions/{promotion.pk}")
    assert "better recall on the eval set" in review.locator("#request-summary").inner_text()
    assert review.locator("#signature-diff tbody tr").count() == 2  # x and y, unchanged
    assert review.locator(".version-card").count() == 2
    shoot(review, "promotion-review")
    review.fill("#id_reason", "eval numbers checked")
    review.get_by_role("button", name="Approve").click()
    message = review.locator("dialog#confirm [data-message]")
    assert "from v1 to v2" in message.inner_text() and "switch to it at once" in message.inner_text()
    shoot(review, "promotion-confirm")
    promotion.refresh_from_db()
    assert promotion.state == "pending"  # nothing happens before the confirmation
    confirm(review)
    expect(review.get_by_role("status")).to_have_text(f"Promotion request {promotion.pk} approved.")
    assert review.url == f"{server.url}/ui/promotions"
    promotion.refresh_from_db()
    assert (promotion.state, promotion.decided_by.username, promotion.decision_reason) == (
        "approved",
        "ana",
        "eval numbers checked",
    )

    # The fleet page shows v2 loaded under production, and /v2 answers with it (bias 2).
    def fleet_serves_v2() -> bool:
        review.goto(f"{server.url}/ui/fleet")
        row = review.locator("tbody[data-version='demo/2']")
        return row.count() == 1 and "production" in row.inner_text() and "ready" in row.inner_text()

    eventually(fleet_serves_v2, timeout=60, interval=0.5, what="v2 never shown loaded on the fleet page")
    answer = eventually(lambda: (r := infer(server, inference_token)).status_code == 200 and r, timeout=30)
    assert answer.json()["model_version"] == "2"
    assert answer.json()["outputs"][0]["data"] == [value + 2.0 for value in X[0]]
    # The request shows up in the version's traffic after the next heartbeat.
    for _ in range(4):
        infer(server, inference_token)

    def traffic_counted() -> bool:
        review.goto(f"{server.url}/ui/fleet")
        version = review.locator("tbody[data-version='demo/2']")
        return version.locator("[data-series='requests/s'] [data-peak]").inner_text() != "peak 0" and (
            version.locator("[data-series='p50'] [data-latest]").inner_text().endswith(" ms")
        )

    eventually(traffic_counted, timeout=30, interval=0.5, what="no traffic drawn for v2")
    shoot(review, "fleet")
    assert csp_violations(page) == [] and csp_violations(review) == []


# --- 4. A breaking version needs force and a reason; the approver sees it marked --------------------------


def test_4_breaking_version_needs_force_and_a_reason_and_the_approver_sees_it(server, browser):
    mia = person("mia", Role.MAINTAINER)
    boss = person("boss", Role.APPROVER)
    person("ana", Role.APPROVER)
    services.model_create(name="demo", actor=mia)
    upload("demo", mia)
    upload("demo", mia, width=5)
    promote("demo", 1, mia, boss)

    page = login(browser, server.url, "mia")
    page.goto(f"{server.url}/ui/models/demo/promote?alias=production&version=2")
    breaking = page.locator("#breaking")
    assert "input 'x': dimension 1 changed from 4 to 5" in breaking.inner_text()
    assert page.locator("#signature-diff tr.breaking").count() == 2  # x and y
    assert page.locator("#id_reason").get_attribute("required") is not None
    shoot(page, "promote-breaking")
    # Without force the registry refuses, and says why.
    page.fill("#id_reason", "new feature column")
    page.get_by_role("button", name="Request promotion").click()
    alert = page.locator(".flash.error[role=alert]").first
    expect(alert).to_contain_text("not compatible")
    assert "not compatible with version 1" in alert.inner_text()
    assert "Tick Force and give a reason to set it anyway." in alert.inner_text()
    assert not PromotionRequest.objects.filter(state="pending").exists()
    # With force and the reason it is requested.
    page.check("input[name=force]")
    page.fill("#id_reason", "new feature column; clients updated")
    page.get_by_role("button", name="Request promotion").click()
    promotion = eventually(lambda: PromotionRequest.objects.filter(state="pending").first())
    assert (promotion.force, promotion.reason) == (True, "new feature column; clients updated")

    review = login(browser, server.url, "ana")
    review.goto(f"{server.url}/ui/promotions/{promotion.pk}")
    assert "forced past breaking changes" in review.locator("#request-summary").inner_text()
    assert "input 'x': dimension 1 changed from 4 to 5" in review.locator("#breaking").inner_text()
    assert review.locator("#signature-diff tr.breaking .badge").first.inner_text() == "breaking"
    review.get_by_role("button", name="Approve").click()
    assert "It breaks clients" in review.locator("dialog#confirm [data-message]").inner_text()
    shoot(review, "promotion-review-breaking")
    review.locator("dialog#confirm button[value=no]").click()
    promotion.refresh_from_db()
    assert promotion.state == "pending"  # cancelled in the dialog: nothing was sent


# --- 5. Rollback, what served at, compare, tokens and a role grant; all audited and verified ----------------


def test_5_rollback_served_at_compare_tokens_and_roles_are_audited(server, browser):
    mia = person("mia", Role.MAINTAINER)
    boss = person("boss", Role.APPROVER)
    person("ada", Role.ADMIN)
    person("vic", Role.VIEWER)
    services.model_create(name="demo", actor=mia)
    upload("demo", mia, bias=1.0)
    upload("demo", mia, bias=2.0)
    promote("demo", 1, mia, boss)
    promote("demo", 2, mia, boss)
    # The first move an hour back, so that "what served at" has a time between the two.
    first, second = AliasMove.objects.order_by("id")
    AliasMove.objects.filter(pk=first.pk).update(moved_at=second.moved_at - timedelta(hours=1))
    between = second.moved_at - timedelta(minutes=30)
    zone = "Asia/Kolkata"  # the browser's own, not the server's (UTC)
    page = login(browser, server.url, "ada", timezone_id=zone)

    # What served at a time, entered in the viewer's local time.
    page.goto(f"{server.url}/ui/models/demo")
    local = between.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%dT%H:%M:%S")
    page.fill("#at", local)
    page.get_by_role("button", name="Show").click()
    result = page.locator("#served-at-result")
    assert re.search(r"production\s+v1", result.inner_text()), result.inner_text()
    assert "IST" in result.locator("thead time").inner_text() or "GMT+5:30" in result.locator("thead time").inner_text()

    # Rollback, after confirming.
    page.locator("tr[data-alias=production] input[name=reason]").fill("v2 regressed")
    page.locator("tr[data-alias=production]").get_by_role("button", name="Roll back").click()
    confirm(page)
    expect(page.get_by_role("status")).to_have_text("'production' rolled back to version 1.")
    assert "v1" in page.locator("tr[data-alias=production]").inner_text()
    shoot(page, "model")

    # Compare.
    page.get_by_role("link", name="Compare versions").click()
    assert page.locator("#signature-diff tbody tr").count() == 2
    assert "No breaking change" in page.locator("#compatible").inner_text()
    shoot(page, "compare")

    # Tokens: create, use, revoke, refused.
    page.goto(f"{server.url}/ui/tokens")
    page.fill("#id_name", "ci")
    page.fill("#id_expires_days", "30")
    page.get_by_role("button", name="Create token").click()
    secret = page.locator("#token-secret").inner_text().strip()
    shoot(page, "tokens")
    api = f"{server.url}/api/v1/models/demo"
    assert requests.get(api, headers={"Authorization": f"Bearer {secret}"}, timeout=30).status_code == 200
    prefix = secret.split("_")[1]
    page.goto(f"{server.url}/ui/tokens")
    assert page.locator("#token-secret").count() == 0  # shown once
    page.locator(f"tr[data-token='{prefix}']").get_by_role("button", name="Revoke").click()
    confirm(page)
    expect(page.get_by_role("status")).to_have_text(f"Token {prefix} revoked; it no longer authenticates.")
    assert "revoked" in page.locator(f"tr[data-token='{prefix}']").inner_text()
    refused = requests.get(api, headers={"Authorization": f"Bearer {secret}"}, timeout=30)
    assert refused.status_code == 401 and refused.json()["error"] == "invalid or revoked API token"

    # A role grant.
    page.get_by_role("link", name="Users").click()
    vic = page.locator("tr[data-user=vic]")
    vic.locator("input[value=maintainer]").check()
    vic.get_by_role("button", name="Save").click()
    confirm(page)
    expect(page.get_by_role("status")).to_have_text("User 'vic' saved.")
    assert get_user_model().objects.get(username="vic").groups.filter(name="maintainer").exists()
    shoot(page, "users")

    # The audit page shows each step, and the chain verifies.
    page.get_by_role("link", name="Audit").click()
    page.get_by_role("button", name="Verify chain").click()
    verified = page.locator("#verify-result")
    assert "verified" in verified.inner_text() and "chain ok" in verified.inner_text()
    last = AuditEvent.objects.order_by("-seq").values_list("seq", flat=True)[0]
    assert f"verified up to #{last}" in verified.inner_text()
    events = page.locator("#events tbody").inner_text()
    for action in ("alias.rollback", "token.create", "token.revoke", "user.roles.grant", "auth.failed"):
        assert action in events, action
    shoot(page, "audit")
    grant = AuditEvent.objects.filter(action="user.roles.grant", target="vic").latest("seq")
    assert (grant.actor, grant.after) == ("ada", {"roles": ["maintainer"]})
    assert csp_violations(page) == []


# --- 6. At 375 px no page scrolls sideways; screenshots of every page at both widths ------------------------


def test_6_no_page_scrolls_sideways_on_a_phone(server, browser):
    mia = person("mia", Role.MAINTAINER, Role.APPROVER)
    person("ada", Role.ADMIN)
    boss = person("boss", Role.APPROVER)
    services.model_create(
        name="sentence-embeddings-multilingual-large",
        description="A long description " * 12,
        tags=["nlp", "embeddings", "multilingual"],
        actor=mia,
    )
    name = "sentence-embeddings-multilingual-large"
    upload(name, mia, bias=1.0)
    upload(name, mia, width=5)
    promote(name, 1, mia, boss)
    promotions.alias_set(
        model=RegisteredModel.objects.get(name=name),
        alias_name=PRODUCTION,
        version_number=2,
        actor=mia,
        reason="a reason long enough to wrap " * 5,
        force=True,
    )
    pending = PromotionRequest.objects.get(state="pending")
    access.token_create(username="ada", name="a-token-with-a-long-name-for-the-table", actor=mia)
    pages = {
        "models": "/ui/",
        "model": f"/ui/models/{name}",
        "version": f"/ui/models/{name}/versions/2",
        "upload": f"/ui/models/{name}/upload",
        "compare": f"/ui/models/{name}/compare?a=1&b=2",
        "promote": f"/ui/models/{name}/promote?alias=production&version=2",
        "promotions": "/ui/promotions",
        "review": f"/ui/promotions/{pending.pk}",
        "audit": "/ui/audit?verify=1",
        "fleet": "/ui/fleet",
        "tokens": "/ui/tokens",
        "users": "/ui/users",
        "password": "/accounts/password_change/",
        "not-found": "/ui/models/nope",
        "wrong-method": f"/ui/promotions/{pending.pk}/approve",
    }
    page = login(browser, server.url, "ada")
    eventually(InferenceWorker.objects.exists, timeout=30, what="the server's runtime never reported")
    wide: dict[str, int] = {}
    for width, size in (("laptop", LAPTOP), ("phone", PHONE)):
        page.set_viewport_size(size)
        for label, path in pages.items():
            page.goto(f"{server.url}{path}")
            scroll = page.evaluate("document.documentElement.scrollWidth")
            if width == "phone" and scroll > PHONE["width"]:
                wide[label] = scroll
            shoot(page, f"{width}-{label}")
    assert wide == {}, f"pages wider than {PHONE['width']} px: {wide}"
    anonymous = browser.new_context(viewport=PHONE)
    login_page = anonymous.new_page()
    login_page.goto(f"{server.url}/accounts/login/")
    assert login_page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shoot(login_page, "phone-login")
    anonymous.close()
    assert csp_violations(page) == []


# --- 7. A viewer sees no write controls, and posting the forms anyway is refused and audited -----------------


def test_7_viewer_sees_no_write_controls_and_direct_posts_are_refused_and_audited(server, browser):
    mia = person("mia", Role.MAINTAINER)
    boss = person("boss", Role.APPROVER)
    person("vic", Role.VIEWER)
    services.model_create(name="demo", actor=mia)
    upload("demo", mia, bias=1.0)
    upload("demo", mia, bias=2.0)
    promote("demo", 1, mia, boss)
    promotion = promotions.alias_set(
        model=RegisteredModel.objects.get(name="demo"), alias_name=PRODUCTION, version_number=2, actor=mia
    ).promotion
    assert promotion is not None

    page = login(browser, server.url, "vic")
    nav = page.locator("header nav").inner_text()
    assert "Audit" not in nav and "Users" not in nav
    page.goto(f"{server.url}/ui/models/demo")
    for control in ("Upload a version", "Request promotion"):
        assert page.get_by_role("link", name=control).count() == 0
    assert page.get_by_role("button", name="Roll back").count() == 0
    assert page.locator("form[action='/ui/models/demo']").count() == 0  # no edit form
    page.goto(f"{server.url}/ui/")
    assert page.locator("#new-model").count() == 0
    page.goto(f"{server.url}/ui/models/demo/upload")
    assert page.locator("#upload-form").count() == 0
    page.goto(f"{server.url}/ui/models/demo/promote?version=2")
    assert page.locator("form#request").count() == 0
    page.goto(f"{server.url}/ui/promotions/{promotion.pk}")
    assert page.get_by_role("button", name="Approve").count() == 0
    assert page.locator("#why-not").inner_text() == "Approving and rejecting need the approver role."
    shoot(page, "viewer-review")

    token = csrf_token(page)
    forms: list[tuple[str, dict[str, Any]]] = [
        ("/ui/", {"name": "sneaky"}),
        ("/ui/models/demo", {"description": "defaced"}),
        ("/ui/models/demo/aliases/production/rollback", {"reason": "x"}),
        ("/ui/models/demo/promote", {"alias": "production", "version": "2", "reason": "x"}),
        (f"/ui/promotions/{promotion.pk}/approve", {"reason": "x"}),
        (f"/ui/promotions/{promotion.pk}/reject", {"reason": "x"}),
        ("/ui/users", {"username": "mallory", "roles": "admin"}),
        ("/ui/users/vic", {"roles": "admin", "is_active": "on"}),
        ("/ui/users/mia/password-link", {}),
    ]
    before = AuditEvent.objects.filter(action="access.denied").count()
    headers = {"Referer": f"{server.url}/ui/", "X-CSRFToken": token}
    for path, data in forms:
        response = page.request.post(
            f"{server.url}{path}", form={**data, "csrfmiddlewaretoken": token}, headers=headers
        )
        assert response.status == 403, (path, response.status, response.text()[:300])
        assert "text/html" in response.headers["content-type"], path
    refused = page.request.post(
        f"{server.url}/ui/models/demo/upload",
        multipart={"file": {"name": "model.onnx", "mimeType": "application/octet-stream", "buffer": add_model_bytes()}},
        headers=headers,
    )
    assert refused.status == 403
    assert json.loads(refused.text()) == {"error": "uploading a version needs the maintainer role", "detail": None}
    denied = AuditEvent.objects.filter(action="access.denied").order_by("seq")[before:]
    assert [(e.actor, e.after["path"]) for e in denied] == [("vic", path) for path, _ in forms] + [
        ("vic", "/ui/models/demo/upload")
    ]
    # Nothing changed.
    assert not RegisteredModel.objects.filter(name="sneaky").exists()
    assert RegisteredModel.objects.get(name="demo").description == ""
    assert ModelVersion.objects.filter(model__name="demo").count() == 2
    promotion.refresh_from_db()
    assert promotion.state == "pending"
    assert not get_user_model().objects.filter(username="mallory").exists()
    assert not get_user_model().objects.get(username="vic").groups.filter(name="admin").exists()
    assert csp_violations(page) == []


def test_error_pages_are_html_in_the_ui_and_json_in_the_api(server, browser):
    person("vic", Role.VIEWER)
    page = login(browser, server.url, "vic")
    response = page.goto(f"{server.url}/ui/models/nope")
    assert response.status == 404 and "There is nothing at /ui/models/nope" in page.locator("[role=alert]").inner_text()
    response = page.goto(f"{server.url}/ui/audit")
    assert response.status == 403 and "needs the auditor or admin role" in page.locator("[role=alert]").inner_text()
    assert page.locator("header nav").get_by_role("link", name="Models").count() == 1
    response = page.goto(f"{server.url}/accounts/logout/")
    assert response.status == 405 and "use the form on its page" in page.locator("[role=alert]").inner_text()
    assert response.headers["allow"] == "POST, OPTIONS"
    api = page.request.get(f"{server.url}/api/v1/models/nope")
    assert api.status == 404 and api.json()["error"]
    headers = page.goto(f"{server.url}/ui/").headers
    policy = headers["content-security-policy"]
    assert "script-src 'self'" in policy and "style-src 'self'" in policy and "unsafe-inline" not in policy


# --- 8. The fleet on a phone: rows become cards, charts have axes, a host's notice is said once ---------------

# Every element of the page that is drawn: where it lies past either edge of the viewport, or what a box that
# scrolls or clips sideways hides. Hidden elements (clipped, as a table's header is on a phone, or put wholly
# off the left edge, as the skip link is until it has the focus) do not count.
CUT_OFF = """() => {
  const width = document.documentElement.clientWidth;
  const name = (el) => el.tagName.toLowerCase() + (el.id ? `#${el.id}` : "") +
    (el.className && typeof el.className === "string" ? `.${el.className.trim().split(/\\s+/).join(".")}` : "");
  const hidden = (el) => {
    for (let at = el; at; at = at.parentElement) if (getComputedStyle(at).clipPath !== "none") return true;
    return false;
  };
  const cut = [];
  for (const el of document.querySelectorAll("body *")) {
    const box = el.getBoundingClientRect();
    if ((!box.width && !box.height) || box.right <= 0 || hidden(el)) continue;
    if (box.left < -0.5 || box.right > width + 0.5) cut.push(`${name(el)} spans ${box.left}..${box.right} of ${width}`);
    const style = getComputedStyle(el);
    if (["auto", "scroll", "hidden"].includes(style.overflowX) && el.scrollWidth > el.clientWidth + 1) {
      cut.push(`${name(el)} hides ${el.scrollWidth - el.clientWidth} px sideways`);
    }
  }
  return cut;
}"""

NO_CUDA = (
    "this ONNX Runtime build has no CUDA provider (onnxruntime 1.0, the CPU wheel, is installed; install "
    "modelyard[gpu])"
)


def test_8_the_fleet_fits_a_phone_with_nothing_cut_off_and_its_charts_have_axes(server, browser):
    person("vic", Role.VIEWER)
    now = timezone.now().timestamp() // 10 * 10
    traffic = tuple(
        TrafficBucket(start=now - 10 * i, seconds=10, requests=40 + i, errors=i % 3, p50_ms=4.2 + i, p99_ms=19.0 + i)
        for i in range(1, 12)
    )
    row = LoadedRow(
        model="sentence-embeddings-multilingual-large",
        version=12,
        state=LoadState.READY,
        aliases=("production", "canary-eu-west"),
        provider="CPUExecutionProvider",
        note=f"{NO_CUDA}; CUDA graphs are off for this model: input_ids, attention_mask have dynamic dimensions",
        load_seconds=1.234,
        memory_bytes=512 * 2**20,
        instances=2,
        traffic=traffic,
    )
    for worker_id in ("inference-cpu-node-with-a-long-name-0001", "inference-cpu-node-with-a-long-name-0002"):
        serving.worker_heartbeat(
            WorkerReport(
                worker_id=worker_id,
                host="cpu-node-17.inference.example.internal",
                pid=4242,
                device="cpu (no CUDA in this ONNX Runtime build)",
                provider="CPUExecutionProvider",
                started_at=timezone.now(),
                loaded=(row,),
                notice=NO_CUDA,
            )
        )
    page = login(browser, server.url, "vic")
    page.set_viewport_size(PHONE)
    page.goto(f"{server.url}/ui/fleet")
    host = page.locator("section.host[data-host='cpu-node-17.inference.example.internal']")
    notice = host.locator("[data-notice]")
    assert notice.count() == 1 and "no CUDA provider" in notice.inner_text()
    assert "no CUDA provider" not in host.locator("table.loaded").first.inner_text()  # said once, not per row
    cells = host.locator("table.loaded").first.locator("tbody tr").first.locator("td")
    assert cells.evaluate_all("tds => tds.map(td => getComputedStyle(td).display)") == ["block"] * 4  # a card
    chart = host.locator("[data-series='p99']").first
    assert chart.locator("text.unit").text_content() == "ms"
    assert chart.locator("text.y").all_text_contents() == ["0", "15", "30"]  # 19..30 ms: the axis ends at 30
    assert chart.locator("text.x").all_text_contents() == [f"{MINUS}{n} min" for n in (4, 3, 2, 1)] + ["now"]
    shoot(page, "phone-fleet-cards")
    assert page.evaluate(CUT_OFF) == []
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert csp_violations(page) == []


# --- 9. Sortable columns on the models, versions and audit pages ----------------------------------------------


def column(page: Any, table: str, index: int) -> list[str]:
    return page.eval_on_selector_all(f"#{table} tbody tr", f"rows => rows.map(r => r.cells[{index}].innerText.trim())")


def sort_by(page: Any, table: str, header: str) -> str:
    """Click a column's header; return its aria-sort afterwards."""
    cell = page.locator(f"#{table} thead th", has_text=header)
    cell.get_by_role("button").click()
    return cell.get_attribute("aria-sort")


def test_9_the_models_versions_and_audit_tables_sort_by_a_column(server, browser):
    mia = person("mia", Role.MAINTAINER, Role.AUDITOR)
    boss = person("boss", Role.APPROVER)
    for name in ("beta", "alpha", "gamma"):
        services.model_create(name=name, actor=mia)
    upload("alpha", mia)
    for width in (8, 4, 16):
        upload("beta", mia, width=width)
    promote("beta", 1, mia, boss)
    page = login(browser, server.url, "mia")

    page.goto(f"{server.url}/ui/")
    assert column(page, "models", 0) == ["alpha", "beta", "gamma"]  # the server's order: by name
    assert sort_by(page, "models", "Name") == "descending"
    assert column(page, "models", 0) == ["gamma", "beta", "alpha"]
    assert sort_by(page, "models", "Latest") == "ascending"
    assert column(page, "models", 0) == ["gamma", "alpha", "beta"]  # none, v1, v3
    assert page.locator("#models thead th", has_text="Name").get_attribute("aria-sort") == "none"

    page.goto(f"{server.url}/ui/models/beta")
    assert column(page, "versions", 0) == ["v3", "v2", "v1"]
    assert sort_by(page, "versions", "Size") == "ascending"
    by_size = ModelVersion.objects.filter(model__name="beta").order_by("size_bytes")
    assert column(page, "versions", 0) == [f"v{v.version}" for v in by_size]
    assert sort_by(page, "versions", "Size") == "descending"
    assert column(page, "versions", 0) == [f"v{v.version}" for v in reversed(by_size)]
    assert sort_by(page, "versions", "Version") == "ascending"
    assert column(page, "versions", 0) == ["v1", "v2", "v3"]

    page.goto(f"{server.url}/ui/audit")
    seqs = [int(seq) for seq in column(page, "events", 0)]
    assert seqs == sorted(seqs, reverse=True)
    assert sort_by(page, "events", "Actor") == "ascending"
    actors = column(page, "events", 2)
    assert actors == sorted(actors, key=str.lower) and {"mia", "boss"} <= set(actors)
    assert sort_by(page, "events", "#") == "ascending"
    assert [int(seq) for seq in column(page, "events", 0)] == sorted(seqs)
    shoot(page, "audit-sorted")
    assert csp_violations(page) == []


# --- 10. Copy buttons for digests, tokens and URLs ---------------------------------------------------------------


def copy(page: Any, label: str) -> str:
    """Click the Copy button labelled ``Copy <label>``; return what the clipboard then holds."""
    button = page.get_by_role("button", name=f"Copy {label}", exact=True)
    button.click()
    expect(button).to_have_text("Copied")
    return page.evaluate("navigator.clipboard.readText()")


def test_10_copy_buttons_copy_digests_tokens_and_urls(server, browser):
    mia = person("mia", Role.MAINTAINER, Role.AUDITOR)
    services.model_create(name="demo", actor=mia)
    version = upload("demo", mia)
    page = login(browser, server.url, "mia", permissions=["clipboard-read", "clipboard-write"])

    page.goto(f"{server.url}/ui/models/demo/versions/1")
    assert copy(page, "the sha256") == version.sha256
    model_file = version.files.get()
    assert copy(page, "the sha256 of model.onnx") == model_file.sha256
    assert copy(page, "the inference URL") == f"{server.url}/v2/models/demo/versions/1/infer"
    download = copy(page, "the download URL of model.onnx")
    assert download == f"{server.url}/api/v1/models/demo/versions/1/download?file=model.onnx"

    page.goto(f"{server.url}/ui/models/demo")
    assert copy(page, "the sha256 of v1") == version.sha256
    assert copy(page, "the inference URL") == f"{server.url}/v2/models/demo/infer"

    page.goto(f"{server.url}/ui/tokens")
    page.fill("#id_name", "ci")
    page.get_by_role("button", name="Create token").click()
    secret = page.locator("#token-secret").inner_text()
    assert secret.startswith("my_") and copy(page, "the token") == secret

    page.goto(f"{server.url}/ui/audit?action=version.upload")
    event = AuditEvent.objects.get(action="version.upload")
    page.locator("#events details summary").first.click()
    assert copy(page, f"the hash of event {event.seq}") == event.hash
    assert csp_violations(page) == []
