"""The ``live`` fixture: one embedded ``modelyard serve`` for this package's tests of the user commands."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.embedded import LiveServer, start_live_server


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    found = start_live_server(
        tmp_path_factory.mktemp("live"),
        MODELYARD_WEBHOOK_ALLOW_PRIVATE="true",  # the receiver listens on 127.0.0.1
        MODELYARD_LOGIN_MAX_FAILURES="3",
        MODELYARD_RECONCILE_POLL_SECONDS="0.5",
        MODELYARD_FLEET_HEARTBEAT_SECONDS="0.5",
        MODELYARD_MAX_UPLOAD_BYTES="2000000",
    )
    try:
        yield found
    finally:
        found.server.stop()
