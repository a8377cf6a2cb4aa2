"""Shared fixtures: named people with tokens, an API client per person, and upload helpers."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client, TestCase

from registry import services
from registry.audit import SYSTEM
from registry.models import Role
from storage import get_storage

pytest_plugins = ["tests.s3fixtures"]


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

    def delete(self, path: str, **kwargs: Any) -> Any:
        return self.client.delete(path, HTTP_AUTHORIZATION=f"Bearer {self.token}", **kwargs)

    def upload(self, model: str, files: list[tuple[str, bytes]], **fields: Any) -> Any:
        """POST a multipart upload; each (name, bytes) becomes one 'file' part, in order."""
        from django.core.files.uploadedfile import SimpleUploadedFile

        parts = [SimpleUploadedFile(name, data, content_type="application/octet-stream") for name, data in files]
        # Tasks run in-process after commit; inside a test's transaction, run them as the block exits.
        with TestCase.captureOnCommitCallbacks(execute=True):
            return self.client.post(
                f"/api/v1/models/{model}/versions",
                {"file": parts, **fields},
                HTTP_AUTHORIZATION=f"Bearer {self.token}",
            )


def make_person(username: str, *roles: str) -> Person:
    _, raw = services.token_create(username=username, create_user=True, roles=list(roles), actor=SYSTEM)
    return Person(username=username, token=raw, client=Client())


@pytest.fixture
def owner(db: None) -> Person:
    """A maintainer: creates models and uploads versions."""
    return make_person("owner", Role.MAINTAINER)


@pytest.fixture
def approver(db: None) -> Person:
    return make_person("approver", Role.APPROVER)


@pytest.fixture
def outsider(db: None) -> Person:
    """Signed in, with the viewer role only: may read, may not write."""
    return make_person("outsider", Role.VIEWER)


@pytest.fixture
def registered(owner: Person) -> str:
    response = owner.post("/api/v1/models", {"name": "demo", "description": "a demo model"})
    assert response.status_code == 201, response.content
    return "demo"


@pytest.fixture(autouse=True)
def _fresh_storage(tmp_path: Any, settings: Any) -> Iterator[None]:
    """Each test gets its own artifact folder (S3 tests replace it with a bucket)."""
    from modelyard.env import StorageConfig

    settings.STORAGE = StorageConfig(kind="file", path=str(tmp_path / "artifacts"))
    settings.VALIDATION_WORK_DIR = str(tmp_path / "work")
    get_storage.cache_clear()
    yield
    get_storage.cache_clear()


@pytest.fixture(autouse=True)
def _fresh_rate_counters() -> Iterator[None]:
    """API throttling counts in the cache; each test starts from zero, whatever ran before it."""
    from django.core.cache import cache

    cache.clear()
    yield


@pytest.fixture(scope="session", autouse=True)
def _drop_stray_connections(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """Servers that tests run in threads keep database connections; end them so the test database drops."""
    yield
    from django.db import DatabaseError, connection

    if connection.vendor != "postgresql" or not connection.settings_dict["NAME"].startswith("test_"):
        return  # no test database was set up in this run
    with django_db_blocker.unblock():
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
        except DatabaseError:
            pass  # nothing to clean up
