"""Data for the UI tests: people who can log in with a password, and a pending promotion made through services."""

from __future__ import annotations

from django.contrib.auth import get_user_model

from registry import promotions
from registry.audit import Actor
from registry.models import PromotionRequest, RegisteredModel
from tests.conftest import Person, make_person
from tests.onnx_models import add_model_bytes

PASSWORD = "correct horse battery staple"


def login_person(username: str, *roles: str) -> Person:
    """A named person with roles and a password, logged in on their test client."""
    person = make_person(username, *roles)
    user = get_user_model().objects.get(username=username)
    user.set_password(PASSWORD)
    user.save(update_fields=["password"])
    person.client.force_login(user)
    return person


def pending_promotion(requester: Person, *, model: str = "demo") -> PromotionRequest:
    """Register ``model`` with two ready versions and ask, as ``requester``, to put version 1 on production."""
    assert requester.post("/api/v1/models", {"name": model}).status_code == 201
    for bias in (1.0, 2.0):
        response = requester.upload(model, [("m.onnx", add_model_bytes(bias=bias))])
        assert response.status_code == 201, response.content
    outcome = promotions.alias_set(
        model=RegisteredModel.objects.get(name=model),
        alias_name="production",
        version_number=1,
        actor=Actor(user=get_user_model().objects.get(username=requester.username)),
        reason="launch",
    )
    assert outcome.promotion is not None
    return outcome.promotion
