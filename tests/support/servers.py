"""Servers a test runs of its own: a private PostgreSQL cluster, and the registry API of a serve process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import requests

from tests.support.polling import eventually
from tests.support.processes import ServeProcess, base_env, free_port


def inference_env(name: str, data_dir: Path, database_url: str, storage: Path) -> dict[str, str]:
    return base_env(
        MODELYARD_DATABASE_URL=database_url,
        MODELYARD_STORAGE_URL=storage.as_uri(),
        MODELYARD_DATA_DIR=str(data_dir),
        MODELYARD_INFERENCE_PUBLIC="true",
        MODELYARD_RECONCILE_POLL_SECONDS="0.5",
        MODELYARD_FLEET_HEARTBEAT_SECONDS="0.5",
        MODELYARD_WORKER_ID=name,
        MODELYARD_PROVIDERS="cpu",
        MODELYARD_ORT_INTRA_OP_THREADS="1",
    )


class PrivatePostgres:
    """A PostgreSQL server of this test's own, in a temporary folder on a free port (run as postgres if root)."""

    def __init__(self, bindir: Path, *, host: str = "127.0.0.1", netns: str | None = None) -> None:
        self.bindir = bindir
        self.host = host
        self.netns = netns  # a host of its own (tests/inference/test_fleet_hosts.py)
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="modelyard-pg-"))
        self.data = self.folder / "data"
        self.log = self.folder / "server.log"
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")

    @property
    def url(self) -> str:
        return f"postgres://postgres@{self.host}:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        argv = [str(self.bindir / tool), *args]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.folder)
        if result.returncode != 0:
            log = self.log.read_text(errors="replace") if self.log.exists() else ""
            raise AssertionError(f"{tool} failed ({result.returncode}): {result.stdout}{result.stderr}\n{log}")

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses={self.host} -k {self.folder} -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")

    def stop(self, mode: str = "immediate") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self.stop()
            except AssertionError:
                pass
        shutil.rmtree(self.folder, ignore_errors=True)


def createtoken(env: dict[str, str], username: str, *roles: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "modelyard.cli", "createtoken", username, "--create-user"]
    for role in roles:
        argv += ["--role", role]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def token_of(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return out.strip().splitlines()[-1]


class Api:
    """The registry REST API of a serve process, as one person."""

    def __init__(self, server: ServeProcess, token: str) -> None:
        self.base = f"{server.base}/api/v1"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """Retry while the server answers 5xx or not at all (its database connection may be coming back)."""
        last: Any = None

        def attempt() -> list[requests.Response]:
            nonlocal last
            try:
                last = self.session.request(method, self.base + path, timeout=30, **kwargs)
            except requests.RequestException as exc:
                last = exc
                return []
            return [last] if last.status_code < 500 else []  # a Response of a 4xx is falsy itself

        [response] = eventually(attempt, timeout=30, interval=0.2, what=lambda: f"{method} {path}: {last}")
        return response


def is_ready(api: Api, number: int) -> bool:
    return bool(api.call("GET", f"/models/demo/versions/{number}").json()["status"] == "ready")
