"""A missing Chromium skips the browser tests on a laptop, and fails them in CI (CI=true)."""

from __future__ import annotations

import pytest

from tests.support.browser import require_chromium


def test_a_missing_browser_fails_under_ci(tmp_path):
    with pytest.raises(pytest.fail.Exception, match="CI is set, so a missing browser is a failure"):
        require_chromium(tmp_path / "no-chromium", {"CI": "true"})


def test_a_missing_browser_skips_without_ci(tmp_path):
    with pytest.raises(pytest.skip.Exception, match="needs Debian's chromium"):
        require_chromium(tmp_path / "no-chromium", {})


def test_a_present_browser_runs(tmp_path):
    browser = tmp_path / "chromium"
    browser.write_text("")
    require_chromium(browser, {"CI": "true"})
