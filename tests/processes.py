"""Helpers for tests that start real server and worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any


def kill_group(process: subprocess.Popen[Any]) -> None:
    """SIGKILL the process's whole group (it was started with start_new_session=True): no warm shutdown."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait(timeout=10)
