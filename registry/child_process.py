"""Long model work (a derivation, a benchmark) in a bounded child process, as validation runs.

The same pattern as ``registry/validation_process.py``, whose helpers it uses: a fresh interpreter
with a minimal environment and its own process group, ``RLIMIT_AS`` set by the child before it
imports numpy or ONNX Runtime, a wall-clock limit after which the parent kills the whole group, a
CPU-time backstop, and death with its parent. The child runs ``entry`` (``"module:function"``, a
function of ``(request, report)`` returning a JSON object) and writes JSON lines to a file.

Whatever ends the child, :func:`run_in_child` returns a :class:`ChildOutcome`: the function's
reply, or an error that names the step it was in and the setting to change. Only the standard
library is imported at module level, for the child's sake.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from registry.validation_process import _child_env, _last_line, _limit_self, _read_reply, _read_tail

_CHILD_CODE = "import sys; sys.path.insert(0, sys.argv[1]); from registry.child_process import child_main; child_main()"


@dataclass(frozen=True)
class ChildLimits:
    """The limits of one kind of job, and the settings that set them (named in the errors)."""

    timeout_seconds: float
    memory_mb: int  # 0: no address-space limit (a CUDA session reserves far more address space than it uses)
    timeout_setting: str
    memory_setting: str
    what: str  # "derivation", "benchmark"
    nice: int = 0
    threads: int = 1


@dataclass(frozen=True)
class ChildOutcome:
    reply: dict[str, Any] | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.reply is not None and not self.error


def run_in_child(entry: str, request: dict[str, Any], limits: ChildLimits) -> ChildOutcome:
    """Run ``entry(request, report)`` in a child under ``limits``; never raises for what the child does."""
    from modelyard.processes import kill_group  # here: the child imports this module, and needs none of modelyard

    envelope = {
        "entry": entry,
        "request": request,
        "memory_mb": limits.memory_mb,
        "timeout_seconds": limits.timeout_seconds,
        "parent_pid": os.getpid(),
        "nice": limits.nice,
    }
    project_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = [sys.executable, "-E", "-s", "-P", "-c", _CHILD_CODE, project_root]
    env = _child_env()
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(limits.threads)
    for name in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"):  # a benchmark on CUDA needs its devices and libraries
        if name in os.environ:
            env[name] = os.environ[name]
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        stdin.write(json.dumps(envelope).encode())
        stdin.seek(0)
        process = subprocess.Popen(
            argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, close_fds=True, start_new_session=True
        )
        timed_out = False
        try:
            process.wait(timeout=limits.timeout_seconds)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            kill_group(process)
        step, reply = _read_reply(stdout)
        tail = _read_tail(stderr)
    return _outcome(process.returncode, timed_out, step, reply, tail, limits)


def _outcome(
    returncode: int, timed_out: bool, step: str, reply: dict[str, Any] | None, tail: str, limits: ChildLimits
) -> ChildOutcome:
    from registry.validation import mentions_allocation_failure

    where = f" while {step}" if step else " while starting"
    what = f"the {limits.what} stopped"
    memory = f"{what}: it needed more than {limits.memory_mb} MB of memory ({limits.memory_setting}){where}"
    if timed_out or returncode == -signal.SIGXCPU:
        return ChildOutcome(
            error=f"the {limits.what} stopped after {limits.timeout_seconds:g} s ({limits.timeout_setting}){where}"
        )
    if returncode == 0 and reply is not None and isinstance(reply.get("result"), dict):
        return ChildOutcome(reply=reply["result"])
    if reply is not None and reply.get("stopped") == "memory":
        return ChildOutcome(error=memory)
    detail = str(reply.get("error", "")) if reply is not None else ""
    if limits.memory_mb and (mentions_allocation_failure(detail) or mentions_allocation_failure(tail)):
        return ChildOutcome(error=memory)
    if detail:
        return ChildOutcome(error=f"the {limits.what} failed{where}: {detail}")
    how = f"was killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exited with status {returncode}"
    last = _last_line(tail)
    return ChildOutcome(error=f"the {limits.what} stopped{where}: its process {how}{': ' + last if last else ''}")


def _peak_address_space() -> int:
    """The most address space this process has held (VmPeak), in bytes; 0 where it cannot be read."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmPeak:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


# --- The child ------------------------------------------------------------------------------------


def child_main() -> None:
    """Entry point of the child: limit itself, run the entry function, write JSON lines on stdout."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # native libraries' prints go to stderr; stdout carries only the replies
    envelope = json.load(sys.stdin)
    memory_mb = int(envelope["memory_mb"])
    _limit_self(
        memory_mb=memory_mb or 2**30,  # 0: no limit (2**30 MB is more than any machine has)
        timeout_seconds=float(envelope["timeout_seconds"]),
        parent_pid=int(envelope["parent_pid"]),
    )
    if envelope["nice"]:
        os.nice(int(envelope["nice"]))

    def report(line: dict[str, Any]) -> None:
        out.write(json.dumps(line) + "\n")
        out.flush()

    try:
        import importlib

        module_name, _, function_name = str(envelope["entry"]).partition(":")
        function = getattr(importlib.import_module(module_name), function_name)
        reply: dict[str, Any] = {"result": function(envelope["request"], lambda step: report({"step": step}))}
    except MemoryError:
        reply = {"stopped": "memory"}
    except BaseException as exc:  # noqa: BLE001 - every surprise becomes a readable error, never a traceback
        text = str(exc).strip()
        if memory_mb and _peak_address_space() >= 0.9 * memory_mb * 2**20:
            # Native code (protobuf, ONNX Runtime) reports a failed allocation in its own words
            # ("Failed to serialize proto"); a process that reached its address-space limit ran out.
            report({"stopped": "memory"})
            out.close()
            return
        reply = {"error": f"{type(exc).__name__}: {text}" if text else type(exc).__name__}
        if len(reply["error"]) > 500:
            reply["error"] = reply["error"][:500] + "..."
    report(reply)
    out.close()
