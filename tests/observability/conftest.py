"""The ``live`` fixture: one real ``modelyard serve --role all --workers 2`` per module (``tests/support/live.py``).

Like the compat tests' server, it works on committed data outside any test's transaction, and
flushes the database afterwards.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from modelyard.env import StorageConfig
from storage import get_storage
from tests.support.live import LiveServer, start_live_server
from tests.support.v2server import terminate_stray_backends

REDIS_URL = f"redis://127.0.0.1:6379/{os.environ.get('MODELYARD_TEST_REDIS_DB', '0')}"


@pytest.fixture(scope="module")
def live_database(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """The test database, also when no test of this run is marked ``django_db`` (pytest-django then skips it)."""
    from django.test.utils import setup_databases, teardown_databases

    # _get_test_db_name is Django's own (private, so django-stubs leave it out).
    if connection.settings_dict["NAME"] == connection.creation._get_test_db_name():  # type: ignore[attr-defined]
        yield
        return
    with django_db_blocker.unblock():
        # Django only tests membership in aliases (its test runner passes a dict); django-stubs ask for a Mapping.
        created = setup_databases(verbosity=0, interactive=False, aliases={"default"})  # type: ignore[arg-type]
    yield
    with django_db_blocker.unblock():
        terminate_stray_backends()
        teardown_databases(created, verbosity=0)


@pytest.fixture(scope="module")
def live(live_database: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("live")
    queue = redis.Redis.from_url(REDIS_URL)
    queue.delete("celery")
    overrides = override_settings(
        STORAGE=StorageConfig(kind="file", path=str(root / "artifacts")),
        VALIDATION_WORK_DIR=str(root / "work"),
    )
    server = None
    with django_db_blocker.unblock(), overrides:
        get_storage.cache_clear()
        try:
            server = start_live_server(root, redis_url=REDIS_URL)
            yield server
        finally:
            if server is not None:
                server.server.kill()
            queue.delete("celery")
            gc.collect()
            terminate_stray_backends()
            call_command("flush", interactive=False, verbosity=0)
            get_storage.cache_clear()
