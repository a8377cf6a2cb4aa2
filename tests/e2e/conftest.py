"""Browser tests need Chromium: they skip without it locally, and fail without it in CI."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, require_chromium


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
