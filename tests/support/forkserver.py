"""``modelyard`` commands for the tests, each in a process forked from one that has imported the command line.

A command started as a new program spends much of its time starting Python and importing the command
line, the client and numpy, and ``tests/cli/`` runs 297 of them: forked from here instead, they take
about 0.2 s of CPU less each (``tests/cli/`` in 5.5 against 6.4-6.7 CPU-minutes on a 2-core EPYC).
Each command run here is still a process of its own: its own arguments, environment, working folder,
standard input, output and error, and exit status (``sys.exit(main(argv))``, as the ``modelyard``
script does), against a real server. What it does not repeat is the interpreter's start and those
imports. The tests of a start itself (``tests/client/test_imports.py``, ``tests/cli/test_first_start.py``,
``tests/cli/test_parser.py``, the quick tour, ``make run``) start ``modelyard`` as a new program.

One fork server per test process, started on first use: a child of the test process that reads one
request at a time from a socket (JSON lines), forks, and answers with the child's pid and then its exit
status. Coverage follows a forked child into a data file of its own (coverage.py notices the new pid).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import locale
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, NoReturn


def _child(request: dict[str, Any]) -> NoReturn:
    """In the forked process: become the command, then exit as the ``modelyard`` script would."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, (path, flags) in enumerate(
        ((request["stdin"], os.O_RDONLY), (request["stdout"], os.O_WRONLY), (request["stderr"], os.O_WRONLY))
    ):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.argv = ["modelyard", *request["argv"]]
    from modelyard.cli import main

    # Raised through the server's loop to the top, so the interpreter ends as after the script: an
    # uncaught exception printed with exit status 1, buffers flushed, atexit (coverage's save) run.
    sys.exit(main(request["argv"]))


def serve(connection: socket.socket) -> None:
    """The fork server's loop: a request a line, answered with {"pid"} and then {"returncode"}."""
    for module in ("modelyard.cli", "modelyard.client.commands", "modelyard.client.tensors"):  # tensors: numpy
        importlib.import_module(module)
    with connection.makefile("rb") as requests, connection.makefile("wb") as answers:
        for line in requests:
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                requests.close()
                answers.close()
                connection.close()
                _child(request)
            answers.write(json.dumps({"pid": pid}).encode() + b"\n")
            answers.flush()
            _, status = os.waitpid(pid, 0)
            answers.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            answers.flush()


class ForkServer:
    """The test process's end: :meth:`run` is ``subprocess.run([modelyard, *argv], capture_output=True, text=True)``."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.forkserver", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            cwd=Path(__file__).resolve().parents[2],
        )
        theirs.close()
        self.socket = ours
        self.requests = ours.makefile("wb")
        self.answers = ours.makefile("rb")
        self.lock = threading.Lock()

    def run(
        self, argv: list[str], *, env: dict[str, str], cwd: Path | None, stdin: str | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        encoding = locale.getpreferredencoding(False)
        with self.lock, tempfile.TemporaryDirectory(prefix="modelyard-command-") as folder:
            streams = {name: Path(folder, name) for name in ("stdout", "stderr")}
            for path in streams.values():
                path.touch()
            if stdin is None:
                source = os.devnull
            else:
                source = str(Path(folder, "stdin"))
                Path(source).write_text(stdin, encoding=encoding)
            request = {
                "argv": argv,
                "env": env,
                "cwd": str(cwd or Path.cwd()),
                "stdin": source,
                **{name: str(path) for name, path in streams.items()},
            }
            self.requests.write(json.dumps(request).encode() + b"\n")
            self.requests.flush()
            pid = self._answer()["pid"]
            self.socket.settimeout(timeout)
            try:
                returncode = self._answer()["returncode"]
            except TimeoutError:
                # A socket file that timed out reads no more: the command and this server go, and the
                # next command starts a new one (fork_server).
                os.kill(pid, signal.SIGKILL)
                self.process.kill()
                self.process.wait()
                raise subprocess.TimeoutExpired(["modelyard", *argv], timeout) from None
            self.socket.settimeout(None)
            out, err = (path.read_text(encoding=encoding) for path in streams.values())
        return subprocess.CompletedProcess(["modelyard", *argv], returncode, out, err)

    def _answer(self) -> dict[str, Any]:
        line = self.answers.readline()
        if not line:
            raise RuntimeError(f"the fork server exited with {self.process.wait()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        """Stop the server: at the end of its socket it leaves its loop and exits (saving its coverage)."""
        for stream in (self.requests, self.answers, self.socket):
            with contextlib.suppress(OSError):
                stream.close()
        self.process.wait(timeout=30)


_server: ForkServer | None = None
_started = threading.Lock()


def fork_server() -> ForkServer:
    """This test process's fork server, started on first use and stopped at its exit."""
    global _server
    with _started:
        if _server is None or _server.process.poll() is not None:
            _server = ForkServer()
            atexit.register(_server.close)
        return _server


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
