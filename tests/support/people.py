"""Named people with roles and API tokens, each with their own test client; made through the real services."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.test import Client, TestCase

from registry.access import services
from registry.audit.chain import SYSTEM, Actor

PASSWORD = "correct horse battery staple"


@dataclass
class Person:
    username: str
    token: str
    client: Client

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.client.get(path, HTTP_AUTHORIZATION=f"Bearer {self.token}", **kwargs)

    def post(self, path: str, data: Any = None, **kwargs: Any) -> Any:
        kwargs.setdefault("content_type", "application/json")
        return self.client.post(path, data, HTTP_AUTHORIZATION=f"Bearer {self.token}", **kwargs)

    def patch(self, path: str, data: Any = None, **kwargs: Any) -> Any:
        kwargs.setdefault("content_type", "application/json")
        return self.client.patch(path, data, HTTP_AUTHORIZATION=f"Bearer {self.token}", **kwargs)

    def put(self, path: str, data: Any = None, **kwargs: Any) -> Any:
        kwargs.setdefault("content_type", "application/json")
        return self.client.put(path, data, HTTP_AUTHORIZATION=f"Bearer {self.token}", **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Any:
        return self.client.delete(path, HTTP_AUTHORIZATION=f"Bearer {self.token}", **kwargs)

    def upload(self, model: str, files: list[tuple[str, bytes]], *, query: str = "", **fields: Any) -> Any:
        """POST a multipart upload; each (name, bytes) becomes one 'file' part, in order, to the path plus ``query``."""
        from django.core.files.uploadedfile import SimpleUploadedFile

        parts = [SimpleUploadedFile(name, data, content_type="application/octet-stream") for name, data in files]
        # Tasks run in-process after commit; inside a test's transaction, run them as the block exits.
        with TestCase.captureOnCommitCallbacks(execute=True):
            return self.client.post(
                f"/api/v1/models/{model}/versions{query}",
                {"file": parts, **fields},
                HTTP_AUTHORIZATION=f"Bearer {self.token}",
            )

    @property
    def actor(self) -> Actor:
        """The person as a service's ``actor``."""
        return Actor(user=get_user_model().objects.get(username=self.username), label=self.username)


def make_person(username: str, *roles: str) -> Person:
    _, raw = services.token_create(username=username, create_user=True, roles=list(roles), actor=SYSTEM)
    return Person(username=username, token=raw, client=Client())


def login_person(username: str, *roles: str) -> Person:
    """A named person with roles and a password, logged in on their test client."""
    person = make_person(username, *roles)
    user = get_user_model().objects.get(username=username)
    user.set_password(PASSWORD)
    user.save(update_fields=["password"])
    person.client.force_login(user)
    return person
