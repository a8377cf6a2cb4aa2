"""Browser tests need Chromium: they skip without it locally, and fail without it in CI.

Most of them drive a real ``modelyard serve --role all`` (``server``, one per test module); those that
write models here for it to read ask for ``shared_storage`` too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command

from modelyard.env import StorageConfig
from storage import get_storage
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, require_chromium
from tests.support.ui import UiServer


@pytest.fixture(autouse=True)
def _chromium() -> None:
    require_chromium()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium for a test module, driven by Playwright."""
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop in this thread, and Django then refuses every query as
    # if it ran inside that loop. None does: the tests query between browser calls, never within them.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                yield launched
            finally:
                launched.close()


@pytest.fixture(scope="module")
def server(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[UiServer]:
    """A real server (``tests/support/ui.py``) on the test database, for a test module."""
    running = UiServer(tmp_path_factory.mktemp("ui-server"))
    try:
        yield running.start()
    finally:
        running.stop()
        # The server heartbeats into the fleet table until it dies, after the last test's flush: the
        # next test on this worker would see an "e2e-inference" member that is not its own.
        with django_db_blocker.unblock():
            call_command("flush", interactive=False, verbosity=0)


@pytest.fixture
def shared_storage(server: UiServer, settings: Any) -> Iterator[None]:
    """This process writes where the server reads."""
    settings.STORAGE = StorageConfig(kind="file", path=str(server.storage))
    get_storage.cache_clear()
    yield
    get_storage.cache_clear()
