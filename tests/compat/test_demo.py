"""`modelyard demo` on the embedded default, as a newcomer runs it: beside `modelyard serve`, then again.

The first start's migration is the newcomer's path in ``test_demo_without_a_server_says_how_to_start_one``;
the other tests start from a copy of a migrated database (``tests/support/embedded.py``), as a second
start would find it. Each command's environment names the run's shared validation memo
(``tests/support/validation_memo.py``): the demo's model is validated for real once per run.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support import validation_memo
from tests.support.embedded import EmbeddedServer, copy_migrated_database, embedded_env

MODELYARD = str(Path(sys.executable).with_name("modelyard"))


def demo_env(data_dir: Path) -> dict[str, str]:
    """No configuration at all, as on a laptop (SQLite and artifacts in the data folder, tasks in-process),
    validating through the run's shared memo."""
    return validation_memo.in_servers(embedded_env(data_dir))


def run_demo(env: dict[str, str], url: str) -> str:
    done = subprocess.run([MODELYARD, "demo", "--url", url], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stdout


def database(data_dir: Path) -> sqlite3.Connection:
    return sqlite3.connect(data_dir / "modelyard.sqlite3")


def demo_state(data_dir: Path) -> tuple[list[tuple[int, int, str]], int | None]:
    """The demo model's versions (id, number, status) and the version id its production alias points to."""
    with database(data_dir) as db:
        versions = db.execute(
            "SELECT v.id, v.version, v.status FROM registry_modelversion v "
            "JOIN registry_registeredmodel m ON m.id = v.model_id WHERE m.name = 'demo' ORDER BY v.version"
        ).fetchall()
        (production,) = db.execute(
            "SELECT a.version_id FROM registry_alias a JOIN registry_registeredmodel m ON m.id = a.model_id "
            "WHERE m.name = 'demo' AND a.name = 'production'"
        ).fetchone()
    return versions, production


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[dict[str, str], str]]:
    """`modelyard serve` on the embedded default, as `make run` starts it in another terminal (not its first time)."""
    copy_migrated_database(tmp_path / "data")
    server = EmbeddedServer(embedded_env(tmp_path / "data"), tmp_path / "serve.log", cwd=tmp_path)
    try:
        server.wait_ready(timeout=60)
        yield demo_env(tmp_path / "data"), server.url
    finally:
        server.stop()


def test_demo_beside_a_running_server_prints_examples_that_work(served, tmp_path):
    env, url = served
    out = run_demo(env, url)

    assert "Model 'demo' version 1 (y = 2x + 1) is on the production alias." in out
    assert "The running inference server has loaded it." in out
    token = re.search(r"API token for user 'demo' \(admin\): (my_\S+)", out)
    assert token is not None, out
    curl = next(line for line in out.splitlines() if line.startswith("curl "))
    assert curl == (
        f"curl -s -X POST {url}/v2/models/demo/infer -H 'Authorization: Bearer {token[1]}' "
        """-d '{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}'"""
    )
    expected = (
        '{"model_name":"demo","model_version":"1","outputs":'
        '[{"name":"y","datatype":"FP32","shape":[1,4],"data":[3.0,5.0,7.0,9.0]}]}'
    )
    assert f"  -> {expected}" in out

    if shutil.which("curl"):
        answer = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=30)
        assert answer.stdout == expected
    snippet = out[out.index("import numpy as np") :]
    ran = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=60, env=env)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[[3. 5. 7. 9.]]"

    versions, production = demo_state(tmp_path / "data")
    assert [(number, status) for _, number, status in versions] == [(1, "ready")]
    assert production == versions[0][0]

    again = run_demo(env, url)  # idempotent: the same user, token, model and version
    assert again == out
    assert demo_state(tmp_path / "data") == (versions, production)
    with database(tmp_path / "data") as db:
        assert db.execute("SELECT COUNT(*) FROM registry_promotionrequest").fetchone() == (1,)
        assert db.execute("SELECT COUNT(*) FROM auth_user WHERE username LIKE 'demo%'").fetchone() == (2,)


def test_demo_without_a_server_says_how_to_start_one(tmp_path):
    env = demo_env(tmp_path / "data")
    out = run_demo(env, "http://127.0.0.1:8000")
    assert "No inference server is running: start one in another terminal with `make run`" in out
    assert "curl -s -X POST http://127.0.0.1:8000/v2/models/demo/infer -H 'Authorization: Bearer my_" in out
    assert 'client = httpclient.InferenceServerClient("127.0.0.1:8000")' in out
    versions, production = demo_state(tmp_path / "data")
    assert [(number, status) for _, number, status in versions] == [(1, "ready")]
    assert production == versions[0][0]


def test_demo_counts_a_worker_offline_as_the_fleet_does(tmp_path):
    """A worker last seen 20 s ago is offline for the fleet (3 heartbeats of 5 s, at least 15 s): the demo agrees."""
    copy_migrated_database(tmp_path / "data")
    env = demo_env(tmp_path / "data")
    run_demo(env, "http://127.0.0.1:8000")
    seen = (datetime.now(UTC) - timedelta(seconds=20)).strftime("%Y-%m-%d %H:%M:%S.%f")
    with database(tmp_path / "data") as db:
        db.execute(
            "INSERT INTO registry_inferenceworker "
            "(worker_id, host, pid, device, provider, loaded, errors, started_at, heartbeat_at) "
            "VALUES ('gone', 'h', 1, 'cpu', 'CPUExecutionProvider', '[]', '[]', ?, ?)",
            (seen, seen),
        )
    out = run_demo(env, "http://127.0.0.1:8000")
    # Not "has not loaded it yet" after waiting 30 s for a server that is gone.
    assert "No inference server is running: start one in another terminal with `make run`" in out
