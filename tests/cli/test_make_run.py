"""``make run PORT=...`` serves on that port, and two servers started so on one machine both run: gRPC follows.

Each server runs in a clone of its own (the Makefile, pyproject.toml, scripts/ and the venv, linked), so
each has its own embedded data folder, as two checkouts would.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from modelyard.processes import kill_group
from tests.support.embedded import answers
from tests.support.processes import free_port_pair

ROOT = Path(__file__).resolve().parents[2]


def clone(folder: Path) -> Path:
    folder.mkdir()
    for name in ("Makefile", "pyproject.toml", "scripts", ".venv"):
        (folder / name).symlink_to(ROOT / name)
    return folder


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_ready(process: subprocess.Popen[bytes], port: int, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while answers(f"http://127.0.0.1:{port}/readyz") != 200:
        if process.poll() is not None:
            raise AssertionError(f"make run exited with {process.returncode}:\n{log.read_text(errors='replace')}")
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing ready on {port} within {timeout} s:\n{log.read_text(errors='replace')}")
        time.sleep(0.3)


def test_make_run_takes_the_port_and_a_second_server_beside_it_starts_too(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODELYARD_", "DJANGO_"))}
    started: list[tuple[subprocess.Popen[bytes], int, Path]] = []
    try:
        for name in ("first", "second"):
            port = free_port_pair()
            folder = clone(tmp_path / name)
            log = folder / "run.log"
            with log.open("wb") as out:
                process = subprocess.Popen(
                    ["make", "--no-print-directory", "run", f"PORT={port}"],
                    cwd=folder,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            started.append((process, port, log))
            wait_ready(process, port, log)
        for process, port, log in started:
            assert process.poll() is None
            assert f"Modelyard (all) on http://127.0.0.1:{port}/, gRPC on 127.0.0.1:{port + 1}" in log.read_text()
            assert listening(port + 1)
    finally:
        for process, _, _ in started:
            kill_group(process, timeout=30)
