"""The ``v2`` fixture: one real /v2 and gRPC server for the whole package (``tests/support/v2server.py``).

It serves models registered through the real services; the database is flushed afterwards, as a
transactional test would leave it.
"""

from __future__ import annotations

import gc
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from inference.app import build_app
from inference.dataplane import DataPlane
from inference.grpc.server import GrpcServer
from inference.runtime import InferenceRuntime
from modelyard.env import StorageConfig
from registry.models import RegisteredModel, Role
from storage import get_storage
from tests.support.v2server import (
    HOST,
    MODELS,
    V2Server,
    make_actor,
    register,
    terminate_stray_backends,
    wait_loaded,
    with_grpc,
)


@pytest.fixture(scope="package")
def compat_database(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """The test database, even when no test of this run is marked ``django_db`` (pytest-django then skips it).

    These tests reach the database only through the server and the fixture, never inside a test's
    transaction, so they are not marked; the fixture flushes what it wrote.
    """
    from django.test.utils import setup_databases, teardown_databases

    # _get_test_db_name is Django's own (private, so django-stubs leave it out).
    if connection.settings_dict["NAME"] == connection.creation._get_test_db_name():  # type: ignore[attr-defined]
        yield  # pytest-django already made it for the other tests of this run
        return
    with django_db_blocker.unblock():
        # Django only tests membership in aliases (its test runner passes a dict); django-stubs ask for a Mapping.
        created = setup_databases(verbosity=0, interactive=False, aliases={"default"})  # type: ignore[arg-type]
    yield
    with django_db_blocker.unblock():
        terminate_stray_backends()
        teardown_databases(created, verbosity=0)


@pytest.fixture(scope="package")
def v2(compat_database: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[V2Server]:
    root: Path = tmp_path_factory.mktemp("compat")
    overrides = override_settings(
        STORAGE=StorageConfig(kind="file", path=str(root / "artifacts")),
        VALIDATION_WORK_DIR=str(root / "work"),
        CACHE_DIR=root / "cache",
        INFERENCE_PUBLIC=True,
    )
    with django_db_blocker.unblock(), overrides:
        get_storage.cache_clear()
        runtime: InferenceRuntime | None = None
        server: uvicorn.Server | None = None
        thread: threading.Thread | None = None
        try:
            owner, _ = make_actor("compat-owner", Role.MAINTAINER)
            approver, _ = make_actor("compat-approver", Role.APPROVER)
            admin, _ = make_actor("compat-admin", Role.ADMIN)
            _, inference_token = make_actor("compat-client", Role.INFERENCE)
            _, viewer_token = make_actor("compat-viewer", Role.VIEWER)
            model_bytes: dict[tuple[str, int], bytes] = {}
            for served in MODELS:
                model_bytes |= register(served, owner=owner, approver=approver, admin=admin)
            assert RegisteredModel.objects.count() == len(MODELS)

            runtime = InferenceRuntime(worker_id="compat-tests")
            wait_loaded(runtime, expected=len(model_bytes))

            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((HOST, 0))
            port = sock.getsockname()[1]
            plane = DataPlane(runtime)
            grpc_server = GrpcServer(plane, host=HOST, port=0, reuse_port=False, max_message_bytes=4 * 1024**2)
            app = with_grpc(build_app(runtime, plane=plane), grpc_server)  # gRPC on the loop that serves /v2
            config = uvicorn.Config(app, host=HOST, port=port, log_level="warning", lifespan="on")
            server = uvicorn.Server(config)
            thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="v2-server", daemon=True)
            thread.start()
            deadline = time.monotonic() + 30
            while not server.started:
                assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
                time.sleep(0.02)
            assert grpc_server.port
            yield V2Server(
                port=port,
                grpc_port=grpc_server.port,
                runtime=runtime,
                model_bytes=model_bytes,
                inference_token=inference_token,
                viewer_token=viewer_token,
            )
        finally:
            if runtime is not None:
                runtime.stop()  # while the server's loop still runs: unloading retires its batchers there
            if server is not None:
                server.should_exit = True
            if thread is not None:
                thread.join(timeout=30)
            gc.collect()  # finished worker threads leave their connections to the collector
            terminate_stray_backends()
            call_command("flush", interactive=False, verbosity=0)
            get_storage.cache_clear()
