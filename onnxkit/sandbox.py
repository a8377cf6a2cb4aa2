"""Model work in a bounded child process: validation, derivations and benchmarks all run here.

A model of a few hundred bytes can make onnx.checker, shape inference or ONNX Runtime run for
ever (a ``Loop`` with a trip count of 2**62) or allocate gigabytes (``ConstantOfShape``, ``If``
nodes nested in both branches). Done in the process that serves the API or runs Celery, that pins
a core for good or gets the whole server killed by the kernel, and the sweep then repeats it. So
:func:`run_in_child` starts a fresh interpreter (spawned, not forked), which inherits none of the
parent's threads, connections, environment or secrets, and which

- sets ``RLIMIT_AS`` to the memory limit itself, before it imports numpy, onnx or onnxruntime, so
  any allocation past it fails inside the child and the parent never grows;
- is killed with its whole process group once the time limit has passed;
- also has a CPU-time limit a little past the wall-clock one and asks the kernel to kill it when
  its parent dies, so a child whose worker was SIGKILLed mid-run does not run on alone.

The child runs ``entry`` (``"module:function"``, a function of ``(request, on_step)`` returning a
JSON object) and writes one JSON line as each step starts and one with its reply, to a file rather
than a pipe (nothing to drain, and what it wrote survives its death). Whatever ends the child,
:func:`run_in_child` returns a :class:`ChildOutcome`: the function's reply, or a
:class:`ChildFailure` that says what stopped it and in which step, with :meth:`ChildFailure.message`
naming the setting to change; a caller with its own words (validation) builds them from the failure.
Only the standard library is imported here, for the child's sake.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import IO, Any

# The child's reply is a few kilobytes; more than this is not a reply.
_MAX_REPLY_BYTES = 16 * 2**20
_STDERR_TAIL_BYTES = 4096
# The CPU-time limit is only a backstop for a child whose parent is gone; the wall clock comes first.
_CPU_GRACE_SECONDS = 10

_CHILD_CODE = (
    "import json, sys; sys.path[0:0] = json.loads(sys.argv[1]); from onnxkit.sandbox import child_main; child_main()"
)

# How libraries say that an allocation failed. Inside the child this is its memory limit being hit,
# and is reported as such rather than as a defect of the model.
ALLOCATION_FAILURES = (
    "memoryerror",
    "bad_alloc",
    "bad allocation",
    "failed to allocate memory",
    "cannot allocate memory",
    "failed to map segment",  # the dynamic loader, when a library does not fit under the limit
    "memory allocation still failed",  # OpenBLAS, whose buffers numpy allocates as it is imported
)


# What a child that may open a CUDA session needs from the parent's environment: its devices and libraries.
CUDA_ENV = ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH")


def mentions_allocation_failure(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in ALLOCATION_FAILURES)


@dataclass(frozen=True)
class ChildLimits:
    """The limits of one kind of job, and the settings that set them (named in the errors)."""

    timeout_seconds: float
    memory_mb: int  # 0: no address-space limit (a CUDA session reserves far more address space than it uses)
    timeout_setting: str
    memory_setting: str
    what: str  # "validation", "derivation", "benchmark"
    nice: int = 0
    threads: int = 1
    # Variables passed on from the parent's environment (a benchmark on CUDA needs its devices and libraries).
    inherit_env: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChildFailure:
    """What stopped a child before it replied, and the step it was in."""

    kind: str  # "timeout", "memory", "error" (the function raised), "died" (killed, or an exit without a reply)
    step: str = ""
    detail: str = ""  # "error": the exception, as ``Type: message``
    returncode: int = 0  # "died": the process's exit status (negative: the signal)
    last_line: str = ""  # "died": the last line it wrote on stderr

    @property
    def where(self) -> str:
        return f" while {self.step}" if self.step else " while starting"

    @property
    def how(self) -> str:
        """How the process ended, for a "died" failure: ``was killed by SIGKILL``, ``exited with status 1``."""
        if self.returncode < 0:
            return f"was killed by {signal.Signals(-self.returncode).name}"
        return f"exited with status {self.returncode}"

    def message(self, limits: ChildLimits) -> str:
        """The readable error for a derivation or a benchmark: what stopped it, and the setting to change."""
        if self.kind == "timeout":
            return (
                f"the {limits.what} stopped after {limits.timeout_seconds:g} s ({limits.timeout_setting}){self.where}"
            )
        if self.kind == "memory":
            return (
                f"the {limits.what} stopped: it needed more than {limits.memory_mb} MB of memory "
                f"({limits.memory_setting}){self.where}"
            )
        if self.kind == "error":
            return f"the {limits.what} failed{self.where}: {self.detail}"
        last = f": {self.last_line}" if self.last_line else ""
        return f"the {limits.what} stopped{self.where}: its process {self.how}{last}"


@dataclass(frozen=True)
class ChildOutcome:
    """The function's reply, or the error (and, from :func:`run_in_child`, the failure) that stopped it."""

    reply: dict[str, Any] | None = None
    error: str = ""
    failure: ChildFailure | None = None

    @property
    def ok(self) -> bool:
        return self.reply is not None and not self.error


def run_in_child(entry: str, request: dict[str, Any], limits: ChildLimits) -> ChildOutcome:
    """Run ``entry(request, on_step)`` in a child under ``limits``; never raises for what the child does."""
    envelope = {
        "entry": entry,
        "request": request,
        "memory_mb": limits.memory_mb,
        "timeout_seconds": limits.timeout_seconds,
        "parent_pid": os.getpid(),
        "nice": limits.nice,
    }
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        stdin.write(json.dumps(envelope).encode())
        stdin.seek(0)
        process = subprocess.Popen(
            _child_argv(entry),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=_child_env(limits),
            close_fds=True,
            start_new_session=True,  # its own process group, so a kill reaches anything it started
        )
        timed_out = False
        try:
            process.wait(timeout=limits.timeout_seconds)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            # Also when this thread is interrupted (a worker shutting down): no child outlives the call.
            _kill_group(process)
        step, reply = _read_reply(stdout)
        tail = _read_tail(stderr)
    if returned := _returned(process.returncode, timed_out, reply):
        return ChildOutcome(reply=returned)
    failure = _failure(process.returncode, timed_out, step, reply, tail, limits)
    return ChildOutcome(error=failure.message(limits), failure=failure)


def _child_argv(entry: str) -> list[str]:
    # -E ignores PYTHON* variables, -s the user's site folder, and -P keeps the working directory
    # off sys.path. The folders the child imports from are then named explicitly: the project root,
    # then the parent's PYTHONPATH folders (as paths, not as the variable), so that the child imports
    # the same packages as the server that started it, also where those come from a PYTHONPATH folder
    # (a `pip install --target` folder, such as an ONNX Runtime GPU build laid over an image's CPU
    # one). The entry is read from stdin; it is on the command line too, so that ``ps`` tells the
    # children apart.
    project_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    inherited = [os.path.abspath(folder) for folder in os.environ.get("PYTHONPATH", "").split(os.pathsep) if folder]
    path = [project_root, *inherited]
    return [sys.executable, "-E", "-s", "-P", "-c", _CHILD_CODE, json.dumps(path), entry]


def _child_env(limits: ChildLimits) -> dict[str, str]:
    """A minimal environment: the child needs no credentials, and a hostile model gets none."""
    threads = str(limits.threads)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        # Thread pools and per-thread malloc arenas reserve address space, which counts against
        # RLIMIT_AS; validation and derivations need one thread and get one.
        "OMP_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "MALLOC_ARENA_MAX": "2",
        "RAYON_NUM_THREADS": "1",  # the tokenizers library's thread pool
        "TOKENIZERS_PARALLELISM": "false",
    }
    for name in limits.inherit_env:
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _kill_group(process: subprocess.Popen[Any]) -> None:
    """SIGKILL the child's whole process group and reap it (as ``modelyard.processes.kill_group`` does)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the leader and everything it started are gone
    process.wait()


def _read_reply(stdout: IO[bytes]) -> tuple[str, dict[str, Any] | None]:
    """The last step the child started, and its final reply if it got that far."""
    step, reply = "", None
    if stdout.seek(0, os.SEEK_END) > _MAX_REPLY_BYTES:
        return step, {"error": f"its reply was larger than {_MAX_REPLY_BYTES // 2**20} MB"}
    stdout.seek(0)
    for raw in stdout:
        try:
            line = json.loads(raw)
        except ValueError:
            break  # cut short by a kill; what came before stands
        if not isinstance(line, dict):
            break
        if "step" in line:
            step = str(line["step"])
        else:
            reply = line
    return step, reply


def _read_tail(stderr: IO[bytes]) -> str:
    size = stderr.seek(0, os.SEEK_END)
    stderr.seek(max(0, size - _STDERR_TAIL_BYTES))
    return stderr.read().decode("utf-8", errors="replace")


def _last_line(tail: str) -> str:
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1][:300]
    return "".join(char if char.isprintable() else f"\\x{ord(char):02x}" for char in line)


def _returned(returncode: int, timed_out: bool, reply: dict[str, Any] | None) -> dict[str, Any] | None:
    if timed_out or returncode != 0 or reply is None or not isinstance(reply.get("result"), dict):
        return None
    return reply["result"]


def _failure(
    returncode: int, timed_out: bool, step: str, reply: dict[str, Any] | None, tail: str, limits: ChildLimits
) -> ChildFailure:
    if timed_out or returncode == -signal.SIGXCPU:
        return ChildFailure("timeout", step)
    if reply is not None and reply.get("stopped") == "memory":
        return ChildFailure("memory", step)
    detail = str(reply.get("error", "")) if reply is not None else ""
    if limits.memory_mb and (mentions_allocation_failure(detail) or mentions_allocation_failure(tail)):
        return ChildFailure("memory", step)
    if detail:
        return ChildFailure("error", step, detail=detail)
    return ChildFailure("died", step, returncode=returncode, last_line=_last_line(tail))


# --- The child ------------------------------------------------------------------------------------


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


def child_main() -> None:
    """Entry point of the child: limit itself, run the entry function, write JSON lines on stdout."""
    # Native libraries may print to stdout; give them stderr, and keep stdout for the replies.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
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
        # Imported only now, under the limits: numpy, onnx and onnxruntime count against the memory limit too.
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


def _limit_self(*, memory_mb: int, timeout_seconds: float, parent_pid: int) -> None:
    import resource

    _die_with_parent(parent_pid)
    _set_limit(resource.RLIMIT_CORE, 0, 0)  # a crash under the limit must not write gigabytes of core
    _set_limit(resource.RLIMIT_AS, memory_mb * 2**20, memory_mb * 2**20)
    cpu_seconds = math.ceil(timeout_seconds) + _CPU_GRACE_SECONDS
    _set_limit(resource.RLIMIT_CPU, cpu_seconds, cpu_seconds + 5)  # SIGXCPU, then SIGKILL


def _set_limit(which: int, soft: int, hard: int) -> None:
    import resource

    _, current_hard = resource.getrlimit(which)
    if current_hard != resource.RLIM_INFINITY:  # an administrator's lower limit stands
        soft, hard = min(soft, current_hard), min(hard, current_hard)
    resource.setrlimit(which, (soft, hard))


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies; the wall clock is kept by the parent."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the request took effect
