"""``modelyard beat`` keeps its schedule file in the data folder, not in the folder it was started from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from modelyard.processes import kill_group
from tests.support.polling import eventually
from tests.support.processes import base_env


def schedule_files(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.glob("celerybeat-schedule*"))


def test_beat_writes_its_schedule_under_the_data_folder(tmp_path: Path):
    workdir, data = tmp_path / "cwd", tmp_path / "data"
    workdir.mkdir()
    # memory:// keeps what beat sends inside its own process: no queue anywhere fills with sweeps.
    env = base_env(MODELYARD_DATA_DIR=str(data), MODELYARD_BROKER_URL="memory://")
    log = tmp_path / "beat.log"
    with log.open("wb") as out:
        beat = subprocess.Popen(
            [sys.executable, "-m", "modelyard.cli", "beat", "--log-level", "info"],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        eventually(
            lambda: schedule_files(data) or schedule_files(workdir),
            timeout=60,
            interval=0.2,
            what=lambda: log.read_text(errors="replace"),
        )
        assert schedule_files(workdir) == []
        assert schedule_files(data), f"no schedule in {data}: {sorted(p.name for p in data.iterdir())}"
        assert f"db -> {data / 'celerybeat-schedule'}" in log.read_text()
    finally:
        kill_group(beat)
