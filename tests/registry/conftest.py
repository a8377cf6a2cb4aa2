"""Fixtures of the registry's tests beyond the suite's own (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from registry.models import Role
from tests.support.people import Person, login_person
from tests.support.signing import KeyPair, key_pair
from tests.support.webhooks import Receiver, webhook_receiver


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


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook endpoint on 127.0.0.1 that records what it is sent."""
    with webhook_receiver() as found:
        yield found


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Deliveries stay in the table instead of going to the delivery thread; each test sends them itself."""
    from registry.webhooks import services as webhooks

    ids: list[int] = []
    monkeypatch.setattr(webhooks, "deliveries_queue", lambda new: ids.extend(new))
    return ids
