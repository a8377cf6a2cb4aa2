"""Stopping a child process together with everything it started.

The tests and ``bench/`` start servers and workers in process groups of their own, and stop those
groups here. It lives in the installed package, which both the tests and the benchmark scripts
import, and it imports only the standard library. (The sandbox, ``onnxkit/sandbox.py``, stops its
children the same way with its own copy of these lines: ``onnxkit`` imports nothing of the project.)
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any


def kill_group(process: subprocess.Popen[Any], *, timeout: float | None = None) -> None:
    """SIGKILL the process's whole group (it was started with ``start_new_session=True``) and reap it.

    No warm shutdown: nothing the group started survives, and nothing it would do on the way out
    (acknowledge a task, say) happens. ``timeout`` bounds the wait for the leader to be reaped.

    The group is killed even when its leader has already exited: what the leader left running in
    the background (a shell's ``server &``) is still in the group. Linux hands out no new process
    with that id while the group has members, so the signal reaches only them.
    """
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the leader and everything it started are gone
    process.wait(timeout=timeout)
