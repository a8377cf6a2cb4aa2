"""The browser the UI tests drive: Debian's Chromium, which CI must have."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def require_chromium(path: Path = CHROMIUM, environ: Mapping[str, str] = os.environ) -> None:
    """Skip a browser test where Chromium is missing, except under ``CI=true``, where a missing browser fails it.

    A skipped browser test would let CI pass without the UI ever being driven.
    """
    if path.exists():
        return
    message = f"needs Debian's chromium at {path} (apt-get install chromium)"
    if environ.get("CI", "").lower() in {"true", "1"}:
        pytest.fail(f"{message}; CI is set, so a missing browser is a failure, not a skip", pytrace=False)
    pytest.skip(message)
