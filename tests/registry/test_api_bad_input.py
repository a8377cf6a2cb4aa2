"""Hostile input to the REST API is a 4xx ``{"error", "detail"}``, never a 500.

Each case here answered 500 before: JSON that raises RecursionError instead of ValueError, a
well-formed but impossible date, a hand-made cursor, and NUL bytes that PostgreSQL cannot compare.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import pytest
from django.test import Client

from registry.models import ModelVersion, RegisteredModel, Role
from tests.support.onnx_models import add_model_bytes
from tests.support.people import Person, make_person

if TYPE_CHECKING:
    # What django-stubs call a test client's response; it exists only in the stubs.
    from django.test.client import _MonkeyPatchedWSGIResponse

pytestmark = pytest.mark.django_db

DEEP = "[" * 50_000
TOO_DEEP = {"error": "JSON parse error - nested deeper than 64 levels (MODELYARD_MAX_JSON_DEPTH)", "detail": None}
BAD_CURSOR = {"error": "invalid 'cursor': follow a page's 'next' or 'previous' link unchanged", "detail": None}

# Every endpoint that reads a JSON body: (method, path).
JSON_ENDPOINTS = [
    ("post", "/api/v1/models"),
    ("patch", "/api/v1/models/demo"),
    ("put", "/api/v1/models/demo/aliases/staging"),
    ("patch", "/api/v1/models/demo/aliases/production"),
    ("post", "/api/v1/models/demo/aliases/production/rollback"),
    ("post", "/api/v1/promotions/1/approve"),
    ("post", "/api/v1/promotions/1/reject"),
    ("post", "/api/v1/promotions/1/cancel"),
]


@pytest.fixture
def root(registered: str) -> Person:
    """An admin, so that every endpoint gets as far as reading its body."""
    person = make_person("root", Role.ADMIN)
    person.client.raise_request_exception = False  # a 500 must show as a 500, not as an exception
    return person


def send(person: Person, method: str, path: str, body: str) -> _MonkeyPatchedWSGIResponse:
    call = getattr(person.client, method)
    return call(path, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {person.token}")


# --- JSON bodies ------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), JSON_ENDPOINTS)
def test_deeply_nested_json_body_is_400_on_every_endpoint(root, method, path):
    response = send(root, method, path, DEEP)
    assert response.status_code == 400
    assert response.json() == TOO_DEEP


@pytest.mark.parametrize("body", [DEEP, "{" + '"a":{' * 50_000, "[" * 900 + "]" * 900])
def test_deep_json_is_refused_before_anything_reads_it(root, body):
    # 900 levels still parse; the depth cap stops them before json.dumps in a serializer could overflow.
    response = send(root, "patch", "/api/v1/models/demo", body)
    assert response.status_code == 400
    assert response.json() == TOO_DEEP
    assert RegisteredModel.objects.get(name="demo").description == "a demo model"


def test_json_depth_limit_is_a_setting(root, settings):
    settings.MAX_JSON_DEPTH = 2
    assert send(root, "post", "/api/v1/models", '{"name": "flat", "tags": ["a"]}').status_code == 201
    response = send(root, "post", "/api/v1/models", '{"name": "nested", "tags": [["a"]]}')
    assert response.status_code == 400
    assert response.json() == {
        "error": "JSON parse error - nested deeper than 2 levels (MODELYARD_MAX_JSON_DEPTH)",
        "detail": None,
    }
    assert not RegisteredModel.objects.filter(name="nested").exists()


def test_nul_in_a_json_key_is_400(root):
    response = send(root, "patch", "/api/v1/models/demo", '{"description\\u0000": "x"}')
    assert response.status_code == 400
    assert response.json() == {"error": "JSON parse error - keys may not contain NUL (\\u0000)", "detail": None}


def test_malformed_json_is_still_400(root):
    response = send(root, "post", "/api/v1/models", '{"name": ')
    assert response.status_code == 400
    assert response.json()["error"].startswith("JSON parse error - Expecting value")


@pytest.mark.parametrize(
    ("metadata", "error"),
    [
        (DEEP, "metadata: not valid JSON: nested deeper than 64 levels (MODELYARD_MAX_JSON_DEPTH)"),
        ('{"run": "a\\u0000b"}', "metadata: not valid JSON: strings may not contain NUL (\\u0000)"),
    ],
)
def test_upload_metadata_with_deep_nesting_or_nul_is_400(root, metadata, error):
    response = root.upload("demo", [("model.onnx", add_model_bytes())], metadata=metadata)
    assert response.status_code == 400
    assert response.json()["error"] == error
    assert not ModelVersion.objects.exists()


# --- Times and cursors ------------------------------------------------------------------------


def test_impossible_date_for_alias_history_is_400(root):
    response = root.get("/api/v1/models/demo/aliases/production/history?at=2026-02-30T00:00:00Z")
    assert response.status_code == 400
    assert response.json() == {
        "error": "'at' must be an ISO 8601 time with a timezone, e.g. 2026-01-31T12:00:00Z; got '2026-02-30T00:00:00Z'",
        "detail": None,
    }


@pytest.mark.parametrize(
    ("query", "at"),
    [
        ("9999-12-31T23:59:59-23:59", "9999-12-31T23:59:59-23:59"),  # past year 9999 once in UTC
        ("0001-01-01T00:00:00+01:00", "0001-01-01T00:00:00+01:00"),  # a '+' unencoded, as typed: a space
        ("0001-01-01T00:00:00%2B01:00", "0001-01-01T00:00:00+01:00"),  # before year 1 once in UTC
    ],
)
def test_a_time_out_of_range_in_utc_for_alias_history_is_400(root, query, at):
    response = root.get(f"/api/v1/models/demo/aliases/production/history?at={query}")
    assert response.status_code == 400
    assert response.json() == {
        "error": f"'at' must be a time between 0001-01-01 and 9999-12-31 in UTC; got {at!r}",
        "detail": None,
    }


@pytest.mark.parametrize("param", ["since", "until"])
def test_impossible_date_for_the_audit_log_is_400_naming_the_parameter(root, param):
    response = root.get(f"/api/v1/audit?{param}=2026-02-30T00:00:00Z")
    assert response.status_code == 400
    assert response.json()["error"].startswith(f"{param}: Datetime has wrong format.")


@pytest.mark.parametrize(
    "cursor",
    [
        base64.b64encode(b"p=abc").decode(),  # a position that is not a seq: was a 500
        base64.b64encode(b"p=1\x002").decode(),  # NUL: was a 500
        base64.b64encode(b"p=99999999999999999999999").decode(),  # beyond bigint
        base64.b64encode(b"r=x").decode(),  # DRF's own "Invalid cursor" was a 404
        "not base64 at all!",
    ],
)
def test_garbled_audit_cursor_is_400(root, cursor):
    response = root.client.get("/api/v1/audit", {"cursor": cursor}, HTTP_AUTHORIZATION=f"Bearer {root.token}")
    assert response.status_code == 400
    assert response.json() == BAD_CURSOR


# --- NUL bytes in the URL ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/v1/models/a%00b", 404),
        ("/api/v1/models/demo/aliases/a%00b/history", 404),
        ("/api/v1/models/demo/versions/1%00", 404),
        ("/api/v1/models?q=a%00b", 200),
        ("/api/v1/models/demo/versions?status=a%00b", 200),
        ("/api/v1/promotions?model=a%00b", 200),
    ],
)
def test_nul_in_the_url_finds_nothing_instead_of_failing(root, path, status):
    response = root.get(path)
    assert response.status_code == status
    if status == 200:
        assert response.json()["results"] == []
    else:
        assert response.json()["error"] == "not found"


def test_nul_in_a_url_of_the_ui_is_404(root):
    browser = Client(raise_request_exception=False)
    browser.force_login(RegisteredModel.objects.get(name="demo").created_by)
    assert browser.get("/ui/models/a%00b").status_code == 404
    assert browser.get("/ui/?q=a%00b").status_code == 200
