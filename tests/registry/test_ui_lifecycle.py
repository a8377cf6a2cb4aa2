"""A version's life after release in the web UI (issue 27): archive, legal hold, delete with a confirmation
page that names what goes, the model page's lifecycle filter, deleting a model, and retention settings.

Each form is read from the page as a browser renders it and sent with only what it requires (every other
box present and empty). Deleting is two-phase: the files are removed after the commit, which runs here
only inside ``captureOnCommitCallbacks(execute=True)``, as a server's would.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, TestCase
from django.utils import timezone
from django.utils.html import escape

from registry.lifecycle import services as lifecycle
from registry.models import AuditEvent, ModelVersion, RegisteredModel, Role
from registry.ui.forms import RETENTION_BOTH
from tests.support.html_forms import Form, browser_fields, post_forms
from tests.support.people import Person, login_person
from tests.support.registry import artifact_path, create_model, set_alias, upload_versions
from tests.support.uploads import stored_keys

pytestmark = pytest.mark.django_db

MODEL_PAGE = "/ui/models/demo"
V1 = "/ui/models/demo/versions/1"
RETENTION = "/ui/models/demo/retention"
LIFECYCLE_ROUTES = ("/archive", "/unarchive", "/hold", "/hold/release", "/delete")


@pytest.fixture
def ada() -> Person:
    return login_person("ada", Role.ADMIN)


@pytest.fixture
def aud() -> Person:
    return login_person("aud", Role.AUDITOR)


@pytest.fixture
def three(mia: Person) -> list[ModelVersion]:
    """demo with three ready versions that nothing uses."""
    create_model(mia)
    return upload_versions(mia, [1.0, 2.0, 3.0])


def html_of(person: Person, path: str, status: int = 200) -> str:
    response = person.client.get(path)
    assert response.status_code == status, (path, response.status_code, response.content[:800])
    return str(response.content.decode())


def forms_to(html: str, page: str, address: str) -> list[Form]:
    return [form for form in post_forms(html, page) if any(target == address for target, _ in form.targets())]


def send(person: Person, form: Form, fill: dict[str, Any], *, to: str = "", commit: bool = False) -> Any:
    """Submit ``form`` as a browser does with only ``fill`` filled in (by the button that posts to ``to``)."""
    targets = [(address, button) for address, button in form.targets() if not to or address == to]
    assert len(targets) == 1, (to, form.targets())
    address, button = targets[0]
    body = urlencode(browser_fields(form, button, fill))
    if not commit:
        return person.client.post(address, body, content_type="application/x-www-form-urlencoded")
    with TestCase.captureOnCommitCallbacks(execute=True):
        return person.client.post(address, body, content_type="application/x-www-form-urlencoded")


def lifecycle_controls(html: str, page: str) -> list[str]:
    """What the version page offers its viewer: the lifecycle forms' addresses, and the delete link."""
    controls = sorted(
        target.removeprefix(page)
        for form in post_forms(html, page)
        for target, _ in form.targets()
        if target.removeprefix(page) in LIFECYCLE_ROUTES
    )
    if f'href="{page}/delete"' in html:
        controls.append("delete link")
    return controls


def version(number: int) -> ModelVersion:
    return ModelVersion.objects.select_related("model").get(model__name="demo", version=number)


def flash(html: str, message: str) -> bool:
    return escape(message) in html


def alert(message: str) -> str:
    return f'<div class="flash error" role="alert">{escape(message)}</div>'


# --- Who sees which controls ---------------------------------------------------------------------------


def test_each_role_sees_exactly_its_lifecycle_controls(mia, ada, aud, vic, ana, three):
    seen = {person.username: lifecycle_controls(html_of(person, V1), V1) for person in (mia, ada, aud, vic, ana)}

    assert seen == {
        "mia": ["/archive"],
        "ada": ["/archive", "/hold", "delete link"],  # an admin holds every role
        "aud": ["/hold"],
        "vic": [],
        "ana": [],
    }
    html = html_of(vic, V1)
    assert '<div class="box" id="lifecycle" data-lifecycle="active" data-held="false">' in html
    assert "Listed, and it can be promoted, shadowed and rolled out." in html


def test_a_version_in_use_offers_no_archive_button_and_says_why(mia, three):
    assert set_alias(mia, "staging", 1).status_code == 200

    html = html_of(mia, V1)

    assert lifecycle_controls(html, V1) == []
    assert "It cannot be archived now: alias &#x27;staging&#x27; points at it." in html
    refused = mia.client.post(f"{V1}/archive", {"reason": ""})
    assert refused.status_code == 409
    assert alert("version 1 of model 'demo' cannot be archived: alias 'staging' points at it") in (
        refused.content.decode()
    )
    assert version(1).archived_at is None


# --- Archive ---------------------------------------------------------------------------------------------


def test_archive_sent_with_the_reason_empty_hides_the_version_and_unarchive_brings_it_back(mia, three):
    (form,) = forms_to(html_of(mia, V1), V1, f"{V1}/archive")

    response = send(mia, form, {})

    assert (response.status_code, response["Location"]) == (302, V1)
    archived = version(1)
    assert (archived.lifecycle, archived.archived_by.username) == ("archived", "mia")
    event = AuditEvent.objects.get(action="version.archive")
    assert (event.actor, event.target, event.after) == ("mia", "demo/1", {"reason": ""})
    html = html_of(mia, V1)
    assert flash(html, "Version 1 archived: hidden from the list of versions and from promotion; its files are kept.")
    assert '<p id="archived"><span class="badge warn">archived</span>' in html
    assert "Request promotion</a>" not in html
    assert 'href="/api/v1/models/demo/versions/1/download?file=model.onnx"' in html  # its bytes stay

    # The model page lists it only when archived versions are asked for, marked as such.
    listed = html_of(mia, MODEL_PAGE)
    assert re.findall(r'<tr data-version="(\d+)" data-lifecycle="(\w+)">', listed) == [
        ("3", "active"),
        ("2", "active"),
    ]
    assert '<a href="?lifecycle=archived#versions-filter" data-lifecycle-filter="archived">archived (1)</a>' in listed
    archived_list = html_of(mia, f"{MODEL_PAGE}?lifecycle=archived")
    assert re.findall(r'<tr data-version="(\d+)" data-lifecycle="(\w+)">', archived_list) == [("1", "archived")]
    assert '>v1</a> <span class="badge warn">archived</span>' in archived_list
    # It is not offered for promotion.
    promote = html_of(mia, "/ui/models/demo/promote")
    assert re.findall(r'<option value="(\d+)"', promote.split('name="version"', 1)[1].split("</select>", 1)[0]) == [
        "3",
        "2",
    ]

    (back,) = forms_to(html, V1, f"{V1}/unarchive")
    response = send(mia, back, {})

    assert (response.status_code, response["Location"]) == (302, V1)
    assert version(1).lifecycle == "active"
    assert AuditEvent.objects.get(action="version.unarchive").actor == "mia"
    assert flash(html_of(mia, V1), "Version 1 unarchived: listed again, and it can be promoted.")


def test_the_model_page_shows_all_or_refuses_an_unknown_filter(mia, three):
    lifecycle.version_archive(version=version(2), actor=mia.actor)

    everything = html_of(mia, f"{MODEL_PAGE}?lifecycle=all")
    assert re.findall(r'<tr data-version="(\d+)" data-lifecycle="(\w+)">', everything) == [
        ("3", "active"),
        ("2", "archived"),
        ("1", "active"),
    ]
    assert '<strong aria-current="true" data-lifecycle-filter="all">all (3)</strong>' in everything
    nothing = html_of(mia, f"{MODEL_PAGE}?lifecycle=deleted")
    assert "No deleted versions." in nothing

    refused = mia.client.get(f"{MODEL_PAGE}?lifecycle=gone")
    assert refused.status_code == 400
    assert alert("lifecycle must be one of active, archived, deleted, all, not 'gone'") in refused.content.decode()


# --- Legal hold ------------------------------------------------------------------------------------------


def test_an_auditor_places_and_releases_a_hold_with_a_reason(aud, three):
    (form,) = forms_to(html_of(aud, V1), V1, f"{V1}/hold")

    response = send(aud, form, {"reason": "case 2026-17"})

    assert (response.status_code, response["Location"]) == (302, V1)
    held = version(1)
    assert (held.held_by.username, held.hold_reason) == ("aud", "case 2026-17")
    event = AuditEvent.objects.get(action="version.hold")
    assert (event.actor, event.target, event.after) == ("aud", "demo/1", {"reason": "case 2026-17"})
    html = html_of(aud, V1)
    assert flash(
        html, "Version 1 is under legal hold: nobody and no retention rule can delete it until it is released."
    )
    assert re.search(
        r'<p id="hold"><span class="badge warn">legal hold</span>\s+by <strong>aud</strong> since\s+<time', html
    )
    assert '<span class="wrap" data-hold-reason>case 2026-17</span>' in html
    assert lifecycle_controls(html, V1) == ["/hold/release"]
    assert '<span class="badge warn" title="case 2026-17">legal hold</span>' in html_of(aud, MODEL_PAGE)

    (release,) = forms_to(html, V1, f"{V1}/hold/release")
    response = send(aud, release, {"reason": "case closed"})

    assert response.status_code == 302
    assert version(1).held_at is None
    event = AuditEvent.objects.get(action="version.release")
    assert (event.actor, event.after["reason"], event.before["reason"]) == ("aud", "case closed", "case 2026-17")


def test_a_hold_without_a_reason_is_refused_with_the_services_words(aud, three):
    response = aud.client.post(f"{V1}/hold", {"reason": "  "})

    assert response.status_code == 400
    assert alert("a legal hold needs a reason") in response.content.decode()
    assert version(1).held_at is None


# --- Refused for lack of a role ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "path", "message"),
    [
        ("vic", "/archive", "archiving or unarchiving a version needs the maintainer or admin role"),
        ("vic", "/unarchive", "archiving or unarchiving a version needs the maintainer or admin role"),
        ("mia", "/hold", "placing or releasing a legal hold needs the admin or auditor role"),
        ("mia", "/hold/release", "placing or releasing a legal hold needs the admin or auditor role"),
        ("aud", "/delete", "deleting a version needs the admin role"),
        ("mia", "/delete", "deleting a version needs the admin role"),
    ],
)
def test_a_post_without_the_role_is_refused_403_and_audited(mia, aud, vic, three, who, path, message):
    person = {"mia": mia, "aud": aud, "vic": vic}[who]

    response = person.client.post(f"{V1}{path}", {"reason": "because"})

    assert response.status_code == 403
    assert alert(message) in response.content.decode()
    denied = AuditEvent.objects.get(action="access.denied")
    assert (denied.actor, denied.target) == (who, f"POST {V1}{path}")
    after = version(1)
    assert (after.archived_at, after.held_at, after.deleted_at) == (None, None, None)


def test_the_delete_page_is_for_admins_only(mia, three):
    response = mia.client.get(f"{V1}/delete")

    assert response.status_code == 403
    assert alert("deleting a version needs the admin role") in response.content.decode()
    assert AuditEvent.objects.get(action="access.denied").target == f"GET {V1}/delete"


def test_the_csrf_check_guards_every_lifecycle_form(ada, three):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(get_user_model().objects.get(username="ada"))
    for path in LIFECYCLE_ROUTES:
        assert strict.post(f"{V1}{path}", {"reason": "x"}).status_code == 403, path
    assert strict.post(f"{RETENTION}", {}).status_code == 403
    assert strict.post(f"{RETENTION}/preview", {}).status_code == 403
    assert strict.post(f"{MODEL_PAGE}/delete", {"reason": "x"}).status_code == 403
    after = version(1)
    assert (after.archived_at, after.held_at, after.deleted_at) == (None, None, None)


# --- Deleting a version -------------------------------------------------------------------------------


def test_the_confirmation_names_each_file_the_bundles_and_the_total(ada, three):
    html = html_of(ada, V1)
    assert '<a class="button danger" id="delete-version" href="/ui/models/demo/versions/1/delete">' in html

    page = html_of(ada, f"{V1}/delete")

    v1 = version(1)
    (model_file,) = v1.files.all()
    assert f'<tr data-file="{model_file.name}">' in page
    assert f"({model_file.size_bytes} bytes)" in page
    assert f'<td class="mono small wrap">{model_file.sha256}</td>' in page
    (bundle,) = v1.signatures.all()
    assert f'<tr data-signature="{bundle.kind}">' in page and bundle.sha256 in page
    total = sum(f.size_bytes for f in v1.files.all())
    assert f'id="delete-total" data-bytes="{total}"' in page
    assert "Total: 1 file and 1 signature bundle" in page
    assert "stays as a <strong>tombstone</strong>" in page
    assert "the number 1 is never given to another version of demo" in page
    (form,) = forms_to(page, f"{V1}/delete", f"{V1}/delete")
    assert [c.name for c in form.controls if c.required] == ["reason"]


def test_the_confirmation_lists_each_refusal_and_offers_no_button(ada, aud, three):
    assert set_alias(ada, "staging", 1).status_code == 200
    lifecycle.version_hold(version=version(1), actor=aud.actor, reason="case 9")

    page = html_of(ada, f"{V1}/delete")

    assert "Version 1 cannot be deleted now:" in page
    reasons = re.findall(r'<li class="wrap">([^<]+)</li>', page)
    assert len(reasons) == 2
    assert reasons[0].startswith("it is under legal hold (by aud since ") and reasons[0].endswith(": case 9)")
    assert reasons[1] == "alias &#x27;staging&#x27; points at it"
    assert not forms_to(page, f"{V1}/delete", f"{V1}/delete")

    refused = ada.client.post(f"{V1}/delete", {"reason": "clean up"})
    assert refused.status_code == 409
    assert "version 1 of model &#x27;demo&#x27; cannot be deleted: it is under legal hold" in refused.content.decode()
    assert version(1).deleted_at is None


def test_deleting_without_a_reason_is_refused_with_the_services_words(ada, three):
    (form,) = forms_to(html_of(ada, f"{V1}/delete"), f"{V1}/delete", f"{V1}/delete")

    response = send(ada, form, {"reason": ""})

    assert response.status_code == 400
    assert alert("deleting a version needs a reason") in response.content.decode()
    assert version(1).deleted_at is None


def test_a_delete_removes_the_bytes_and_leaves_the_tombstone_page(ada, three):
    v1 = version(1)
    stored = artifact_path(v1)
    bundle_keys = list(v1.signatures.values_list("storage_key", flat=True))
    assert stored.exists() and set(bundle_keys) <= set(stored_keys())
    (form,) = forms_to(html_of(ada, f"{V1}/delete"), f"{V1}/delete", f"{V1}/delete")

    response = send(ada, form, {"reason": "superseded by v3"}, commit=True)

    assert (response.status_code, response["Location"]) == (302, V1)
    assert not stored.exists()
    assert not set(bundle_keys) & set(stored_keys())
    tombstone = version(1)
    assert (tombstone.lifecycle, tombstone.deleted_by.username, tombstone.delete_reason) == (
        "deleted",
        "ada",
        "superseded by v3",
    )
    assert tombstone.purged_at is not None
    deleted = AuditEvent.objects.get(action="version.delete")
    assert (deleted.actor, deleted.target, deleted.after["reason"]) == ("ada", "demo/1", "superseded by v3")
    assert AuditEvent.objects.get(action="version.purge").after == {"objects_removed": 2}

    html = html_of(ada, V1)
    assert flash(html, "Version 1 deleted. Its files are removed from the store; its row stays as a tombstone")
    assert '<div class="box" id="lifecycle" data-lifecycle="deleted" data-held="false">' in html
    assert "<strong>This version is a tombstone.</strong>" in html
    assert '<span class="wrap" data-delete-reason>superseded by v3</span>' in html
    assert '<p id="purge" data-purged="true">Its files and signature bundles were removed from the store' in html
    assert tombstone.sha256 in html  # the row keeps its digests
    assert "/download" not in html and "modelyard pull" not in html
    assert 'model.onnx <span class="muted small">(deleted)</span>' in html
    assert lifecycle_controls(html, V1) == []
    assert "Request promotion</a>" not in html

    listed = html_of(ada, MODEL_PAGE)
    assert [n for n, _ in re.findall(r'<tr data-version="(\d+)" data-lifecycle="(\w+)">', listed)] == ["3", "2"]
    tombstones = html_of(ada, f"{MODEL_PAGE}?lifecycle=deleted")
    marked = '>v1</a> <span class="badge bad" title="deleted: its row is kept, its files are gone">deleted (tombstone)'
    assert marked in tombstones


def test_a_tombstone_whose_files_are_not_removed_yet_says_so(ada, three):
    lifecycle.version_delete(version=version(1), actor=ada.actor, reason="gone")  # nothing runs after the commit

    html = html_of(ada, V1)

    assert '<p id="purge" data-purged="false">Its files are <strong>not removed from the store yet</strong>' in html
    assert artifact_path(version(1)).exists()


# --- Deleting a model ---------------------------------------------------------------------------------


def test_an_admin_deletes_a_model_whose_versions_are_all_deleted(ada, three):
    page = html_of(ada, MODEL_PAGE)
    assert 'id="delete-model"' not in page
    gate = html_of(ada, f"{MODEL_PAGE}/delete")
    assert "demo cannot be deleted yet:" in gate and not forms_to(gate, f"{MODEL_PAGE}/delete", f"{MODEL_PAGE}/delete")
    with TestCase.captureOnCommitCallbacks(execute=True):
        for number in (1, 2, 3):
            lifecycle.version_delete(version=version(number), actor=ada.actor, reason=f"drop {number}")
    assert 'id="delete-model" href="/ui/models/demo/delete">Delete model</a>' in html_of(ada, MODEL_PAGE)
    confirm = html_of(ada, f"{MODEL_PAGE}/delete")
    assert re.findall(r'<tr data-version="(\d+)">', confirm) == ["1", "2", "3"]
    (form,) = forms_to(confirm, f"{MODEL_PAGE}/delete", f"{MODEL_PAGE}/delete")

    response = send(ada, form, {"reason": "project ended"})

    assert (response.status_code, response["Location"]) == (302, "/ui/")
    assert not RegisteredModel.objects.filter(name="demo").exists()
    event = AuditEvent.objects.get(action="model.delete")
    assert (event.actor, event.target, event.after) == ("ada", "demo", {"reason": "project ended"})
    assert [v["version"] for v in event.before["versions"]] == [1, 2, 3]
    assert flash(html_of(ada, "/ui/"), "Model 'demo' deleted.")


def test_only_admins_see_or_use_delete_model(mia, ada, three):
    with TestCase.captureOnCommitCallbacks(execute=True):
        for number in (1, 2, 3):
            lifecycle.version_delete(version=version(number), actor=ada.actor, reason="drop")

    assert 'id="delete-model"' not in html_of(mia, MODEL_PAGE)
    refused = mia.client.post(f"{MODEL_PAGE}/delete", {"reason": "mine"})
    assert refused.status_code == 403
    assert alert("deleting a model needs the admin role") in refused.content.decode()
    no_reason = ada.client.post(f"{MODEL_PAGE}/delete", {"reason": ""})
    assert (no_reason.status_code, alert("deleting a model needs a reason") in no_reason.content.decode()) == (
        400,
        True,
    )
    assert RegisteredModel.objects.filter(name="demo").exists()


# --- Retention ----------------------------------------------------------------------------------------


def _age(numbers: tuple[int, ...], days: int) -> None:
    ModelVersion.objects.filter(model__name="demo", version__in=numbers).update(
        created_at=timezone.now() - timedelta(days=days)
    )


def test_the_retention_form_sent_empty_means_no_rule(mia, three):
    page = html_of(mia, RETENTION)
    assert "none: no version is archived or deleted by a rule" in page
    assert "<strong>Leave both empty to remove the rule</strong>" in page
    (form,) = forms_to(page, RETENTION, RETENTION)
    assert [c.name for c in form.controls if c.required] == []

    response = send(mia, form, {}, to=RETENTION)

    assert (response.status_code, response["Location"]) == (302, RETENTION)
    assert RegisteredModel.objects.get(name="demo").retention is None
    assert not AuditEvent.objects.filter(action="model.retention").exists()  # no change
    assert flash(html_of(mia, RETENTION), "'demo' has no retention rule: no version is archived or deleted by one.")


def test_a_maintainer_previews_then_saves_a_rule_that_archives(mia, three):
    _age((1, 2), days=30)
    page = html_of(mia, RETENTION)
    assert '<option value="delete"' not in page  # only admins may choose a rule that deletes
    (form,) = forms_to(page, RETENTION, RETENTION)

    preview = send(mia, form, {"keep_last": "1", "keep_days": "7"}, to=f"{RETENTION}/preview")

    assert preview.status_code == 200
    shown = preview.content.decode()
    assert "Preview of the rule above (not saved)" in shown
    rows = re.findall(r'<tr data-version="(\d+)" data-action="(\w+)">', shown.split('id="retention-preview"', 1)[1])
    assert rows == [("1", "archive"), ("2", "archive")]
    assert "not among the newest version, created " in shown and "(more than 7 days ago)" in shown
    assert RegisteredModel.objects.get(name="demo").retention is None  # a preview saves nothing

    (form,) = forms_to(shown, RETENTION, RETENTION)  # the page keeps what was entered
    saved = send(mia, form, {"keep_last": "1", "keep_days": "7"}, to=RETENTION)

    assert (saved.status_code, saved["Location"]) == (302, RETENTION)
    assert RegisteredModel.objects.get(name="demo").retention == {"keep_last": 1, "keep_days": 7, "then": "archive"}
    event = AuditEvent.objects.get(action="model.retention")
    assert (event.actor, event.after) == ("mia", {"retention": {"keep_last": 1, "keep_days": 7, "then": "archive"}})
    after = html_of(mia, RETENTION)
    assert "keep the newest version and every version uploaded in the last 7 days; <strong>archive</strong>" in after
    plan = after.split('id="retention-plan"', 1)[1]
    assert re.findall(r'<tr data-version="(\d+)" data-action="(\w+)">', plan) == [("1", "archive"), ("2", "archive")]
    assert "Retention: keep the newest version" in html_of(mia, MODEL_PAGE)


def test_the_preview_lists_the_versions_a_rule_keeps_and_why(mia, aud, three):
    _age((1, 2), days=30)
    lifecycle.version_hold(version=version(1), actor=aud.actor, reason="case 4")
    (form,) = forms_to(html_of(mia, RETENTION), RETENTION, RETENTION)

    preview = send(mia, form, {"keep_last": "1", "keep_days": "7"}, to=f"{RETENTION}/preview")

    shown = preview.content.decode().split('id="retention-preview"', 1)[1]
    assert re.findall(r'<tr data-version="(\d+)" data-action="(\w+)">', shown) == [("2", "archive"), ("1", "keep")]
    assert '<span class="badge ok">kept</span>' in shown
    assert "it is under legal hold (by aud since " in shown and ": case 4)" in shown


def test_only_an_admin_may_set_a_rule_that_deletes(mia, ada, three):
    refused = mia.client.post(RETENTION, {"keep_last": "2", "keep_days": "30", "then": "delete"})

    assert refused.status_code == 403
    assert alert("a retention rule that deletes versions needs the admin role") in refused.content.decode()
    assert RegisteredModel.objects.get(name="demo").retention is None
    assert AuditEvent.objects.get(action="access.denied").actor == "mia"

    page = html_of(ada, RETENTION)
    (form,) = forms_to(page, RETENTION, RETENTION)
    saved = send(ada, form, {"keep_last": "2", "keep_days": "30", "then": "delete"}, to=RETENTION)
    assert saved.status_code == 302
    assert RegisteredModel.objects.get(name="demo").retention == {"keep_last": 2, "keep_days": 30, "then": "delete"}
    note = "This rule deletes versions; only an admin may set a rule that deletes"
    assert note in html_of(mia, RETENTION) and note not in html_of(ada, RETENTION)


@pytest.mark.parametrize(
    ("sent", "message"),
    [
        ({"keep_last": "3", "keep_days": ""}, RETENTION_BOTH),
        ({"keep_last": "0", "keep_days": "5"}, "keep_last must be a whole number from 1 to 10000"),
        ({"keep_last": "2", "keep_days": "99999"}, "keep_days must be a whole number from 1 to 36500"),
        ({"keep_last": "two", "keep_days": "5"}, "keep_last: Enter a whole number."),
    ],
)
def test_a_rule_that_is_not_one_is_refused_on_the_page(mia, three, sent, message):
    for address in (RETENTION, f"{RETENTION}/preview"):
        response = mia.client.post(address, {**sent, "then": "archive"})

        assert response.status_code == 400, address
        assert alert(message) in response.content.decode()
    assert RegisteredModel.objects.get(name="demo").retention is None


def test_a_viewer_sees_the_rule_and_its_plan_but_no_form(vic, mia, three):
    RegisteredModel.objects.filter(name="demo").update(retention={"keep_last": 5, "keep_days": 9, "then": "archive"})

    page = html_of(vic, RETENTION)

    assert "keep the 5 newest versions and every version uploaded in the last 9 days" in page
    assert 'id="retention-plan"' in page
    assert not forms_to(page, RETENTION, RETENTION) and not forms_to(page, RETENTION, f"{RETENTION}/preview")
    assert vic.client.post(f"{RETENTION}/preview", {"keep_last": "1", "keep_days": "1"}).status_code == 403
