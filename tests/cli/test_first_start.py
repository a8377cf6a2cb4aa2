"""Concurrent first starts on one fresh data folder: ``serve`` and ``createtoken`` started together both succeed.

Both migrate the embedded database when it is new; without the lock around migrate one of them
crashed with ``table ... already exists`` nearly every time.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.support.embedded import MODELYARD, EmbeddedServer, answers, embedded_env

ROUNDS = 3


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_serve_and_createtoken_started_together_on_a_fresh_data_folder_both_succeed(tmp_path, round_):
    env = embedded_env(tmp_path / "data")
    server = EmbeddedServer(env, tmp_path / "serve.log")
    try:
        created = subprocess.run(
            [MODELYARD, "createtoken", "alice", "--create-user", "--role", "admin"],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert created.returncode == 0, created.stderr
        token = created.stdout.strip().splitlines()[-1]
        assert token.startswith("my_")
        server.wait_ready()
        # The API runs on the database both migrated. Its first request loads the API's modules: on a slow,
        # busy machine that took longer than answers()'s usual 2 s, so it gets 30.
        assert answers(f"{server.url}/api/v1/models", timeout=30) == 401
    finally:
        server.stop()
    assert "already exists" not in server.log()
    assert (tmp_path / "data" / "secret_key").read_text().strip()


def test_two_createtokens_started_together_on_a_fresh_data_folder_both_succeed(tmp_path):
    env = embedded_env(tmp_path / "data")
    argv = [MODELYARD, "createtoken", "--create-user"]
    first = subprocess.Popen([*argv, "ann"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = subprocess.Popen([*argv, "bob"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for process in (first, second):
        out, err = process.communicate(timeout=180)
        assert process.returncode == 0, err
        assert out.strip().splitlines()[-1].startswith("my_")
