"""The README's quick tour, run literally: its commands as they are written, in order, in a folder of their own.

The only things this test chooses are what the tour itself reads from the environment: ``PORT`` (a
free one whose next port is free too, for gRPC, so tours run side by side), ``HOME``/``XDG_CONFIG_HOME``
(so the profiles it saves land in a temporary folder) and ``TMPDIR`` (where the tour's ``mktemp -d``
makes its folder). The clone holds what a fresh clone's tour touches (the Makefile, pyproject.toml, the lock and
scripts/), and the venv ``make install`` made, so that ``make install`` finds nothing to do; the tour
leaves nothing in it.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from modelyard.processes import kill_group
from tests.support.processes import free_port_pair

ROOT = Path(__file__).resolve().parents[2]


def quick_tour() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quick tour") :]
    found = re.search(r"```sh\n(.*?)\n```", section, re.DOTALL)
    assert found is not None, "the quick tour has no ```sh block"
    return found.group(1)


def test_the_readme_quick_tour_runs_as_written(tmp_path):
    clone = tmp_path / "modelyard"
    clone.mkdir()
    for name in ("Makefile", "pyproject.toml", "requirements", "scripts", ".venv"):
        (clone / name).symlink_to(ROOT / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODELYARD_", "DJANGO_"))}
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    port = free_port_pair()
    env.update(
        PORT=str(port),
        HOME=str(tmp_path / "home"),
        XDG_CONFIG_HOME=str(tmp_path / "home" / ".config"),
        TMPDIR=str(temporary),
    )
    up_to_date = subprocess.run(["make", "-q", "install"], cwd=clone, env=env, capture_output=True)
    assert up_to_date.returncode == 0, "the venv is older than pyproject.toml: run `make install` first"

    tour = quick_tour()
    assert tour.startswith("make install")
    process = subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "-c", tour],
        cwd=clone,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the tour leaves its server running: stopped with the group below
    )
    try:
        out, err = process.communicate(timeout=300)
    finally:
        kill_group(process)
    logs = list(temporary.glob("tmp.*/modelyard.log"))
    log = logs[0].read_text(errors="replace") if logs else ""
    assert process.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}\nserver log:\n{log}"
    # The server's gRPC port followed its HTTP port, and the tour's files are in its own folder, not the clone.
    assert f"Modelyard (all) on http://127.0.0.1:{port}/, gRPC on 127.0.0.1:{port + 1}" in log
    assert sorted(p.name for p in clone.iterdir()) == [".venv", "Makefile", "pyproject.toml", "requirements", "scripts"]
    [folder] = temporary.glob("tmp.*")  # mktemp -d names it so; the server makes folders of its own there too

    assert '"status": "ready"' in out
    assert "Logged in to http://127.0.0.1:" in out and "saved as profile 'bob'" in out
    assert "Version 1 of 'example' is ready (sha256 " in out
    assert "Uploading model.onnx + 1 file(s) [########################] 100.0%" in err
    assert "'production' is protected: promotion request 1 is pending." in out
    assert "Approved promotion 1: 'production' of 'example' now points to version 1." in out
    assert "y  float32  [1, 2]\n[[4.5 6.5]]\n" in out
    assert "Pulled 'example' version 1 (2 file(s), sha256 checked) into pulled." in out
    assert re.search(r"Audit chain OK: \d+ events checked\.", out)
    assert out.rstrip().endswith("{'y': array([[4.5, 6.5]], dtype=float32)}")
    assert "Signature OK: model.sig is the registry's over every file (" in out
    assert sorted(p.name for p in (folder / "pulled").iterdir()) == ["model.onnx", "model.onnx.data", "model.sig"]
    assert (folder / ".modelyard" / "modelyard.sqlite3").exists()  # the embedded default, in the tour's folder
