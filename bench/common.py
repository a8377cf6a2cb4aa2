"""Helpers the benchmark scripts share: a throwaway work folder, the JSON result, stopping servers.

Process groups are killed with ``modelyard.processes.kill_group``, the helper the tests use too.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

Result = dict[str, Any]


def run_in_workdir(
    *,
    prefix: str,
    run: Callable[[Path], Result],
    report: Callable[[Result], None],
    output: Path,
    keep: bool,
    passed: Callable[[Result], bool],
) -> int:
    """Run the benchmark in a temporary folder (kept on failure), print and save its result."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        result = run(work)
    except BaseException:
        print(f"failed; logs are in {work}", file=sys.stderr)
        keep = True
        raise
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    report(result)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {output}")
    return 0 if passed(result) else 1


def stop_process(process: subprocess.Popen[Any] | None, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    """Ask a server to stop, and kill it if it does not within ``timeout`` seconds."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
