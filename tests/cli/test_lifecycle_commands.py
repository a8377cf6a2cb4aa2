"""``modelyard archive|unarchive|hold|release|delete|delete-model|clear-alias`` and ``versions --lifecycle``
against a live server (``modelyard serve`` on the embedded default: this package's ``live`` fixture).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from modelyard.client import Client
from tests.support.embedded import LiveServer
from tests.support.onnx_models import add_model

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def tokens(live: LiveServer) -> dict[str, str]:
    return {
        "pat": live.createtoken("lc-pat", "maintainer"),
        "ada": live.createtoken("lc-ada", "admin"),
        "aud": live.createtoken("lc-aud", "auditor"),
    }


def runner(live: LiveServer, token: str) -> Run:
    def run(*args: str, expect: int = 0, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        done = live.run(*args, "--token", token, stdin=stdin)
        assert done.returncode == expect, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    return run


def push_two(live: LiveServer, token: str, name: str) -> Client:
    client = Client(live.url, token)
    folder: Path = live.folder / name
    folder.mkdir()
    for number, bias in ((1, 1.0), (2, 2.0)):
        onnx.save(add_model(bias=bias), folder / f"v{number}.onnx")
        assert client.wait_ready(name, client.push(name, folder / f"v{number}.onnx").version).version == number
    return client


def test_archive_hold_delete_and_delete_model_from_the_command_line(live: LiveServer, tokens: dict[str, str]):
    pat, ada, aud = (runner(live, tokens[who]) for who in ("pat", "ada", "aud"))
    client = push_two(live, tokens["pat"], "lc-cli")

    done = pat("archive", "lc-cli", "1", "--reason", "old")
    assert done.stdout.strip() == "Version 1 of 'lc-cli' is archived."
    listed = pat("versions", "lc-cli").stdout
    assert [line.split()[0] for line in listed.splitlines()[1:]] == ["2"]
    archived = pat("versions", "lc-cli", "--lifecycle", "archived").stdout
    assert "ready, archived" in archived.splitlines()[1]

    hold = aud("hold", "lc-cli", "1", "--reason", "case 17").stdout.strip()
    assert hold == "Version 1 of 'lc-cli' is archived; under legal hold by lc-aud (case 17)."
    refused = ada("delete", "lc-cli", "1", "--reason", "cleanup", "--yes", expect=1)
    assert "cannot be deleted: it is under legal hold (by lc-aud since " in refused.stderr
    aud("release", "lc-cli", "1", "--reason", "closed")
    no_reason = aud("hold", "lc-cli", "1", expect=2)
    assert "the following arguments are required: --reason" in no_reason.stderr

    # Without --yes and no terminal to confirm at, nothing is deleted.
    unconfirmed = ada("delete", "lc-cli", "1", "--reason", "cleanup", expect=1, stdin="")
    assert "send --yes to delete" in unconfirmed.stderr
    assert client.get_version("lc-cli", 1).state == "archived"

    deleted = ada("delete", "lc-cli", "1", "--reason", "cleanup", "--yes")
    sha = client.get_version("lc-cli", 1).model_file.sha256
    assert "model.onnx" in deleted.stdout or "v1.onnx" in deleted.stdout
    assert sha in deleted.stdout
    assert deleted.stdout.strip().splitlines()[-1] == (
        "Version 1 of 'lc-cli' is deleted (by lc-ada: cleanup); its files are removed."
    )
    tombstones = json.loads(pat("versions", "lc-cli", "--lifecycle", "deleted", "--json").stdout)
    assert [(v["version"], v["lifecycle"]["deleted"]["reason"]) for v in tombstones] == [(1, "cleanup")]

    by_maintainer = pat("delete", "lc-cli", "2", "--reason", "x", "--yes", expect=1)
    assert "deleting a version needs the admin role" in by_maintainer.stderr
    too_soon = ada("delete-model", "lc-cli", "--reason", "retired", "--yes", expect=1)
    assert "model 'lc-cli' still has versions that are not deleted: 2; delete them first" in too_soon.stderr
    ada("delete", "lc-cli", "2", "--reason", "retired", "--yes")
    assert ada("delete-model", "lc-cli", "--reason", "retired", "--yes").stdout.strip() == (
        "Deleted model 'lc-cli'; the audit log keeps its history."
    )
    assert [m.name for m in client.list_models(query="lc-cli")] == []


def test_clear_alias_lets_its_version_go(live: LiveServer, tokens: dict[str, str]):
    pat, ada = runner(live, tokens["pat"]), runner(live, tokens["ada"])
    client = push_two(live, tokens["pat"], "lc-alias")
    client.promote("lc-alias", "staging", 2)
    refused = ada("delete", "lc-alias", "2", "--reason", "x", "--yes", expect=1)
    assert "alias 'staging' points at it" in refused.stderr
    assert pat("clear-alias", "lc-alias", "staging").stdout.strip() == (
        "Alias 'staging' of 'lc-alias' points at no version now."
    )
    assert client.get_alias("lc-alias", "staging").version is None
    ada("delete", "lc-alias", "2", "--reason", "x", "--yes")
