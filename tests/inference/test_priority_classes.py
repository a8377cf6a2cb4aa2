"""Priority classes: a token's class (high, normal, low), set by an admin, orders its requests in the batcher.

The registry side: ``createtoken --priority``, ``POST /api/v1/tokens`` ``priority`` (admins only), the
token page's select, rotation keeping the class, the audit event, and the ``/v2`` grant carrying it.
The data plane side: a real runtime serving a real ONNX Runtime session behind the ``/v2`` Starlette
app and the gRPC server; one run is held (``Gate``) while requests queue, so the order the batcher
takes them in is the order the held runs record.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from django.contrib.auth import get_user_model
from django.test import Client

from inference.batcher import CLASS_HIGH, CLASS_LOW, CLASS_NORMAL
from inference.dataplane import DataPlane
from inference.loaded import LoadedVersion
from modelyard import cli
from registry.access import services
from registry.access.services import PRIORITY_NEEDS_ADMIN
from registry.audit.chain import SYSTEM
from registry.errors import PermissionDenied
from registry.models import ApiToken, AuditEvent, PriorityClass, RegisteredModel, Role, ServiceAccount
from registry.serving import token_grant
from tests.support.inference import AsgiLoop, infer_body
from tests.support.people import make_person
from tests.support.polling import eventually, reconcile_until
from tests.support.registry import create_model, promote, upload_versions

pytestmark = pytest.mark.django_db(transaction=True)  # token checks run in worker threads, as in a server

TOKENS = "/api/v1/tokens"


def session_of(username: str) -> Client:
    browser = Client()
    browser.force_login(get_user_model().objects.get(username=username))
    return browser


def inference_token(username: str, priority: str = PriorityClass.NORMAL) -> str:
    _, raw = services.token_create(
        username=username, create_user=True, roles=[Role.INFERENCE], priority=priority, actor=SYSTEM
    )
    return raw


# --- Setting a token's class ----------------------------------------------------------------------------


def test_createtoken_priority_sets_the_class_and_rotatetoken_keeps_it(owner, capsys):
    assert cli.main(["createtoken", "owner", "--priority", "high"]) == 0
    out, err = capsys.readouterr()
    token = ApiToken.objects.get(key_hash=ApiToken.hash_key(out.strip().splitlines()[-1]))
    assert token.priority == PriorityClass.HIGH
    assert "on every model, priority class high)" in err
    assert AuditEvent.objects.get(action="token.create", target=token.prefix).after["priority"] == "high"

    assert cli.main(["rotatetoken", token.prefix]) == 0
    new = ApiToken.objects.get(rotated_from=token)
    assert new.priority == PriorityClass.HIGH
    assert AuditEvent.objects.get(action="token.create", target=new.prefix).after["priority"] == "high"

    with pytest.raises(SystemExit):
        cli.main(["createtoken", "owner", "--priority", "urgent"])
    assert "invalid choice: 'urgent'" in capsys.readouterr().err
    assert PriorityClass.values == cli.PRIORITY_CLASSES


def test_a_normal_token_records_no_priority_in_its_audit_event(owner):
    token, _ = services.token_create(username="owner", name="plain", actor=SYSTEM)
    assert token.priority == PriorityClass.NORMAL
    event = AuditEvent.objects.get(action="token.create", target=token.prefix)
    assert event.after == {"user": "owner", "name": "plain"}


def test_an_admin_creates_a_high_token_through_the_api_for_itself_and_a_service_account(owner):
    make_person("root", Role.ADMIN)
    services.service_account_create(username="scorer", owner="root", roles=[Role.INFERENCE], actor=SYSTEM)
    admin = session_of("root")
    answer = admin.post(TOKENS, {"name": "mine", "priority": "high"}, content_type="application/json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["priority"] == "high"
    mine = ApiToken.objects.get(prefix=answer.json()["prefix"])
    assert mine.priority == PriorityClass.HIGH
    event = AuditEvent.objects.get(action="token.create", target=mine.prefix)
    assert (event.actor, event.after["priority"]) == ("root", "high")

    answer = admin.post(TOKENS, {"user": "scorer", "priority": "low"}, content_type="application/json")
    assert answer.status_code == 201, answer.content
    theirs = ApiToken.objects.get(prefix=answer.json()["prefix"])
    assert (theirs.user.username, theirs.priority) == ("scorer", PriorityClass.LOW)
    assert ServiceAccount.objects.filter(user=theirs.user).exists()
    # The list and /me show it; a rotation by the API keeps it.
    listed = {t["prefix"]: t["priority"] for t in admin.get(TOKENS).json()["results"]}
    assert (listed[mine.prefix], listed[theirs.prefix]) == ("high", "low")
    me = Client().get("/api/v1/me", HTTP_AUTHORIZATION=f"Bearer {answer.json()['token']}").json()
    assert me["token"]["priority"] == "low"
    rotated = admin.post(f"{TOKENS}/{theirs.prefix}/rotate", {}, content_type="application/json")
    assert rotated.status_code == 201, rotated.content
    assert rotated.json()["priority"] == "low"


def test_only_an_admin_sets_a_class_other_than_normal(owner):
    browser = session_of("owner")
    for priority in ("high", "low"):
        answer = browser.post(TOKENS, {"name": "fast", "priority": priority}, content_type="application/json")
        assert answer.status_code == 403
        assert answer.json() == {"error": PRIORITY_NEEDS_ADMIN, "detail": None}
    assert PRIORITY_NEEDS_ADMIN == "a token's priority class other than normal needs the admin role"
    assert not ApiToken.objects.filter(name="fast").exists()
    assert AuditEvent.objects.filter(action="access.denied", target="POST /api/v1/tokens").count() == 2
    # Normal, said or not, is anyone's.
    answer = browser.post(TOKENS, {"name": "plain", "priority": "normal"}, content_type="application/json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["priority"] == "normal"
    answer = browser.post(TOKENS, {"name": "default"}, content_type="application/json")
    assert (answer.status_code, answer.json()["priority"]) == (201, "normal")
    # The service refuses it to a non-admin actor whichever way it is called.
    with pytest.raises(PermissionDenied, match=f"^{PRIORITY_NEEDS_ADMIN}$"):
        services.token_create(username="owner", priority="high", actor=owner.actor)


def test_an_admin_changes_a_tokens_class_with_patch_audited_as_its_own_event(owner):
    root = make_person("root", Role.ADMIN)
    token, raw = services.token_create(username="owner", name="scorer", actor=SYSTEM)
    assert token_grant(raw).priority == "normal"
    answer = root.client.patch(
        f"{TOKENS}/{token.prefix}",
        {"priority": "high"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {root.token}",
    )
    assert answer.status_code == 200, answer.content
    assert (answer.json()["prefix"], answer.json()["priority"]) == (token.prefix, "high")
    token.refresh_from_db()
    assert token.priority == PriorityClass.HIGH
    event = AuditEvent.objects.get(action="token.priority", target=token.prefix)
    assert (event.actor, event.before, event.after) == (
        "root",
        {"priority": "normal"},
        {"user": "owner", "name": "scorer", "priority": "high"},
    )
    assert token_grant(raw).priority == "high"
    # The same class again records nothing.
    again = root.client.patch(
        f"{TOKENS}/{token.prefix}",
        {"priority": "high"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {root.token}",
    )
    assert again.status_code == 200
    assert AuditEvent.objects.filter(action="token.priority").count() == 1


def test_a_non_admin_cannot_change_a_class_and_a_bad_class_is_400(owner):
    token, _ = services.token_create(username="owner", name="mine", actor=SYSTEM)
    browser = session_of("owner")
    refused = browser.patch(f"{TOKENS}/{token.prefix}", {"priority": "high"}, content_type="application/json")
    assert refused.status_code == 403
    assert refused.json() == {"error": PRIORITY_NEEDS_ADMIN, "detail": None}
    token.refresh_from_db()
    assert token.priority == PriorityClass.NORMAL
    assert not AuditEvent.objects.filter(action="token.priority").exists()
    make_person("root", Role.ADMIN)
    admin = session_of("root")
    bad = admin.patch(f"{TOKENS}/{token.prefix}", {"priority": "urgent"}, content_type="application/json")
    assert bad.status_code == 400
    assert "priority" in bad.json()["detail"]
    assert admin.patch(f"{TOKENS}/nosuch", {"priority": "low"}, content_type="application/json").status_code == 404
    services.token_revoke(token=token, actor=SYSTEM)
    gone = admin.patch(f"{TOKENS}/{token.prefix}", {"priority": "low"}, content_type="application/json")
    assert gone.status_code == 409
    assert gone.json()["error"] == f"API token {token.prefix} is revoked: its priority class no longer matters"


def test_an_unknown_class_is_400(owner):
    make_person("root", Role.ADMIN)
    answer = session_of("root").post(TOKENS, {"priority": "urgent"}, content_type="application/json")
    assert answer.status_code == 400
    assert "priority" in answer.json()["detail"]
    assert not ApiToken.objects.filter(user__username="root", priority="urgent").exists()


def test_the_token_page_offers_the_class_to_admins_only(owner):
    make_person("root", Role.ADMIN)
    admin = session_of("root")
    page = admin.get("/ui/tokens").content.decode()
    assert '<select id="id_priority" name="priority">' in page
    assert '<option value="normal" selected>' in page
    created = admin.post("/ui/tokens", {"name": "batch", "priority": "low"})
    assert created.status_code == 200
    token = ApiToken.objects.get(user__username="root", name="batch")
    assert token.priority == PriorityClass.LOW
    assert '<td class="priority">low</td>' in created.content.decode()

    person = session_of("owner")
    assert 'name="priority"' not in person.get("/ui/tokens").content.decode()
    plain = person.post("/ui/tokens", {"name": "plain"})  # what the browser sends: no priority field
    assert plain.status_code == 200
    assert ApiToken.objects.get(user__username="owner", name="plain").priority == PriorityClass.NORMAL
    refused = person.post("/ui/tokens", {"name": "sneaky", "priority": "high"})
    assert refused.status_code == 403
    assert "priority class other than normal needs the admin role" in refused.content.decode()
    assert not ApiToken.objects.filter(name="sneaky").exists()


def test_the_v2_grant_carries_the_tokens_class():
    assert token_grant(inference_token("fast", PriorityClass.HIGH)).priority == "high"
    assert token_grant(inference_token("slow", PriorityClass.LOW)).priority == "low"
    assert token_grant(inference_token("plain")).priority == "normal"
    assert token_grant("my_000000000000_nope").priority == "normal"  # refused: no class to speak of


# --- The data plane ----------------------------------------------------------------------------------------


class Gate:
    """Wraps a loaded version's ONNX Runtime run: records each run's first input value, holds runs while shut."""

    def __init__(self, loaded: LoadedVersion, monkeypatch: pytest.MonkeyPatch) -> None:
        self.order: list[float] = []
        self.running = threading.Event()
        self.open = threading.Event()
        real = loaded.run

        def gated(feeds: dict[str, Any], output_names: list[str] | None = None) -> Any:
            self.order.append(float(feeds["x"].reshape(-1)[0]))
            self.running.set()
            assert self.open.wait(30), "the gate was never opened"
            return real(feeds, output_names)

        monkeypatch.setattr(loaded, "run", gated)


@pytest.fixture
def served(owner, approver, make_runtime) -> Any:
    """A runtime serving demo v1 (y = x + 1), each request in a run of its own (batching off), one run at a time."""
    create_model(owner)
    upload_versions(owner, [1.0])
    RegisteredModel.objects.filter(name="demo").update(batching="off", instances=1)
    promote(owner, approver, 1)
    runtime = make_runtime()
    reconcile_until(runtime, lambda: runtime.router.resolve("demo"), what="demo never served")
    return runtime


def queued_now(loaded: LoadedVersion, count: int) -> bool:
    return loaded.batcher.queued == count


def x_of(value: float) -> np.ndarray:
    return np.full((1, 4), value, dtype=np.float32)


def over_http(app: Any, loop: AsgiLoop) -> Callable[[str, float, int], tuple[int, Any]]:
    def send(token: str, value: float, priority: int) -> tuple[int, Any]:
        body = {**infer_body(x_of(value)), "parameters": {"priority": priority}}
        status, answer = loop.request(app, "POST", "/v2/models/demo/infer", body, token=token)
        assert status == 200, answer
        return status, answer

    return send


def over_grpc(port: int) -> Callable[[str, float, int], tuple[int, Any]]:
    def send(token: str, value: float, priority: int) -> tuple[int, Any]:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
            tensor = grpcclient.InferInput("x", [1, 4], "FP32")
            tensor.set_data_from_numpy(x_of(value))
            result = client.infer("demo", [tensor], priority=priority, headers={"authorization": f"Bearer {token}"})
        return 200, result.as_numpy("y")

    return send


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_high_tokens_request_queued_behind_normal_ones_runs_first(served, asgi_loop, monkeypatch, transport):
    from inference.app import build_app
    from inference.grpc.server import GrpcServer

    plane = DataPlane(served)
    loaded = plane.resolve("demo")
    gate = Gate(loaded, monkeypatch)
    normal, high, low = inference_token("plain"), inference_token("fast", "high"), inference_token("slow", "low")
    server = GrpcServer(plane, host="127.0.0.1", port=0, reuse_port=False, max_message_bytes=1 << 20)
    if transport == "http":
        send = over_http(build_app(served, plane=plane), asgi_loop)
    else:
        port = asyncio.run_coroutine_threadsafe(server.start(), asgi_loop.loop).result(timeout=30)
        send = over_grpc(port)
    try:
        with ThreadPoolExecutor(max_workers=6) as pool:
            try:
                first = pool.submit(send, normal, 0.0, 0)
                assert gate.running.wait(20), "the first run never started"
                queued = []
                # The low token's request is first in line and asks for the highest priority within its class;
                # the normal ones ask for a high priority; the high token's comes last and asks for the lowest.
                for token, value, priority in ((low, 5.0, 1), (normal, 1.0, 1), (normal, 2.0, 1), (high, 9.0, 1000)):
                    queued.append(pool.submit(send, token, value, priority))
                    eventually(partial(queued_now, loaded, len(queued)), what=f"{len(queued)} requests queued")
                assert loaded.batcher.queued_by_class() == {"high": 1, "normal": 2, "low": 1, "job": 0}
            finally:
                gate.open.set()
            for future in (first, *queued):
                assert future.result(timeout=30)[0] == 200
    finally:
        if transport == "grpc":
            asyncio.run_coroutine_threadsafe(server.stop(), asgi_loop.loop).result(timeout=30)
    assert gate.order == [0.0, 9.0, 1.0, 2.0, 5.0]


def test_admission_gives_the_tokens_class_and_normal_when_v2_is_public(served, asgi_loop, settings):
    plane = DataPlane(served)

    def klass_of(token: str) -> int:
        admitted = asyncio.run_coroutine_threadsafe(
            plane.admit("demo", None, token, token=lambda raw: raw, address=lambda _: "127.0.0.1"), asgi_loop.loop
        ).result(timeout=30)
        admitted.answered(200)
        return admitted.klass

    high, low = inference_token("fast", "high"), inference_token("slow", "low")
    assert (klass_of(high), klass_of(low), klass_of(inference_token("plain"))) == (CLASS_HIGH, CLASS_LOW, CLASS_NORMAL)
    settings.INFERENCE_PUBLIC = True  # auth off: no token is read, every request is of the normal class
    assert (klass_of(high), klass_of(low), klass_of("")) == (CLASS_NORMAL, CLASS_NORMAL, CLASS_NORMAL)
