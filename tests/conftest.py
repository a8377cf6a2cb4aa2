"""Fixtures the whole suite shares: named people, a fresh artifact folder and rate counters per test, S3.

Only fixtures are declared here; the helpers behind them live in ``tests/support``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest

from registry.models import Role
from storage import get_storage
from tests.support.people import Person, make_person
from tests.support.s3 import S3_PREFIX, delete_bucket, moto_server
from tests.support.scheduling import SuiteOrder, check_groups_arrived, mark_groups
from tests.support.validation_memo import HOOK, remembered_validate_in_child, share_with_workers, stop_sharing

# The validation memo's folder, in the process that made it (tests/support/validation_memo.py).
MEMO_FOLDER = pytest.StashKey[Path | None]()


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SuiteOrder(), "modelyard-suite-order")
    config.stash[MEMO_FOLDER] = share_with_workers()


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(MEMO_FOLDER, None)
    if folder is not None:
        stop_sharing(folder)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that share a broker, a queue, network namespaces or a module's server go on one worker."""
    mark_groups(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """On an xdist worker, refuse to run if the groups did not reach the scheduler (see pyproject's pytest pin)."""
    check_groups_arrived(session.config, session.items)


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
def one_failure_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    """Failed logins and tokens are counted per source and calendar minute (``registry.access.refusals``):
    a test that crossed a minute's end on a busy machine would see a second ``auth.failed``. With this
    fixture, its failures all fall in the minute the test started in."""
    from django.utils import timezone

    from registry.access import refusals

    started = timezone.now()
    monkeypatch.setattr(refusals, "timezone", SimpleNamespace(now=lambda: started))


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
def _remembered_validation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each distinct bundle is validated for real once per session (tests/support/validation_memo.py)."""
    if request.node.get_closest_marker("real_validation") is None:
        monkeypatch.setattr(HOOK, remembered_validate_in_child)


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


# --- S3 (moto over HTTP) ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """Start moto's S3 server once per session; returns its endpoint URL."""
    with moto_server() as url:
        yield url


@pytest.fixture(scope="session")
def s3_client(s3_endpoint: str) -> Any:
    return boto3.session.Session().client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")


@pytest.fixture
def s3_bucket(s3_client: Any) -> Iterator[str]:
    """A fresh, uniquely named bucket; emptied and deleted afterwards."""
    name = f"modelyard-test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=name)
    try:
        yield name
    finally:
        delete_bucket(s3_client, name)


@pytest.fixture
def s3_settings(settings: Any, s3_endpoint: str, s3_bucket: str) -> Iterator[Any]:
    """Point Django's artifact storage at the moto bucket, under the key prefix ``pfx``."""
    from modelyard.env import StorageConfig

    get_storage.cache_clear()
    settings.STORAGE = StorageConfig(kind="s3", bucket=s3_bucket, prefix=S3_PREFIX)
    settings.S3_ENDPOINT_URL = s3_endpoint
    settings.S3_REGION = "us-east-1"
    settings.S3_ADDRESSING_STYLE = "path"
    yield settings
    get_storage.cache_clear()
