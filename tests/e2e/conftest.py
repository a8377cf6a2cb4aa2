"""Browser tests need Chromium: they skip without it locally, and fail without it in CI."""

from __future__ import annotations

import pytest

from tests.support.browser import require_chromium


@pytest.fixture(autouse=True)
def _chromium() -> None:
    require_chromium()
