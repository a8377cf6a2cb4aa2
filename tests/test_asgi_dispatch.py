"""modelyard.asgi sends /v2 and /metrics to the data plane and everything else to Django."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest


def call(path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[bytes, bytes], bytes]:
    from modelyard.asgi import application

    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1")] + [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }
    asyncio.run(application(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body


def test_metrics_and_v2_go_to_the_data_plane(settings):
    settings.METRICS_PUBLIC = True
    status, headers, body = call("/metrics")
    assert status == 200
    assert headers[b"content-type"].startswith(b"text/plain")
    assert b"modelyard_inference_request_seconds" in body
    status, _, body = call("/v2/health/live")
    assert (status, body) == (200, b'{"live":true}')


@pytest.mark.django_db(transaction=True)
def test_other_paths_go_to_django():
    status, _, body = call("/api/v1/models")
    assert status == 401
    assert b"authentication required" in body


@pytest.mark.django_db(transaction=True)
def test_metrics_need_an_inference_or_admin_token_unless_public():
    from registry.access import services
    from registry.models import Role

    tokens = {
        role: services.token_create(username=f"metrics-{role}", create_user=True, roles=[role])[1]
        for role in (Role.INFERENCE, Role.ADMIN, Role.VIEWER)
    }
    for headers in ({}, {"Authorization": f"Bearer {tokens[Role.VIEWER]}"}, {"Authorization": "Bearer my_x_nonsense"}):
        status, _, body = call("/metrics", headers)
        assert status == 401
        assert json.loads(body) == {
            "error": "a bearer token with the inference or admin role is required (MODELYARD_METRICS_PUBLIC)"
        }
    for role in (Role.INFERENCE, Role.ADMIN):
        status, _, body = call("/metrics", {"Authorization": f"Bearer {tokens[role]}"})
        assert status == 200
        assert b"modelyard_inference_request_seconds" in body
