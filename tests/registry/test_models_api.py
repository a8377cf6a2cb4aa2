"""Creating, listing, reading and editing models."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from registry.models import AuditEvent, RegisteredModel

pytestmark = pytest.mark.django_db


def test_create_model_records_audit_event(owner):
    response = owner.post("/api/v1/models", {"name": "resnet-50", "description": "vision", "tags": ["cv"]})
    assert response.status_code == 201
    body = response.json()
    assert body["name"] == "resnet-50"
    assert body["tags"] == ["cv"]
    assert body["created_by"] == "owner"
    event = AuditEvent.objects.get(action="model.create")
    assert (event.actor, event.target, event.after) == ("owner", "resnet-50", {"description": "vision", "tags": ["cv"]})
    assert event.token_id is not None


@pytest.mark.parametrize("name", ["", "Upper", "-lead", "has space", "a" * 65, "x/y", "ünï"])
def test_invalid_model_name_is_400(owner, name):
    response = owner.post("/api/v1/models", {"name": name})
    assert response.status_code == 400
    assert response.json()["error"].startswith("name: ")
    assert RegisteredModel.objects.count() == 0


def test_duplicate_model_name_is_409(owner, registered):
    response = owner.post("/api/v1/models", {"name": registered})
    assert response.status_code == 409
    assert response.json() == {"error": "a model named 'demo' already exists", "detail": None}
    assert RegisteredModel.objects.count() == 1


def test_viewer_cannot_create(outsider):
    response = outsider.post("/api/v1/models", {"name": "x"})
    assert response.status_code == 403
    assert RegisteredModel.objects.count() == 0


def test_bad_token_is_401(client, db):
    response = client.get("/api/v1/models", HTTP_AUTHORIZATION="Bearer my_nope_nope")
    assert response.status_code == 401
    assert response.json() == {"error": "invalid or revoked API token", "detail": None}


def test_invalid_json_is_400_not_500(owner):
    response = owner.client.post(
        "/api/v1/models", "{not json", content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {owner.token}"
    )
    assert response.status_code == 400
    assert response.json()["error"].startswith("JSON parse error")


def test_list_paginates_and_filters(owner, outsider):
    for i in range(7):
        owner.post("/api/v1/models", {"name": f"m{i}", "tags": ["even"] if i % 2 == 0 else []})
    page = outsider.get("/api/v1/models?page_size=3").json()
    assert page["count"] == 7
    assert [m["name"] for m in page["results"]] == ["m0", "m1", "m2"]
    assert page["next"].endswith("page=2&page_size=3")
    assert [m["name"] for m in outsider.get("/api/v1/models?page=3&page_size=3").json()["results"]] == ["m6"]
    assert [m["name"] for m in outsider.get("/api/v1/models?tag=even").json()["results"]] == ["m0", "m2", "m4", "m6"]
    assert [m["name"] for m in outsider.get("/api/v1/models?q=m3").json()["results"]] == ["m3"]


def test_list_query_count_does_not_grow_with_rows(owner, outsider):
    for i in range(3):
        owner.post("/api/v1/models", {"name": f"m{i}"})
    with CaptureQueriesContext(connection) as few:
        outsider.get("/api/v1/models")
    for i in range(3, 12):
        owner.post("/api/v1/models", {"name": f"m{i}"})
    with CaptureQueriesContext(connection) as many:
        outsider.get("/api/v1/models")
    assert len(many) == len(few)


def test_patch_description_and_tags(owner, registered):
    response = owner.patch(f"/api/v1/models/{registered}", {"description": "new", "tags": ["a", "b"]})
    assert response.status_code == 200
    model = RegisteredModel.objects.get(name=registered)
    assert (model.description, model.tags) == ("new", ["a", "b"])
    event = AuditEvent.objects.get(action="model.update")
    assert event.before == {"description": "a demo model", "tags": []}


def test_patch_bad_tags_is_400(owner, registered):
    response = owner.patch(f"/api/v1/models/{registered}", {"tags": "notalist"})
    assert response.status_code == 400
    assert RegisteredModel.objects.get(name=registered).tags == []


def test_viewer_cannot_patch(outsider, registered):
    response = outsider.patch(f"/api/v1/models/{registered}", {"description": "hacked"})
    assert response.status_code == 403
    assert RegisteredModel.objects.get(name=registered).description == "a demo model"


def test_unknown_model_is_404_json(outsider, db):
    response = outsider.get("/api/v1/models/nope")
    assert response.status_code == 404
    assert response.json()["error"]


def test_versions_list_paginates(owner, registered):
    from tests.support.onnx_models import add_model_bytes

    for bias in (1.0, 2.0, 3.0):
        owner.upload(registered, [("m.onnx", add_model_bytes(bias=bias))])
    page = owner.get(f"/api/v1/models/{registered}/versions?page_size=2").json()
    assert page["count"] == 3
    assert [v["version"] for v in page["results"]] == [3, 2]
    assert owner.get(f"/api/v1/models/{registered}/versions/9").status_code == 404


def test_schema_and_docs_are_served(outsider):
    schema = outsider.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/v1/models/{name}/versions" in schema.content
    assert outsider.client.get("/api/docs/").status_code == 200


def test_the_schema_says_a_client_signs_in_with_a_bearer_token_or_a_session(outsider):
    import yaml

    schema = yaml.safe_load(outsider.get("/api/schema/").content)
    assert schema["components"]["securitySchemes"]["bearerAuth"]["type"] == "http"
    assert schema["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    assert set(schema["components"]["securitySchemes"]) == {"bearerAuth", "cookieAuth"}
    upload = schema["paths"]["/api/v1/models/{name}/versions"]["post"]
    assert upload["security"] == [{"bearerAuth": []}, {"cookieAuth": []}]


def test_patch_serving_settings(owner, registered):
    response = owner.patch(
        f"/api/v1/models/{registered}",
        {"serving_strategy": "replace", "max_batch_size": 64, "max_queue_delay_us": 500, "max_queue_size": 10},
    )
    assert response.status_code == 200
    model = RegisteredModel.objects.get(name=registered)
    assert (model.serving_strategy, model.max_batch_size, model.max_queue_delay_us, model.max_queue_size) == (
        "replace",
        64,
        500,
        10,
    )
    event = AuditEvent.objects.get(action="model.update")
    assert event.before == {
        "serving_strategy": "blue-green",
        "max_batch_size": 32,
        "max_queue_delay_us": 0,
        "max_queue_size": 1024,
    }


def test_patch_bad_serving_settings_is_400(owner, registered):
    response = owner.patch(
        f"/api/v1/models/{registered}", {"serving_strategy": "yolo", "max_batch_size": -1, "batching": "maybe"}
    )
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert detail.keys() == {"serving_strategy", "max_batch_size", "batching"}
    assert detail["max_batch_size"] == ["Ensure this value is greater than or equal to 0."]
    assert detail["batching"] == ['"maybe" is not a valid choice.']
    model = RegisteredModel.objects.get(name=registered)
    assert (model.serving_strategy, model.max_batch_size, model.batching) == ("blue-green", 32, "auto")


def test_max_batch_size_0_says_the_model_does_not_batch(owner, registered):
    """Triton's ``max_batch_size: 0``; it was refused with 400 (the minimum was 1)."""
    response = owner.patch(f"/api/v1/models/{registered}", {"max_batch_size": 0})
    assert response.status_code == 200, response.content
    assert response.json()["max_batch_size"] == 0
    assert RegisteredModel.objects.get(name=registered).max_batch_size == 0
    event = AuditEvent.objects.get(action="model.update")
    assert (event.before, event.after) == ({"max_batch_size": 32}, {"max_batch_size": 0})


def test_patch_batching_on_off_and_auto(owner, registered):
    assert owner.get(f"/api/v1/models/{registered}").json()["batching"] == "auto"
    for setting in ("on", "off", "auto"):
        response = owner.patch(f"/api/v1/models/{registered}", {"batching": setting})
        assert response.status_code == 200, response.content
        assert response.json()["batching"] == setting
        assert RegisteredModel.objects.get(name=registered).batching == setting
    events = AuditEvent.objects.filter(action="model.update").order_by("id")
    assert [(e.before, e.after) for e in events] == [
        ({"batching": "auto"}, {"batching": "on"}),
        ({"batching": "on"}, {"batching": "off"}),
        ({"batching": "off"}, {"batching": "auto"}),
    ]


def test_patch_batching_needs_the_maintainer_role(outsider, registered):
    response = outsider.patch(f"/api/v1/models/{registered}", {"batching": "off", "max_batch_size": 0})
    assert response.status_code == 403
    model = RegisteredModel.objects.get(name=registered)
    assert (model.batching, model.max_batch_size) == ("auto", 32)


def test_home_page_links_the_docs(client, owner, registered):
    response = client.get("/")
    assert response.status_code == 200
    assert b'href="/api/docs/"' in response.content
    assert b"1 model, 0 versions registered" in response.content
