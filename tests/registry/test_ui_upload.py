"""The upload page: the browser's multipart request goes to the one upload service, streamed, CSRF-checked first."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client, TestCase

from modelyard.streaming import StreamingASGIHandler
from registry.models import AuditEvent, ModelVersion, Role
from tests.support.onnx_models import add_model_bytes, unknown_op_model
from tests.support.people import login_person
from tests.support.registry import create_model
from tests.support.uploads import stored_keys

pytestmark = pytest.mark.django_db


def browser(username: str, *roles: str) -> Client:
    """A signed-in client that checks CSRF as a browser's request is checked, with its CSRF cookie set."""
    login_person(username, *roles)
    client = Client(enforce_csrf_checks=True)
    client.force_login(get_user_model().objects.get(username=username))
    assert client.get("/ui/models/demo/upload").status_code == 200  # sets the CSRF cookie
    return client


def files(*parts: tuple[str, bytes]) -> list[SimpleUploadedFile]:
    return [SimpleUploadedFile(name, data, content_type="application/octet-stream") for name, data in parts]


def post(client: Client, data: dict, *, header: bool = True):
    # WSGI environ entries, passed as **extra; typed Any as they would match post()'s named parameters otherwise.
    extra: dict[str, Any] = {"HTTP_X_CSRFTOKEN": client.cookies["csrftoken"].value} if header else {}
    with TestCase.captureOnCommitCallbacks(execute=True):  # validation runs as the request's commit would run it
        return client.post("/ui/models/demo/upload", data, **extra)


@pytest.fixture
def demo():
    create_model(login_person("owner", Role.MAINTAINER))


def test_maintainer_uploads_through_the_page_and_the_version_is_validated(demo):
    client = browser("mia", Role.MAINTAINER)
    model = add_model_bytes()
    response = post(
        client,
        {
            "file": files(("model.onnx", model), ("vocab.json", b"{}")),
            "description": "first",
            "metadata": '{"a": 1}',
        },
    )
    assert response.status_code == 201
    answer = response.json()
    # The test's transaction holds the validation until the request is answered; a server runs it at once.
    assert (answer["version"], answer["url"]) == (1, "/ui/models/demo/versions/1")
    version = ModelVersion.objects.get()
    assert (version.status, version.description, version.metadata) == ("ready", "first", {"a": 1})
    assert [f.name for f in version.files.order_by("id")] == ["model.onnx", "vocab.json"]
    upload = AuditEvent.objects.get(action="version.upload")
    assert (upload.actor, upload.target) == ("mia", "demo/1")
    page = client.get("/ui/models/demo/versions/1")
    assert b"Version 1 uploaded." in page.content


@pytest.mark.django_db(transaction=True)
def test_a_failed_version_is_announced_as_failed_with_its_reason_and_the_detail_below(demo):
    """Committed as a server commits it, so the embedded default's validation ends before the page answers."""
    client = browser("mia", Role.MAINTAINER)
    response = client.post(
        "/ui/models/demo/upload",
        {"file": files(("model.onnx", unknown_op_model().SerializeToString()))},
        HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value,
    )
    assert response.status_code == 201
    assert ModelVersion.objects.get().status == "failed"
    page = client.get("/ui/models/demo/versions/1").content.decode()
    assert '<div class="flash error" role="status">Version 1 uploaded, validation failed.</div>' in page
    assert "Version 1 uploaded.<" not in page and "flash success" not in page
    assert (
        '<div class="problem"><div class="wrap reason">onnx.checker rejected the model: No Op registered for '
        'FrobnicateTensor with domain_version of 17</div><pre class="detail">==&gt; Context: Bad node spec for node. '
        "Name:  OpType: FrobnicateTensor</pre></div>"
    ) in page
    assert "x0a" not in page
    listed = client.get("/ui/models/demo").content.decode()
    assert (
        '<div class="bad" title="==&gt; Context: Bad node spec for node. Name:  OpType: FrobnicateTensor">'
        "onnx.checker rejected the model: No Op registered for FrobnicateTensor with domain_version of 17</div>"
    ) in listed


def test_a_version_that_fails_after_the_upload_was_answered_is_announced_as_failed(demo):
    """As with a broker: the upload is answered while validation waits; it fails before the page is shown."""
    client = browser("mia", Role.MAINTAINER)
    response = post(client, {"file": files(("model.onnx", unknown_op_model().SerializeToString()))})
    assert (response.status_code, response.json()["status"]) == (201, "pending")
    assert ModelVersion.objects.get().status == "failed"  # validation ran after the answer
    page = client.get("/ui/models/demo/versions/1").content.decode()
    assert '<div class="flash error" role="status">Version 1 uploaded, validation failed.</div>' in page
    assert "flash success" not in page


def test_a_page_upload_with_every_optional_field_empty_is_stored(demo):
    """The page always sends Description and Metadata; most people leave both empty."""
    client = browser("mia", Role.MAINTAINER)
    response = post(client, {"file": files(("model.onnx", add_model_bytes())), "description": "", "metadata": ""})
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get()
    assert (version.status, version.description, version.metadata) == ("ready", "", {})


def test_the_csrf_token_must_come_in_the_header_so_the_body_is_never_parsed_first(demo):
    client = browser("mia", Role.MAINTAINER)
    token = client.cookies["csrftoken"].value
    response = post(
        client, {"csrfmiddlewaretoken": token, "file": files(("model.onnx", add_model_bytes()))}, header=False
    )
    assert response.status_code == 403
    assert b"CSRF token missing" in response.content
    assert not ModelVersion.objects.exists()
    assert stored_keys() == []
    wrong = client.post(
        "/ui/models/demo/upload", {"file": files(("model.onnx", add_model_bytes()))}, HTTP_X_CSRFTOKEN="x" * 64
    )
    assert wrong.status_code == 403
    assert not ModelVersion.objects.exists()


def test_viewer_is_refused_before_anything_is_stored_and_the_refusal_audited(demo):
    client = browser("vic", Role.VIEWER)
    response = post(client, {"file": files(("model.onnx", add_model_bytes()))})
    assert response.status_code == 403
    assert response.json() == {"error": "uploading a version needs the maintainer role", "detail": None}
    assert stored_keys() == []
    denied = AuditEvent.objects.get(action="access.denied")
    assert (denied.actor, denied.target) == ("vic", "POST /ui/models/demo/upload")


@pytest.mark.parametrize(
    ("parts", "status", "error"),
    [
        ([("model.onnx", b"not a model")], 400, "'model.onnx': "),
        ([("weights.bin", b"x")], 400, "the first file must be the .onnx model, got 'weights.bin'"),
        ([], 400, "no files: send the .onnx model as a multipart 'file' part"),
    ],
)
def test_bad_uploads_answer_the_services_message(demo, parts, status, error):
    client = browser("mia", Role.MAINTAINER)
    response = post(client, {"file": files(*parts)} if parts else {"description": "x"})
    assert response.status_code == status
    assert response.json()["error"].startswith(error)
    assert not ModelVersion.objects.exists()
    assert stored_keys() == []


def test_bad_metadata_is_400_with_the_field_named(demo):
    client = browser("mia", Role.MAINTAINER)
    response = post(client, {"file": files(("model.onnx", add_model_bytes())), "metadata": "[1]"})
    assert response.status_code == 400
    assert response.json() == {
        "error": "metadata: metadata must be a JSON object",
        "detail": {"metadata": ["metadata must be a JSON object"]},
    }


def test_an_upload_over_the_limit_is_413(demo, settings):
    settings.MAX_UPLOAD_BYTES = 200
    client = browser("mia", Role.MAINTAINER)
    response = post(client, {"file": files(("model.onnx", add_model_bytes()), ("big.bin", b"x" * 500))})
    assert response.status_code == 413
    assert response.json()["error"] == "the upload is larger than the limit of 200 bytes"
    assert stored_keys() == []


def test_a_form_that_is_not_multipart_is_400(demo):
    client = browser("mia", Role.MAINTAINER)
    response = client.post(
        "/ui/models/demo/upload",
        "x=1",
        content_type="application/x-www-form-urlencoded",
        HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value,
    )
    assert response.status_code == 400
    assert response.json()["error"] == "send the files as multipart/form-data with one 'file' part per file"


def test_a_viewer_sees_no_upload_form(demo):
    page = browser("vic", Role.VIEWER).get("/ui/models/demo/upload")
    assert b"Uploading needs the maintainer role." in page.content
    assert b'id="upload-form"' not in page.content


def test_the_page_says_what_to_do_without_javascript(demo):
    page = browser("mia", Role.MAINTAINER).get("/ui/models/demo/upload")
    assert b"<noscript>" in page.content and b"/api/v1/models/demo/versions" in page.content
    assert b'id="upload-form"' in page.content and b'name="file"' in page.content


# --- Under the real ASGI server the page's upload streams, like the API's ----------------------------------


@pytest.fixture
def asgi_server() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    config = uvicorn.Config(StreamingASGIHandler(), host="127.0.0.1", port=port, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield port
    server.should_exit = True
    thread.join(timeout=10)


@pytest.mark.django_db(transaction=True)
def test_an_upload_larger_than_other_request_bodies_streams_through_the_page(asgi_server, settings):
    """Other bodies stop at MODELYARD_MAX_REQUEST_BODY_BYTES; the upload page's may be as large as an upload."""
    settings.MAX_REQUEST_BODY_BYTES = 64 * 1024
    create_model(login_person("owner", Role.MAINTAINER))
    client = browser("mia", Role.MAINTAINER)
    session, csrf = client.cookies[django_settings.SESSION_COOKIE_NAME].value, client.cookies["csrftoken"].value
    boundary = "uiupload"
    extra = b"w" * (256 * 1024)
    body = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'.encode()
        + b"Content-Type: application/octet-stream\r\n\r\n"
        + data
        + b"\r\n"
        for name, data in (("model.onnx", add_model_bytes()), ("weights.bin", extra))
    )
    body += f"--{boundary}--\r\n".encode()
    connection = http.client.HTTPConnection("127.0.0.1", asgi_server, timeout=60)
    connection.request(
        "POST",
        "/ui/models/demo/upload",
        body=body,
        headers={
            "Content-Type": f"multipart/form-data; boundary={boundary}",
            "Cookie": f"{django_settings.SESSION_COOKIE_NAME}={session}; csrftoken={csrf}",
            "X-CSRFToken": csrf,
            "Origin": f"http://127.0.0.1:{asgi_server}",
            "Host": f"127.0.0.1:{asgi_server}",
        },
    )
    response = connection.getresponse()
    assert response.status == 201, response.read()[:500]
    version = ModelVersion.objects.get()
    assert version.files.get(name="weights.bin").size_bytes == len(extra)
