"""Fixtures of the registry's tests beyond the suite's own (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from registry.models import Role
from tests.support.people import Person, login_person
from tests.support.signing import KeyPair, key_pair


@pytest.fixture
def ml_team(settings: Any, tmp_path: Path) -> KeyPair:
    """A P-256 key the registry trusts as 'ml-team' (MODELYARD_TRUSTED_SIGNERS)."""
    pair = key_pair(tmp_path, "ml-team")
    settings.TRUSTED_SIGNERS = [("ml-team", pair.public_path)]
    return pair


# The people of the web UI's tests, each logged in with one role (a test file may define its own).
@pytest.fixture
def mia() -> Person:
    return login_person("mia", Role.MAINTAINER)


@pytest.fixture
def ana() -> Person:
    return login_person("ana", Role.APPROVER)


@pytest.fixture
def vic() -> Person:
    return login_person("vic", Role.VIEWER)
