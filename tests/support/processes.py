"""Real server processes for tests: free ports, the environment and database URL they get, and ``modelyard serve``."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.conf import settings as django_settings

from modelyard.processes import kill_group
from tests.support import validation_memo
from tests.support.polling import eventually


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_pair() -> int:
    """A free port whose next one is free too: a server's HTTP port, and its gRPC port, which follows it."""
    while True:
        port = free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


def subprocess_database_url() -> str:
    """The URL of the database this test runs on (pytest-django's test database), for subprocesses."""
    database = django_settings.DATABASES["default"]
    assert database["ENGINE"] == "django.db.backends.postgresql", "these tests need the PostgreSQL test database"
    credentials = quote(str(database["USER"] or "postgres"))
    if database.get("PASSWORD"):
        credentials += ":" + quote(str(database["PASSWORD"]))
    host, port = database["HOST"] or "127.0.0.1", database["PORT"] or 5432
    return f"postgres://{credentials}@{host}:{port}/{database['NAME']}"


def base_env(**extra: str) -> dict[str, str]:
    """This process's environment without any MODELYARD_/DJANGO_ setting, plus ``extra``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("MODELYARD_", "DJANGO_"))}
    env.update(DJANGO_SETTINGS_MODULE="modelyard.settings", PYTHONUNBUFFERED="1", MODELYARD_LOG_LEVEL="INFO")
    # A served version's benchmark job would spend seconds of the shared CPU in every test that uploads;
    # tests/inference/test_benchmarks.py turns it on where it is the subject.
    env.update(MODELYARD_BENCHMARKS="false")
    # The registry's key of this test process: a server started here verifies (and signs) what the tests'
    # uploads were signed with, as the hosts of one deployment share it.
    env.update(MODELYARD_SIGNING_KEY=django_settings.SIGNING_KEY.decode())
    # And its encryption keys: a secret one process stores (a webhook's), another reads back.
    env.update(MODELYARD_ENCRYPTION_KEYS=",".join(django_settings.ENCRYPTION_KEYS))
    env.update(extra)
    return env


class ServeProcess:
    """One ``modelyard serve`` process in a process group of its own, killed with the group at the end."""

    def __init__(
        self,
        name: str,
        role: str,
        env: dict[str, str],
        log_path: Path,
        *,
        args: tuple[str, ...] = (),
        host: str = "127.0.0.1",
        netns: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.name = name
        self.role = role
        self.host = host
        self.tls = tls  # a client's context for a server started with --ssl-certfile: then HTTPS
        self.port = free_port()
        self.grpc_port = free_port()  # never the default 8001: tests (and other checkouts) run servers side by side
        self.log_path = log_path
        argv = [sys.executable, "-m", "modelyard.cli", "serve", "--role", role, "--port", str(self.port)]
        argv += ["--grpc-port", str(self.grpc_port)]
        argv += ["--host", host, "--log-level", "warning", *args]
        if netns:  # a host of its own (tests/inference/test_fleet_hosts.py)
            argv = ["ip", "netns", "exec", netns, *argv]
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                argv,
                env=validation_memo.in_servers(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def base(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        timeout: float = 30,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """One HTTP request on a fresh connection; returns (status, JSON body or raw text)."""
        conn: http.client.HTTPConnection
        if self.tls is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        else:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self.tls)
        headers = {"Content-Type": "application/json", **(headers or {})}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            conn.request(method, path, None if body is None else json.dumps(body), headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, raw.decode(errors="replace")

    def wait_ready(self, timeout: float = 120.0) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")
            try:
                path = "/v2/health/ready" if self.role != "web" else "/api/v1/fleet"
                status, _ = self.request("GET", path, timeout=2)
            except OSError:
                return False
            return status in (200, 401, 403)

        eventually(ready, timeout=timeout, interval=0.1, what=lambda: f"{self.name} not ready:\n{self.log()}")

    def kill(self) -> None:
        kill_group(self.process)
