"""`modelyard alias NAME ALIAS --cache BYTES:SECONDS` and `--no-cache`: an alias's response cache, from the shell."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.embedded import LiveServer, start_live_server
from tests.support.onnx_models import add_model_bytes


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    found = start_live_server(tmp_path_factory.mktemp("alias-cache"))
    try:
        yield found
    finally:
        found.server.stop()


def run(live: LiveServer, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    done = live.run(*args)
    assert done.returncode == expect, f"{args}: exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    return done


def test_an_admin_sets_and_clears_an_aliases_cache(live: LiveServer):
    admin = ("--token", live.createtoken("root", "admin"))
    (live.folder / "add1.onnx").write_bytes(add_model_bytes(bias=1.0))
    run(live, "push", "cached", str(live.folder / "add1.onnx"), "--quiet", *admin)
    run(live, "promote", "cached", "staging", "1", *admin)

    on = run(live, "alias", "cached", "staging", "--cache", "65536:300", *admin)
    assert on.stdout == (
        "'staging' of 'cached': version 1; not protected, not served; no signature required; "
        "caches responses (65536 bytes, 300 s).\n"
    )
    shown = json.loads(run(live, "alias", "cached", "staging", "--json", *admin).stdout)
    assert shown["cache"] == {"max_bytes": 65536, "ttl_seconds": 300}
    off = run(live, "alias", "cached", "staging", "--no-cache", *admin)
    assert off.stdout == "'staging' of 'cached': version 1; not protected, not served; no signature required.\n"

    bad = run(live, "alias", "cached", "staging", "--cache", "lots", *admin, expect=2)
    assert "argument --cache: expected BYTES:SECONDS, e.g. 67108864:300, not 'lots'" in bad.stderr
    small = run(live, "alias", "cached", "staging", "--cache", "10:5", *admin, expect=1)
    assert small.stderr == "modelyard alias: cache: max_bytes: Ensure this value is greater than or equal to 1024.\n"
    maintainer = ("--token", live.createtoken("dave", "maintainer"))
    denied = run(live, "alias", "cached", "staging", "--cache", "65536:300", *maintainer, expect=1)
    assert denied.stderr == "modelyard alias: changing an alias's response cache needs the admin role\n"
