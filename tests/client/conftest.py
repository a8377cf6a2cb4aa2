"""The ``live`` fixture: one embedded ``modelyard serve`` for this package's tests of the Python client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.embedded import LiveServer, start_live_server


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    found = start_live_server(tmp_path_factory.mktemp("client"), MODELYARD_RECONCILE_POLL_SECONDS="0.5")
    try:
        yield found
    finally:
        found.server.stop()
