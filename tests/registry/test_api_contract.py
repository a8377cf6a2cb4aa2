"""The OpenAPI schema as a contract a generated client can hold the server to, and the pages of every list.

A run of schemathesis against ``/api/schema/`` (docs/development/index.md) found the schema
describing answers the server never gives: the audit log's page as a bare array, text such as a
worker's ``notice`` as never empty, a version or a user that may be null as always there, and no
error answers at all. ``test_required_fields_api.py`` now checks every answer it gets against the
schema; these tests check the schema itself, and the page parameters it documents.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from registry.api.pagination import MAX_PAGE_SIZE
from registry.api.schema import CHANGES, ERROR_COMPONENT, EVERY_OPERATION
from registry.models import AuditEvent, RegisteredModel, Role
from tests.support.openapi import operations, resolve
from tests.support.people import make_person


@pytest.fixture(scope="module")
def schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The schema as ``manage.py spectacular`` writes it: validated against OpenAPI 3, and any warning
    of the generator (two components with one name, an enum named by a hash) an error."""
    path = Path(tmp_path_factory.mktemp("schema")) / "schema.json"
    call_command("spectacular", "--validate", "--fail-on-warn", "--format", "openapi-json", "--file", str(path))
    return dict(json.loads(path.read_text()))


def test_every_operation_documents_its_error_answers_in_their_one_shape(schema):
    error = {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}
    assert schema["components"]["schemas"][ERROR_COMPONENT]["required"] == ["error", "detail"]
    found = list(operations(schema))
    assert len(found) > 70
    for operation in found:
        expected = set(EVERY_OPERATION) | (set(CHANGES) if operation.method != "get" else set())
        assert expected <= operation.statuses, (operation.operation_id, sorted(expected - operation.statuses))
        for status in operation.statuses:
            if status >= 400:
                media = operation.spec["responses"][str(status)]["content"]
                assert media == {"application/json": {"schema": error}}, (operation.operation_id, status)


def test_answers_may_hold_empty_text_that_requests_may_not(schema):
    """An answer's text may be "" (a worker that serves where it was asked has no notice); a request's
    required text may not, and the schema says so only of the request (``COMPONENT_SPLIT_REQUEST``)."""
    components = schema["components"]["schemas"]
    assert "minLength" not in components["Worker"]["properties"]["notice"]
    assert "minLength" not in components["Model"]["properties"]["name"]
    assert components["ModelCreateInputRequest"]["properties"]["name"]["minLength"] == 1


def test_what_may_be_null_in_an_answer_says_so(schema):
    components = schema["components"]["schemas"]
    for component, field in [
        ("Alias", "version"),  # an alias made by a promotion that waits for approval
        ("Move", "from_version"),  # the alias's first move
        ("Move", "promotion"),
        ("Promotion", "decided_by"),
        ("Version", "derived_from"),
        ("Version", "created_by"),  # the user was deleted
        ("Webhook", "model"),  # a webhook for every model
        ("DeriveJob", "version"),  # before the derived version exists
    ]:
        assert components[component]["properties"][field].get("nullable") is True, (component, field)


def test_the_audit_log_documents_its_cursor_page(schema):
    answer = schema["paths"]["/api/v1/audit"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    page = resolve(schema, answer)
    assert set(page["properties"]) == {"next", "previous", "results"}
    assert page["properties"]["results"]["items"] == {"$ref": "#/components/schemas/AuditEvent"}
    assert schema["paths"]["/api/v1/audit"]["get"]["operationId"] == "v1_audit_list"


# --- Pages ----------------------------------------------------------------------------------------


@pytest.fixture
def three_models(owner):
    for name in ("m1", "m2", "m3"):
        assert owner.post("/api/v1/models", {"name": name}).status_code == 201
    return owner


@pytest.mark.django_db
def test_a_page_holds_page_size_items_and_links_the_next(three_models):
    body = three_models.get("/api/v1/models?page_size=2").json()
    assert (body["count"], len(body["results"])) == (3, 2)
    assert "page=2" in body["next"]
    last = three_models.get("/api/v1/models?page_size=2&page=2").json()
    assert ([m["name"] for m in last["results"]], last["next"]) == (["m3"], None)


@pytest.mark.django_db
def test_empty_page_parameters_are_as_if_not_sent(three_models):
    body = three_models.get("/api/v1/models?page=&page_size=").json()
    assert (body["count"], len(body["results"]), body["next"]) == (3, 3, None)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "error"),
    [
        ("page_size=abc", "page_size must be a whole number from 1 to 500, got 'abc'"),
        ("page_size=0", "page_size must be a whole number from 1 to 500, got '0'"),
        ("page_size=-3", "page_size must be a whole number from 1 to 500, got '-3'"),
        ("page_size=null", "page_size must be a whole number from 1 to 500, got 'null'"),
        ("page_size=%D9%A3", "page_size must be a whole number from 1 to 500, got '٣'"),  # a digit, not ASCII
        ("page=0", "page must be a whole number from 1, got '0'"),
        ("page=two", "page must be a whole number from 1, got 'two'"),
    ],
)
def test_a_bad_page_parameter_is_a_400_that_names_it(three_models, query, error):
    field = query.split("=")[0]
    response = three_models.get(f"/api/v1/models?{query}")
    assert response.status_code == 400
    assert response.json() == {"error": error, "detail": {"field": field}}


@pytest.mark.django_db
def test_a_page_past_the_last_is_a_404_that_says_so(three_models):
    response = three_models.get("/api/v1/models?page_size=2&page=3")
    assert response.status_code == 404
    assert response.json() == {"error": "page 3 does not exist (That page contains no results)", "detail": None}
    assert three_models.get("/api/v1/models?page_size=2&page=last").json()["results"][0]["name"] == "m3"


@pytest.mark.django_db
def test_a_page_size_above_the_most_is_the_most(owner):
    RegisteredModel.objects.bulk_create(RegisteredModel(name=f"bulk-{n:03}") for n in range(MAX_PAGE_SIZE + 1))
    body = owner.get("/api/v1/models?page_size=100000").json()
    assert (body["count"], len(body["results"])) == (MAX_PAGE_SIZE + 1, MAX_PAGE_SIZE)
    assert "page=2" in body["next"]


@pytest.mark.django_db
def test_the_audit_logs_cursor_pages_refuse_a_bad_page_size_too():
    auditor = make_person("auditor", Role.AUDITOR)
    response = auditor.get("/api/v1/audit?page_size=many")
    assert response.status_code == 400
    assert response.json() == {
        "error": "page_size must be a whole number from 1 to 500, got 'many'",
        "detail": {"field": "page_size"},
    }
    assert AuditEvent.objects.filter(action="access.denied").count() == 0
    first = auditor.get("/api/v1/audit?page_size=").json()
    assert set(first) == {"next", "previous", "results"}
