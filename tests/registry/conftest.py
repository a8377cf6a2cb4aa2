"""Fixtures of the registry's tests beyond the suite's own (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.signing import KeyPair, key_pair


@pytest.fixture
def ml_team(settings: Any, tmp_path: Path) -> KeyPair:
    """A P-256 key the registry trusts as 'ml-team' (MODELYARD_TRUSTED_SIGNERS)."""
    pair = key_pair(tmp_path, "ml-team")
    settings.TRUSTED_SIGNERS = [("ml-team", pair.public_path)]
    return pair
