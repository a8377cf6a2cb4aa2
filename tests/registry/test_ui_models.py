"""Models, versions and compare pages: search, tags, pages, create and edit, what served when, diffs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from registry import services
from registry.models import AliasMove, AuditEvent, InferenceWorker, ModelVersion, RegisteredModel, Role
from tests.support.onnx_models import add_model_bytes
from tests.support.people import login_person
from tests.support.registry import create_model, promote, upload_versions
from tests.support.uploads import upload_local

pytestmark = pytest.mark.django_db


@pytest.fixture
def maintainer():
    return login_person("mia", Role.MAINTAINER)


@pytest.fixture
def viewer():
    return login_person("vic", Role.VIEWER)


def test_search_tags_and_pages(maintainer, viewer):
    for index in range(30):
        services.model_create(
            name=f"m{index:02d}",
            description="embeddings" if index % 2 else "vision",
            tags=["even"] if index % 2 == 0 else [],
            actor=maintainer.actor,
        )
    first = viewer.client.get("/ui/")
    assert [m.name for m in first.context["models"]] == [f"m{i:02d}" for i in range(25)]
    assert b"Page 1 of 2 (30 models)" in first.content
    second = viewer.client.get("/ui/?page=2")
    assert [m.name for m in second.context["models"]] == [f"m{i:02d}" for i in range(25, 30)]
    found = viewer.client.get("/ui/", {"q": "embed"})
    assert [m.name for m in found.context["models"]] == [f"m{i:02d}" for i in range(1, 30, 2)][:25]
    tagged = viewer.client.get("/ui/", {"tag": "even", "q": "vision"})
    assert len(tagged.context["models"]) == 15
    assert b"No model matches" in viewer.client.get("/ui/", {"q": "nothing"}).content


def test_the_empty_list_says_what_to_do_next(maintainer, viewer):
    assert b"Create the first one below" in maintainer.client.get("/ui/").content
    assert b"A maintainer creates them" in viewer.client.get("/ui/").content


def test_maintainer_creates_a_model_and_is_sent_to_its_upload_page(maintainer):
    response = maintainer.client.post("/ui/", {"name": "minilm", "description": "embeddings", "tags": "nlp, small"})
    assert (response.status_code, response["Location"]) == (302, "/ui/models/minilm/upload")
    model = RegisteredModel.objects.get(name="minilm")
    assert (model.description, model.tags) == ("embeddings", ["nlp", "small"])
    event = AuditEvent.objects.get(action="model.create")
    assert (event.actor, event.target, event.after) == (
        "mia",
        "minilm",
        {"description": "embeddings", "tags": ["nlp", "small"]},
    )


@pytest.mark.parametrize(
    ("data", "status", "error"),
    [
        (
            {"name": "Bad Name"},
            400,
            "name: invalid model name: use 1-64 characters of lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
        ),
        (
            {"name": "ok", "tags": "fine, b@d"},
            400,
            "tags: bad tag 'b@d': use letters, digits and . _ : / -, at most 64 characters (MODELYARD_MAX_TAG_CHARS)",
        ),
        ({"name": "ok", "description": "x\x00y"}, 400, "description: Null characters are not allowed."),
    ],
)
def test_bad_model_forms_are_400_with_the_message(maintainer, data, status, error):
    response = maintainer.client.post("/ui/", data)
    assert response.status_code == status
    assert response.context["error"] == error
    assert error.encode() in response.content.replace(b"&#x27;", b"'")
    assert not RegisteredModel.objects.exists()


def test_a_taken_name_is_409(maintainer):
    create_model(maintainer)
    response = maintainer.client.post("/ui/", {"name": "demo"})
    assert (response.status_code, response.context["error"]) == (409, "a model named 'demo' already exists")


def test_viewer_cannot_create_or_edit_and_the_refusals_are_audited(maintainer, viewer):
    create_model(maintainer)
    assert viewer.client.post("/ui/", {"name": "sneaky"}).status_code == 403
    response = viewer.client.post("/ui/models/demo", {"description": "defaced"})
    assert (response.status_code, response.context["error"]) == (403, "editing a model needs the maintainer role")
    assert not RegisteredModel.objects.filter(name="sneaky").exists()
    assert RegisteredModel.objects.get(name="demo").description == ""
    assert list(AuditEvent.objects.filter(action="access.denied").values_list("target", flat=True)) == [
        "POST /ui/",
        "POST /ui/models/demo",
    ]


def test_maintainer_edits_description_and_tags(maintainer):
    create_model(maintainer)
    response = maintainer.client.post("/ui/models/demo", {"description": "new words", "tags": "a b a"})
    assert (response.status_code, response["Location"]) == (302, "/ui/models/demo")
    model = RegisteredModel.objects.get(name="demo")
    assert (model.description, model.tags) == ("new words", ["a", "b"])
    event = AuditEvent.objects.get(action="model.update")
    assert (event.actor, event.after) == ("mia", {"description": "new words", "tags": ["a", "b"]})


def test_model_page_shows_write_controls_only_to_those_who_may_use_them(maintainer, viewer):
    create_model(maintainer)
    upload_versions(maintainer, [1.0])
    promote(maintainer, login_person("boss", Role.APPROVER), 1)
    mine = maintainer.client.get("/ui/models/demo").content
    theirs = viewer.client.get("/ui/models/demo").content
    approver = login_person("ana", Role.APPROVER).client.get("/ui/models/demo").content
    assert b"Upload a version" in mine and b"Request promotion" in mine and b"Edit description" in mine
    for content in (theirs,):
        assert b"Upload a version" not in content and b"Request promotion" not in content
        assert b"Edit description" not in content and b"Roll back" not in content
    # production is protected: only approvers see its rollback
    assert b"Roll back" not in mine and b"Roll back" in approver


def test_what_served_at_a_time_in_the_viewers_time_zone(maintainer, viewer):
    boss = login_person("boss", Role.APPROVER)
    create_model(maintainer)
    upload_versions(maintainer, [1.0, 2.0])
    promote(maintainer, boss, 1)
    promote(maintainer, boss, 2)
    first, second = AliasMove.objects.order_by("id")
    AliasMove.objects.filter(pk=first.pk).update(moved_at=second.moved_at - timedelta(hours=2))
    between = (second.moved_at - timedelta(hours=1)).astimezone(timezone.get_fixed_timezone(330))  # UTC+5:30
    local = between.strftime("%Y-%m-%dT%H:%M:%S")
    response = viewer.client.get("/ui/models/demo", {"at": local, "tz": "Asia/Kolkata"})
    assert response.status_code == 200
    assert [(alias.name, move.to_version.version) for alias, move in response.context["served_at"]] == [
        ("production", 1)
    ]
    # The same wall-clock time read as UTC is 5.5 hours later: version 2 by then.
    as_utc = viewer.client.get("/ui/models/demo", {"at": local, "tz": "UTC"})
    assert [move.to_version.version for _, move in as_utc.context["served_at"]] == [2]
    before_all = viewer.client.get("/ui/models/demo", {"at": "2000-01-01T00:00", "tz": "UTC"})
    assert [move for _, move in before_all.context["served_at"]] == [None]
    assert b"nothing yet" in before_all.content


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ({"at": "yesterday"}, "at: 'yesterday' is not a date and time such as 2026-01-31T14:30"),
        ({"at": "2026-01-01T00:00", "tz": "Mars/Olympus"}, "at: unknown time zone 'Mars/Olympus'"),
        (
            {"at": "0001-01-01T00:00", "tz": "Asia/Tokyo"},
            "at: '0001-01-01T00:00' (Asia/Tokyo) must be a time between 0001-01-01 and 9999-12-31 in UTC",
        ),
        (
            {"at": "9999-12-31T23:59:59-05:00"},
            "at: '9999-12-31T23:59:59-05:00' must be a time between 0001-01-01 and 9999-12-31 in UTC",
        ),
    ],
)
def test_a_bad_time_is_400_with_the_message(maintainer, viewer, query, error):
    create_model(maintainer)
    response = viewer.client.get("/ui/models/demo", query)
    assert (response.status_code, response.context["error"]) == (400, error)


def test_version_page_shows_signature_files_details_and_the_fleet(maintainer, viewer):
    create_model(maintainer)
    data = add_model_bytes()
    upload_local(
        "demo",
        [("model.onnx", data), ("tokenizer.json", b"{}")],
        actor=maintainer.actor,
        description="first cut",
        metadata={"run": "42"},
    )
    now = timezone.now()
    InferenceWorker.objects.create(
        worker_id="w1",
        host="h",
        pid=1,
        device="cpu",
        provider="CPUExecutionProvider",
        started_at=now,
        heartbeat_at=now,
        loaded=[
            {"model": "demo", "version": 1, "aliases": ["production"], "state": "failed", "error": "HashMismatch: x"}
        ],
    )
    response = viewer.client.get("/ui/models/demo/versions/1")
    assert response.status_code == 200
    html = response.content.decode()
    version = ModelVersion.objects.get()
    assert version.sha256 in html and "first cut" in html and "&quot;run&quot;: &quot;42&quot;" in html
    assert '<td><code>x</code></td><td>FP32</td><td class="mono">[-1, 4]</td>' in html
    assert 'href="/api/v1/models/demo/versions/1/download?file=tokenizer.json"' in html
    assert 'href="/api/v1/models/demo/versions/1/download?file=model.onnx"' in html
    [(worker, row, _)] = response.context["fleet"]
    assert (worker.worker_id, row.state, row.error) == ("w1", "failed", "HashMismatch: x")
    assert "HashMismatch: x" in html
    assert "data-poll-url" not in html  # decided: nothing to wait for


NO_CUDA = "this ONNX Runtime build has no CUDA provider (install modelyard[gpu])"


def test_the_version_page_says_a_hosts_cpu_notice_once_not_on_each_process(maintainer, viewer):
    create_model(maintainer)
    upload_versions(maintainer, [1.0])
    now = timezone.now()
    for worker_id in ("w1", "w2"):
        InferenceWorker.objects.create(
            worker_id=worker_id,
            host="cpu-host",
            pid=1,
            device="cpu (no CUDA in this ONNX Runtime build)",
            provider="CPUExecutionProvider",
            started_at=now,
            heartbeat_at=now,
            notice=NO_CUDA,
            loaded=[{"model": "demo", "version": 1, "aliases": [], "state": "ready", "note": f"{NO_CUDA}; other"}],
        )
    html = viewer.client.get("/ui/models/demo/versions/1").content.decode()
    assert html.count("no CUDA provider") == 1
    assert f'<p class="flash warn wrap" data-notice>cpu-host serves on the CPU: {NO_CUDA}</p>' in html
    assert html.count('<span class="muted">other</span>') == 2


def test_a_version_still_validating_asks_the_page_to_poll(maintainer, viewer):
    create_model(maintainer)
    upload_versions(maintainer, [1.0])
    ModelVersion.objects.update(status="validating")
    html = viewer.client.get("/ui/models/demo/versions/1").content.decode()
    assert 'data-poll-url="/api/v1/models/demo/versions/1"' in html
    assert "updates itself" in html


def test_compare_shows_breaking_changes_metadata_and_files(maintainer, viewer):
    create_model(maintainer)
    upload_local("demo", [("model.onnx", add_model_bytes())], actor=maintainer.actor, metadata={"run": "1", "same": 1})
    upload_local(
        "demo",
        [("model.onnx", add_model_bytes(width=5)), ("vocab.txt", b"a")],
        actor=maintainer.actor,
        metadata={"run": "2", "same": 1},
    )
    response = viewer.client.get("/ui/models/demo/compare", {"a": 1, "b": 2})
    assert response.status_code == 200
    diff = response.context["diff"]
    assert diff["breaking"] == [
        "input 'x': dimension 1 changed from 4 to 5",
        "output 'y': dimension 1 changed from 4 to 5",
    ]
    assert [(row.kind, row.name, row.change, bool(row.breaking)) for row in diff["signature"]] == [
        ("input", "x", "changed", True),
        ("output", "y", "changed", True),
    ]
    assert [(row["key"], row["changed"]) for row in diff["metadata"]] == [("run", True), ("same", False)]
    assert [(row.name, row.change, row.before is None) for row in diff["files"]] == [
        ("model.onnx", "changed", False),
        ("vocab.txt", "added", True),
    ]
    assert b'<tr class="breaking">' in response.content


def test_compare_shows_a_renamed_file_as_a_rename(maintainer, viewer):
    """Files are paired by content and role before name: a rename is not a file removed and another added."""
    create_model(maintainer)
    model = add_model_bytes()
    upload_local("demo", [("model.onnx", model), ("vocab.txt", b"abc"), ("old.txt", b"gone")], actor=maintainer.actor)
    upload_local(
        "demo",
        [("classifier.onnx", model), ("tokens.txt", b"abc"), ("notes.txt", b"new")],
        actor=maintainer.actor,
    )
    upload_local("demo", [("model-v3.onnx", add_model_bytes(bias=2.0)), ("vocab.txt", b"abcd")], actor=maintainer.actor)

    renamed = viewer.client.get("/ui/models/demo/compare", {"a": 1, "b": 2})
    assert [(row.renamed_from, row.name, row.change) for row in renamed.context["diff"]["files"]] == [
        ("model.onnx", "classifier.onnx", "renamed"),
        ("vocab.txt", "tokens.txt", "renamed"),
        ("", "old.txt", "removed"),
        ("", "notes.txt", "added"),
    ]
    html = renamed.content.decode()
    assert (
        '<tr data-file="classifier.onnx"><td class="wrap">model.onnx → classifier.onnx</td>' in html
        and '<span class="badge renamed">renamed</span>' in html
    )
    # The model is paired with the model whatever it is called; another file by name when its content changed.
    changed = viewer.client.get("/ui/models/demo/compare", {"a": 1, "b": 3})
    assert [(row.renamed_from, row.name, row.change) for row in changed.context["diff"]["files"]] == [
        ("model.onnx", "model-v3.onnx", "changed"),
        ("", "vocab.txt", "changed"),
        ("", "old.txt", "removed"),
    ]


def test_compare_with_bad_or_unknown_versions(maintainer, viewer):
    create_model(maintainer)
    upload_versions(maintainer, [1.0])
    bad = viewer.client.get("/ui/models/demo/compare", {"a": "one", "b": "1"})
    assert (bad.status_code, bad.context["error"]) == (400, "'a' must be a whole number, got 'one'")
    assert viewer.client.get("/ui/models/demo/compare", {"a": 1, "b": 7}).status_code == 404
    assert b"comparing needs two" in viewer.client.get("/ui/models/demo/compare").content


def test_the_model_page_shows_its_serving_settings_with_instances_by_provider_or_set(maintainer, viewer):
    create_model(maintainer)
    page = viewer.client.get("/ui/models/demo").content.decode()
    assert "batches of up to 32, waiting up to 0 µs, queue of 1024;" in page
    assert "batches at once by provider (1 on the CPU, 2 on a GPU)" in page
    services.model_update(model=RegisteredModel.objects.get(name="demo"), actor=maintainer.actor, instances=3)
    page = viewer.client.get("/ui/models/demo").content.decode()
    assert "3 batches at once" in page and "by provider" not in page
