"""Least privilege for API tokens on the registry API: a subset of the user's roles, and models by name pattern."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from modelyard import cli
from registry.access import services
from registry.access.scopes import TokenModelScope, model_in_scope, out_of_scope_message
from registry.audit.chain import SYSTEM
from registry.errors import InvalidInput
from registry.models import ApiToken, AuditEvent, DeriveJob, DeriveRecipe, Role
from tests.support.people import Person, make_person
from tests.support.registry import create_model, set_alias, upload_versions

pytestmark = pytest.mark.django_db

TOKENS = "/api/v1/tokens"
OTHER_REFUSAL = out_of_scope_message("other", ["fraud-*"])


def session_of(username: str) -> Client:
    browser = Client()
    browser.force_login(get_user_model().objects.get(username=username))
    return browser


def scoped(username: str, *, only_roles: list[str] | None, models: list[str] = ()) -> Person:  # type: ignore[assignment]
    _, raw = services.token_create(username=username, only_roles=only_roles, model_patterns=models, actor=SYSTEM)
    return Person(username=username, token=raw, client=Client())


@pytest.fixture
def models(owner: Person) -> None:
    for name in ("fraud-scorer", "other"):
        create_model(owner, name)


def test_a_session_creates_a_token_limited_to_some_roles_and_models(owner):
    make_person("owner", Role.INFERENCE)  # owner: maintainer and inference
    answer = session_of("owner").post(
        TOKENS, {"name": "scorer", "roles": ["inference"], "models": ["fraud-*"]}, content_type="application/json"
    )
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert (body["roles"], body["models"], body["user"]) == (["inference"], ["fraud-*"], "owner")
    token = ApiToken.objects.get(prefix=body["prefix"])
    assert (token.roles, token.model_patterns) == (["inference"], ["fraud-*"])
    event = AuditEvent.objects.get(action="token.create", target=token.prefix)
    assert event.after == {"user": "owner", "name": "scorer", "roles": ["inference"], "models": ["fraud-*"]}
    # It reads back with its limits, and /me says what it carries.
    me = Client().get("/api/v1/me", HTTP_AUTHORIZATION=f"Bearer {body['token']}").json()
    assert me["roles"] == ["inference"]
    assert (me["token"]["roles"], me["token"]["models"]) == (["inference"], ["fraud-*"])


def test_a_token_asking_for_a_role_its_user_lacks_is_refused_with_400(owner):
    answer = session_of("owner").post(TOKENS, {"roles": ["approver"]}, content_type="application/json")
    assert answer.status_code == 400
    assert answer.json()["error"] == (
        "'owner' does not hold the role(s) approver, and a token carries only roles its user holds "
        "(theirs: maintainer); grant the role to the user first"
    )
    assert ApiToken.objects.filter(user__username="owner").count() == 1
    assert not AuditEvent.objects.filter(action="token.create", actor="owner").exists()


def test_bad_roles_and_model_patterns_are_refused_with_400(owner):
    browser = session_of("owner")
    unknown = browser.post(TOKENS, {"roles": ["root"]}, content_type="application/json")
    assert unknown.status_code == 400
    assert unknown.json()["error"] == 'roles: 0: "root" is not a valid choice.'
    bad = browser.post(TOKENS, {"models": ["Fraud/*"]}, content_type="application/json")
    assert bad.status_code == 400
    assert bad.json()["error"] == (
        "bad model pattern 'Fraud/*': use a model name, with * ? or [...] as wildcards "
        "(lowercase letters, digits, '.', '_', '-'; at most 64 characters)"
    )
    with pytest.raises(InvalidInput, match="a token limited to roles needs at least one role"):
        services.token_create(username="owner", only_roles=[], actor=SYSTEM)
    assert ApiToken.objects.filter(user__username="owner").count() == 1


def test_a_token_limited_to_fraud_models_gets_403_on_other_models_and_lists_only_its_own(owner, models):
    limited = scoped("owner", only_roles=None, models=["fraud-*"])
    assert limited.get("/api/v1/models/fraud-scorer").status_code == 200
    refused = limited.get("/api/v1/models/other")
    assert (refused.status_code, refused.json()["error"]) == (403, OTHER_REFUSAL)
    assert limited.get("/api/v1/models/other/versions").status_code == 403
    assert [m["name"] for m in limited.get("/api/v1/models").json()["results"]] == ["fraud-scorer"]
    # Writes: the same 403, audited with who was refused; creating a model outside the patterns too.
    upload = limited.upload("other", [("model.onnx", b"x")])
    assert (upload.status_code, upload.json()["error"]) == (403, OTHER_REFUSAL)
    denied = AuditEvent.objects.get(action="access.denied")
    assert (denied.actor, denied.after["reason"]) == ("owner", OTHER_REFUSAL)
    created = limited.post("/api/v1/models", {"name": "churn"})
    assert (created.status_code, created.json()["error"]) == (403, out_of_scope_message("churn", ["fraud-*"]))
    assert limited.post("/api/v1/models", {"name": "fraud-new"}).status_code == 201
    # The owner's unlimited token still reaches everything.
    assert owner.get("/api/v1/models/other").status_code == 200


def test_a_derive_job_of_another_model_is_out_of_a_limited_tokens_reach(owner, models):
    source = upload_versions(owner, [1.0], model="other")[0]
    job = DeriveJob.objects.create(source=source, recipe=DeriveRecipe.FP16)
    limited = scoped("owner", only_roles=None, models=["fraud-*"])
    refused = limited.get(f"/api/v1/derive-jobs/{job.pk}")
    assert (refused.status_code, refused.json()["error"]) == (403, OTHER_REFUSAL)
    assert owner.get(f"/api/v1/derive-jobs/{job.pk}").status_code == 200


def _api_routes(resolver: URLResolver | None = None, prefix: str = "") -> list[tuple[str, type]]:
    found: list[tuple[str, type]] = []
    for entry in (resolver or get_resolver()).url_patterns:
        if isinstance(entry, URLResolver):
            found += _api_routes(entry, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern) and hasattr(entry.callback, "cls"):
            found.append((prefix + str(entry.pattern), entry.callback.cls))
    return [(route, cls) for route, cls in found if route.startswith("api/v1/")]


# The routes that name an object by id without a model in the URL, and are not about one model.
NOT_OF_ONE_MODEL = {"api/v1/tokens/<str:prefix>", "api/v1/tokens/<str:prefix>/rotate"}
NOT_OF_ONE_MODEL |= {"api/v1/service-accounts/<str:username>"}
NOT_OF_ONE_MODEL |= {"api/v1/webhooks/<int:pk>", "api/v1/webhooks/<int:pk>/deliveries"}  # admins only


def test_every_api_route_of_a_model_checks_the_tokens_model_patterns():
    """A new view that overrides its throttle classes, or names a model's object by id, must keep the check."""
    routes = _api_routes()
    assert len(routes) > 40
    for route, cls in routes:
        assert any(isinstance(throttle, TokenModelScope) for throttle in cls().get_throttles()), route
        if "<" in route and "<str:name>" not in route and route not in NOT_OF_ONE_MODEL:
            assert hasattr(cls, "scoped_model"), f"{route} names an object by id: give {cls.__name__} scoped_model"


def test_an_inference_only_token_of_a_maintainer_cannot_promote(owner, approver, models):
    upload_versions(owner, [1.0], model="fraud-scorer")
    make_person("owner", Role.INFERENCE)
    limited = scoped("owner", only_roles=[Role.INFERENCE], models=["fraud-*"])
    refused = set_alias(limited, "production", 1, model="fraud-scorer")
    assert (refused.status_code, refused.json()["error"]) == (403, "this action needs the maintainer or admin role")
    assert not AuditEvent.objects.filter(action__startswith="promotion.").exists()
    assert AuditEvent.objects.filter(action="access.denied", actor="owner").count() == 1
    # An approver's token limited to fraud-* cannot decide a promotion of another model either.
    upload_versions(owner, [1.0], model="other")
    asked = set_alias(owner, "production", 1, model="other")
    assert asked.status_code == 202
    approver_limited = scoped("approver", only_roles=None, models=["fraud-*"])
    decided = approver_limited.post(f"/api/v1/promotions/{asked.json()['id']}/approve", {"reason": "ok"})
    assert (decided.status_code, decided.json()["error"]) == (403, OTHER_REFUSAL)
    assert approver_limited.get("/api/v1/promotions").json()["count"] == 0
    assert approver.get("/api/v1/promotions").json()["count"] == 1


def test_lowering_the_users_roles_lowers_the_tokens_at_once(owner, admin_person):
    limited = scoped("owner", only_roles=[Role.MAINTAINER])
    assert limited.post("/api/v1/models", {"name": "first"}).status_code == 201
    services.user_update_access(username="owner", roles=[Role.VIEWER], actor=admin_person.actor)
    refused = limited.post("/api/v1/models", {"name": "second"})
    assert (refused.status_code, refused.json()["error"]) == (403, "this action needs the maintainer or admin role")
    assert ApiToken.objects.get(user__username="owner", roles__isnull=False).roles == ["maintainer"]
    me = limited.get("/api/v1/me").json()
    assert me["roles"] == []  # it names maintainer, which the user no longer holds, and not viewer
    assert AuditEvent.objects.get(action="user.roles.revoke", target="owner").after == {"roles": ["maintainer"]}


def test_an_admins_token_limited_to_viewer_is_no_admin(admin_person):
    limited = scoped("admin", only_roles=[Role.VIEWER])
    refused = limited.get("/api/v1/webhooks")
    assert (refused.status_code, refused.json()["error"]) == (403, "webhooks need the admin role")
    assert admin_person.get("/api/v1/webhooks").status_code == 200
    # An admin holds every role, so an admin's token may carry any.
    token, _ = services.token_create(username="admin", only_roles=[Role.APPROVER], actor=SYSTEM)
    assert token.roles == ["approver"]


def test_fnmatch_patterns():
    assert model_in_scope("fraud-scorer", ["fraud-*"])
    assert not model_in_scope("other", ["fraud-*"])
    assert model_in_scope("anything", [])
    assert model_in_scope("v1-b", ["v?-[ab]"]) and not model_in_scope("v1-c", ["v?-[ab]"])


def test_createtoken_only_role_and_only_model(owner, capsys):
    assert cli.main(["createtoken", "owner", "--only-role", "maintainer", "--only-model", "fraud-*"]) == 0
    out, err = capsys.readouterr()
    token = ApiToken.objects.get(key_hash=ApiToken.hash_key(out.strip().splitlines()[-1]))
    assert (token.roles, token.model_patterns) == (["maintainer"], ["fraud-*"])
    assert f"Created token {token.prefix} for owner (no new roles; carries roles maintainer, on models fraud-*)" in err
    # --role still grants the user a role; --only-role asks for one the user must hold.
    assert cli.main(["createtoken", "owner", "--only-role", "approver"]) == 2
    assert "modelyard createtoken: 'owner' does not hold the role(s) approver" in capsys.readouterr().err
    assert cli.main(["createtoken", "owner", "--role", "inference", "--only-role", "inference"]) == 0
    assert AuditEvent.objects.filter(action="user.roles.grant", target="owner", after__roles=["inference"]).exists()


def test_the_command_line_lists_every_role():
    assert Role.values == cli.ROLES


@pytest.fixture
def admin_person() -> Person:
    return make_person("admin", Role.ADMIN)


def test_the_token_page_creates_a_limited_token_and_rotates_it(owner):
    browser = session_of("owner")
    page = browser.post("/ui/tokens", {"name": "scorer", "roles": ["maintainer"], "models": "fraud-*, churn"})
    assert page.status_code == 200
    token = ApiToken.objects.get(user__username="owner", name="scorer")
    assert (token.roles, token.model_patterns) == (["maintainer"], ["churn", "fraud-*"])
    html = page.content.decode()
    assert f"Token {token.prefix} created." in html
    assert "churn, fraud-*" in html
    refused = browser.post("/ui/tokens", {"roles": ["admin"]})
    assert refused.status_code == 400
    assert "&#x27;owner&#x27; does not hold the role(s) admin" in refused.content.decode()

    rotated = browser.post(f"/ui/tokens/{token.prefix}/rotate", {"overlap_hours": "1"})
    assert rotated.status_code == 200
    new = ApiToken.objects.get(rotated_from=token)
    assert (new.name, new.roles, new.model_patterns) == ("scorer", ["maintainer"], ["churn", "fraud-*"])
    assert f"It replaces token {token.prefix}, which works until" in rotated.content.decode()
    event = AuditEvent.objects.get(action="token.rotate", target=token.prefix)
    assert (event.actor, event.after["overlap_seconds"]) == ("owner", 3600)
    # Someone else's token is not found, as in the API.
    other = make_person("someone", Role.VIEWER)
    stranger = session_of("someone").post(f"/ui/tokens/{new.prefix}/rotate", {})
    assert stranger.status_code == 404
    assert other.get("/api/v1/me").status_code == 200
    assert AuditEvent.objects.filter(action="token.rotate").count() == 1
