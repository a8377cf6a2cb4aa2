"""``modelyard`` as a user runs it: the embedded default (SQLite and artifacts in a data folder) in real processes."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from modelyard.processes import kill_group
from tests.support import validation_memo
from tests.support.forkserver import fork_server
from tests.support.processes import free_port

MODELYARD = str(Path(sys.executable).with_name("modelyard"))


def embedded_env(data_dir: Path, home: Path | None = None, **extra: str) -> dict[str, str]:
    """No configuration at all, as on a laptop, plus ``extra``; ``home`` keeps saved profiles out of the real one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELYARD_") and k != "DJANGO_SETTINGS_MODULE"}
    env["MODELYARD_DATA_DIR"] = str(data_dir)
    if home is not None:
        env["HOME"] = str(home)
        env["XDG_CONFIG_HOME"] = str(home / ".config")
    env.update(extra)
    return env


def answers(url: str, timeout: float = 2.0) -> int | None:
    """The status a GET of ``url`` gets, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


class EmbeddedServer:
    """``modelyard serve`` on the embedded default in a process group of its own; stopped with the group."""

    def __init__(
        self, env: dict[str, str], log_path: Path, *, cwd: Path | None = None, args: tuple[str, ...] = ()
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                # gRPC never on the default 8001: tests (and other checkouts) run servers side by side
                [
                    MODELYARD,
                    "serve",
                    "--port",
                    str(self.port),
                    "--grpc-port",
                    str(free_port()),
                    "--log-level",
                    "warning",
                    *args,  # a later --log-level wins
                ],
                env=validation_memo.in_servers(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while answers(f"{self.url}/readyz") != 200:
            if self.process.poll() is not None:
                raise AssertionError(f"modelyard serve exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"modelyard serve was not ready within {timeout} s:\n{self.log()}")
            time.sleep(0.2)

    def stop(self) -> None:
        kill_group(self.process, timeout=30)


def modelyard(
    env: dict[str, str], *args: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one ``modelyard`` command as a user would; returns its exit status and output.

    It runs in a process of its own, forked from one that has already imported the command line
    (:mod:`tests.support.forkserver`): the same command, without Python's start each time.
    """
    return fork_server().run(list(args), env=env, cwd=cwd, stdin=stdin, timeout=180)


@dataclass
class LiveServer:
    """An embedded server and the environment of a user beside it (their own HOME, so their own profiles)."""

    server: EmbeddedServer
    env: dict[str, str]
    folder: Path

    @property
    def url(self) -> str:
        return self.server.url

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return modelyard(self.env, *args, stdin=stdin, cwd=self.folder)

    def createtoken(self, username: str, *roles: str) -> str:
        argv = ["createtoken", username, "--create-user"]
        for role in roles:
            argv += ["--role", role]
        done = self.run(*argv)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]


EMBEDDED_DATABASE = "modelyard.sqlite3"  # in the data folder (modelyard/settings.py)


@functools.cache
def migrated_database() -> Path:
    """An embedded database that ``modelyard manage migrate`` made, once per test process.

    Migrating a new database is most of a server's start (7.9-9.5 s, against 2.6-2.9 s from a copy, on a
    2-core EPYC), and every module of ``tests/cli/`` and ``tests/client/`` starts one. The result is the
    same each time, so those servers start from a copy of this one. The tests of a first start
    (``tests/cli/test_first_start.py``, the quick tour, ``make run``) still start on an empty folder.
    """
    folder = Path(tempfile.mkdtemp(prefix="modelyard-migrated-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    done = modelyard(embedded_env(folder / "data"), "manage", "migrate", "--verbosity", "0")
    assert done.returncode == 0, f"modelyard manage migrate failed:\n{done.stdout}{done.stderr}"
    return folder / "data" / EMBEDDED_DATABASE


def copy_migrated_database(data_dir: Path) -> None:
    """Put a copy of :func:`migrated_database` in ``data_dir`` (SQLite's backup, whatever its journal holds)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(migrated_database()) as source, sqlite3.connect(data_dir / EMBEDDED_DATABASE) as target:
        source.backup(target)
    source.close()
    target.close()


# What a live server's CPU benchmark of each served version measures: as many runs and seconds as the tiny
# models here need for a real figure (tests/inference/test_benchmarks.py uses the same). The defaults, 200 runs
# and 3 s per batch size, made each benchmark take 6-7 s of a core in the background of the commands' tests.
SHORT_BENCHMARKS = {"MODELYARD_BENCHMARK_ITERATIONS": "20", "MODELYARD_BENCHMARK_SECONDS": "0.05"}


def start_live_server(folder: Path, **settings: str) -> LiveServer:
    """``modelyard serve`` on a data folder in ``folder`` holding only a migrated database (:func:`migrated_database`),
    with short benchmarks (:data:`SHORT_BENCHMARKS`) and ``settings`` in its environment."""
    folder.mkdir(parents=True, exist_ok=True)
    copy_migrated_database(folder / "data")
    env = embedded_env(folder / "data", folder / "home", MODELYARD_PROVIDERS="cpu", **{**SHORT_BENCHMARKS, **settings})
    server = EmbeddedServer(env, folder / "serve.log", cwd=folder)
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return LiveServer(server=server, env={**env, "MODELYARD_URL": server.url}, folder=folder)
