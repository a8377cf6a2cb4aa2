"""A version's description and tags are edited after its upload (API, client and page), each edit audited.

Tags, a model's and a version's, are capped (``MODELYARD_MAX_TAGS``, ``MODELYARD_MAX_TAG_CHARS``): each
edit is an audit event kept for good.
"""

from __future__ import annotations

import pytest

from registry.models import AuditEvent, ModelVersion, RegisteredModel, Role
from tests.support.people import login_person
from tests.support.registry import create_model, upload_versions

pytestmark = pytest.mark.django_db

URL = "/api/v1/models/demo/versions/1"


@pytest.fixture
def version(owner) -> ModelVersion:
    create_model(owner)
    [made] = upload_versions(owner, [1.0])
    return made


def edits() -> list[tuple[str, str, dict, dict]]:
    return [(e.actor, e.target, e.before, e.after) for e in AuditEvent.objects.filter(action="version.update")]


# --- API ---------------------------------------------------------------------------------------------


def test_maintainer_edits_a_versions_description_and_tags_and_the_change_is_audited(owner, version):
    response = owner.patch(URL, {"description": "  epoch 7, better recall ", "tags": ["candidate", "run:42"]})
    assert response.status_code == 200, response.content
    assert (response.json()["description"], response.json()["tags"]) == (
        "epoch 7, better recall",
        ["candidate", "run:42"],
    )
    assert response.json()["metadata"] == {} and response.json()["status"] == "ready"
    version.refresh_from_db()
    assert (version.description, version.tags) == ("epoch 7, better recall", ["candidate", "run:42"])
    assert edits() == [
        (
            "owner",
            "demo/1",
            {"description": "", "tags": []},
            {"description": "epoch 7, better recall", "tags": ["candidate", "run:42"]},
        )
    ]
    assert owner.get(URL).json()["tags"] == ["candidate", "run:42"]


def test_only_the_fields_sent_and_changed_are_written_and_audited(owner, version):
    owner.patch(URL, {"description": "first", "tags": ["a"]})
    response = owner.patch(URL, {"tags": ["a", "b"], "description": "first"})
    assert response.status_code == 200
    assert edits()[-1][2:] == ({"tags": ["a"]}, {"tags": ["a", "b"]})
    assert owner.patch(URL, {"tags": ["a", "b"]}).status_code == 200  # nothing changes: nothing written
    assert len(edits()) == 2


def test_optional_fields_sent_empty_clear_them_and_none_sent_changes_nothing(owner, version):
    owner.patch(URL, {"description": "words", "tags": ["a"]})
    response = owner.patch(URL, {"description": "", "tags": []})
    assert response.status_code == 200, response.content
    assert (response.json()["description"], response.json()["tags"]) == ("", [])
    assert edits()[-1][2:] == ({"description": "words", "tags": ["a"]}, {"description": "", "tags": []})
    nothing = owner.patch(URL, {})
    assert (nothing.status_code, nothing.json()["version"]) == (200, 1)
    assert len(edits()) == 2


def test_a_viewer_may_not_edit_a_version(owner, outsider, version):
    response = outsider.patch(URL, {"description": "defaced"})
    assert response.status_code == 403
    assert response.json()["error"] == "this action needs the maintainer or admin role"
    version.refresh_from_db()
    assert version.description == ""
    assert edits() == []


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"tags": "notalist"}, 'tags: Expected a list of items but got type "str".'),
        (
            {"tags": ["b@d"]},
            "tags: bad tag 'b@d': use letters, digits and . _ : / -, at most 64 characters (MODELYARD_MAX_TAG_CHARS)",
        ),
        (
            {"tags": ["a b"]},
            "tags: bad tag 'a b': use letters, digits and . _ : / -, at most 64 characters (MODELYARD_MAX_TAG_CHARS)",
        ),
        ({"description": "x" * 10_001}, "description: Ensure this field has no more than 10000 characters."),
        ({"description": "a\x00b"}, "JSON parse error - strings may not contain NUL (\\u0000)"),
    ],
)
def test_bad_edits_are_400_and_change_nothing(owner, version, body, error):
    response = owner.patch(URL, body)
    assert response.status_code == 400
    assert response.json()["error"] == error
    version.refresh_from_db()
    assert (version.description, version.tags) == ("", [])
    assert edits() == []


def test_an_unknown_version_is_404(owner, version):
    assert owner.patch("/api/v1/models/demo/versions/9", {"description": "x"}).status_code == 404


# --- Tag limits, on models and versions --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tags", "error"),
    [
        (["a", "b", "c"], "tags: at most 2 tags (MODELYARD_MAX_TAGS), got 3"),
        (
            ["abcdef"],
            "tags: bad tag 'abcdef': use letters, digits and . _ : / -, at most 5 characters (MODELYARD_MAX_TAG_CHARS)",
        ),
    ],
)
def test_tags_past_their_limits_are_refused_on_models_and_versions(owner, version, settings, tags, error):
    settings.MAX_TAGS = 2
    settings.MAX_TAG_CHARS = 5
    for path in ("/api/v1/models/demo", URL):
        response = owner.patch(path, {"tags": tags})
        assert (response.status_code, response.json()["error"]) == (400, error), path
    created = owner.post("/api/v1/models", {"name": "other", "tags": tags})
    assert (created.status_code, created.json()["error"]) == (400, error)
    assert RegisteredModel.objects.get(name="demo").tags == []
    assert not RegisteredModel.objects.filter(name="other").exists()
    assert not AuditEvent.objects.filter(action__in=["model.update", "version.update"]).exists()
    # At the limits, both are taken.
    assert owner.patch(URL, {"tags": ["abcde", "b"]}).status_code == 200
    assert owner.patch("/api/v1/models/demo", {"tags": ["abcde", "b"]}).status_code == 200


def test_a_huge_tag_list_is_refused_by_default(owner, version):
    """200,000 tags once made a 2 MB audit event."""
    tags = [f"t{i}" for i in range(200_000)]
    for path in ("/api/v1/models/demo", URL):
        response = owner.patch(path, {"tags": tags})
        assert (response.status_code, response.json()["error"]) == (
            400,
            "tags: at most 32 tags (MODELYARD_MAX_TAGS), got 200000",
        )
    assert not AuditEvent.objects.filter(action__in=["model.update", "version.update"]).exists()


def test_tags_past_their_limits_are_refused_on_the_pages(settings):
    settings.MAX_TAGS = 2
    mia = login_person("mia", Role.MAINTAINER)
    create_model(mia)
    upload_versions(mia, [1.0])
    for path in ("/ui/models/demo", "/ui/models/demo/versions/1"):
        response = mia.client.post(path, {"description": "", "tags": "a b c"})
        assert (response.status_code, response.context["error"]) == (
            400,
            "tags: at most 2 tags (MODELYARD_MAX_TAGS), got 3",
        )
    assert not AuditEvent.objects.filter(action__in=["model.update", "version.update"]).exists()


# --- The version page --------------------------------------------------------------------------------------


def test_maintainer_edits_a_version_on_its_page(settings):
    mia = login_person("mia", Role.MAINTAINER)
    create_model(mia)
    upload_versions(mia, [1.0])
    page = mia.client.get("/ui/models/demo/versions/1")
    assert b'id="version-edit"' in page.content
    response = mia.client.post(
        "/ui/models/demo/versions/1", {"description": "epoch 7", "tags": "candidate, run:42 candidate"}
    )
    assert (response.status_code, response["Location"]) == (302, "/ui/models/demo/versions/1")
    version = ModelVersion.objects.get()
    assert (version.description, version.tags) == ("epoch 7", ["candidate", "run:42"])
    shown = mia.client.get("/ui/models/demo/versions/1")
    assert b"Version 1 saved." in shown.content and b'<span class="tag">run:42</span>' in shown.content
    assert edits() == [
        ("mia", "demo/1", {"description": "", "tags": []}, {"description": "epoch 7", "tags": ["candidate", "run:42"]})
    ]


def test_the_version_form_with_its_optional_fields_empty_clears_them():
    mia = login_person("mia", Role.MAINTAINER)
    create_model(mia)
    upload_versions(mia, [1.0])
    mia.client.post("/ui/models/demo/versions/1", {"description": "words", "tags": "a"})
    response = mia.client.post("/ui/models/demo/versions/1", {"description": "", "tags": ""})
    assert response.status_code == 302
    version = ModelVersion.objects.get()
    assert (version.description, version.tags) == ("", [])
    assert edits()[-1][2:] == ({"description": "words", "tags": ["a"]}, {"description": "", "tags": []})


def test_a_viewer_sees_no_edit_form_and_a_direct_post_is_refused_and_audited():
    mia = login_person("mia", Role.MAINTAINER)
    vic = login_person("vic", Role.VIEWER)
    create_model(mia)
    upload_versions(mia, [1.0])
    assert b'id="version-edit"' not in vic.client.get("/ui/models/demo/versions/1").content
    response = vic.client.post("/ui/models/demo/versions/1", {"description": "defaced", "tags": ""})
    assert (response.status_code, response.context["error"]) == (403, "editing a version needs the maintainer role")
    assert ModelVersion.objects.get().description == ""
    denied = AuditEvent.objects.get(action="access.denied")
    assert (denied.actor, denied.target) == ("vic", "POST /ui/models/demo/versions/1")
