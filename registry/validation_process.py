"""Validation in a child process, under a wall-clock limit and an address-space limit.

A model of a few hundred bytes can make onnx.checker, shape inference or ONNX Runtime run for
ever (a ``Loop`` with a trip count of 2**62) or allocate gigabytes (``ConstantOfShape``, ``If``
nodes nested in both branches). Done in the process that serves the API or runs Celery, that pins
a core for good or gets the whole server killed by the kernel, and the sweep then repeats it. So
``validate_bundle`` runs in a child that this module starts with ``subprocess``: a fresh
interpreter (spawned, not forked), so it inherits none of the parent's threads, connections,
environment or secrets, and

- sets ``RLIMIT_AS`` to MODELYARD_VALIDATION_MEMORY_MB itself, before it imports numpy, onnx or
  onnxruntime, so any allocation past it fails inside the child and the parent never grows;
- is killed with its whole process group once MODELYARD_VALIDATION_TIMEOUT_SECONDS have passed;
- also has a CPU-time limit a little past the wall-clock one and asks the kernel to kill it when
  its parent dies, so a child whose worker was SIGKILLed mid-validation does not run on alone.

The child writes one JSON line as each step starts and one with its result, to a file rather
than a pipe (nothing to drain, and what it wrote survives its death). Whatever happens to the
child, the parent returns a ``ValidationResult`` whose errors name what stopped it and the
setting to change. Only the standard library is imported at module level, for the child's sake.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from registry.validation import ValidationResult

TIMEOUT_SETTING = "MODELYARD_VALIDATION_TIMEOUT_SECONDS"
MEMORY_SETTING = "MODELYARD_VALIDATION_MEMORY_MB"

# The child's result is a few kilobytes; more than this is not a result.
_MAX_REPLY_BYTES = 16 * 2**20
_STDERR_TAIL_BYTES = 4096
# The CPU-time limit is only a backstop for a child whose parent is gone; the wall clock comes first.
_CPU_GRACE_SECONDS = 10

_CHILD_CODE = (
    "import sys; sys.path.insert(0, sys.argv[1]); from registry.validation_process import child_main; child_main()"
)


def validate_in_child(
    model_path: Path,
    file_names: set[str],
    *,
    timeout_seconds: float,
    memory_mb: int,
    tokenizer_max_bytes: int = 64 * 2**20,
) -> ValidationResult:
    """Run ``validate_bundle`` on ``model_path`` in a child process under the two limits; never raises for the model."""
    from modelyard.processes import kill_group  # here: the child imports this module, and needs none of modelyard

    request = {
        "model_path": str(model_path),
        "file_names": sorted(file_names),
        "memory_mb": memory_mb,
        "timeout_seconds": timeout_seconds,
        "tokenizer_max_bytes": tokenizer_max_bytes,
        "parent_pid": os.getpid(),
    }
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        stdin.write(json.dumps(request).encode())
        stdin.seek(0)
        process = subprocess.Popen(
            _child_argv(),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=_child_env(),
            close_fds=True,
            start_new_session=True,  # its own process group, so a kill reaches anything it started
        )
        timed_out = False
        try:
            process.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            # Also when this thread is interrupted (a worker shutting down): no child outlives the call.
            kill_group(process)
        step, reply = _read_reply(stdout)
        tail = _read_tail(stderr)
    return _outcome(
        returncode=process.returncode,
        timed_out=timed_out,
        step=step,
        reply=reply,
        tail=tail,
        timeout_seconds=timeout_seconds,
        memory_mb=memory_mb,
    )


def _child_argv() -> list[str]:
    # -E ignores PYTHON* variables, -s the user's site folder, and -P keeps the working directory
    # off sys.path; the project root is put on it explicitly, and nothing else.
    project_root = str(Path(__file__).resolve().parent.parent)
    return [sys.executable, "-E", "-s", "-P", "-c", _CHILD_CODE, project_root]


def _child_env() -> dict[str, str]:
    """A minimal environment: the child needs no credentials, and a hostile model gets none."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        # Thread pools and per-thread malloc arenas reserve address space, which counts against
        # RLIMIT_AS; validation needs one thread and gets one.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "2",
        "RAYON_NUM_THREADS": "1",  # the tokenizers library's thread pool
        "TOKENIZERS_PARALLELISM": "false",
    }


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


def _outcome(
    *,
    returncode: int,
    timed_out: bool,
    step: str,
    reply: dict[str, Any] | None,
    tail: str,
    timeout_seconds: float,
    memory_mb: int,
) -> ValidationResult:
    from registry.validation import ValidationResult, mentions_allocation_failure

    where = f" while {step}" if step else " while starting"
    memory = f"validation stopped: it needed more than {memory_mb} MB of memory ({MEMORY_SETTING}){where}"
    timeout = f"validation stopped after {timeout_seconds:g} s ({TIMEOUT_SETTING}){where}"
    if timed_out or returncode == -signal.SIGXCPU:
        return ValidationResult(errors=[timeout])
    if returncode == 0 and reply is not None and isinstance(reply.get("result"), dict):
        return _result_from_json(reply["result"])
    if reply is not None and reply.get("stopped") == "memory":
        return ValidationResult(errors=[memory])
    detail = str(reply.get("error", "")) if reply is not None else ""
    if mentions_allocation_failure(detail) or mentions_allocation_failure(tail):
        return ValidationResult(errors=[memory])
    if detail:
        return ValidationResult(errors=[f"validation could not finish{where}: {detail}"])
    if returncode == -signal.SIGKILL:
        # Not our kill (that is the timeout above): the kernel's OOM killer, when the machine has
        # less memory to spare than the limit allows.
        return ValidationResult(
            errors=[
                f"validation stopped{where}: its process was killed (SIGKILL), most likely because the machine ran "
                f"out of memory before the limit of {memory_mb} MB ({MEMORY_SETTING}) was reached; lower that limit"
            ]
        )
    how = f"was killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exited with status {returncode}"
    last = _last_line(tail)
    return ValidationResult(
        errors=[
            f"validation stopped{where}: its process {how}{': ' + last if last else ''} "
            f"(limits: {memory_mb} MB, {MEMORY_SETTING}; {timeout_seconds:g} s, {TIMEOUT_SETTING})"
        ]
    )


def _result_from_json(data: dict[str, Any]) -> ValidationResult:
    from registry.validation import ValidationResult

    return ValidationResult(
        errors=[str(item) for item in data["errors"]],
        warnings=[str(item) for item in data["warnings"]],
        signature=data["signature"],
        ir_version=data["ir_version"],
        opset=data["opset"],
        producer=data["producer"],
        external_data_files=set(data["external_data_files"]),
        batch_check=str(data.get("batch_check", "unchecked")),
        batch_note=str(data.get("batch_note", "")),
    )


# --- The child ------------------------------------------------------------------------------------


def child_main() -> None:
    """Entry point of the child: read the request on stdin, validate, write JSON lines on stdout."""
    # Native libraries may print to stdout; give them stderr, and keep stdout for the replies.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    request = json.load(sys.stdin)
    _limit_self(
        memory_mb=int(request["memory_mb"]),
        timeout_seconds=float(request["timeout_seconds"]),
        parent_pid=int(request["parent_pid"]),
    )

    def report(line: dict[str, Any]) -> None:
        out.write(json.dumps(line) + "\n")
        out.flush()

    try:
        # Imported only now: numpy, onnx and onnxruntime count against the memory limit too.
        import onnxruntime  # noqa: F401 - here, so a limit too small for it fails "while starting"

        from registry.validation import validate_bundle

        result = validate_bundle(
            Path(request["model_path"]),
            set(request["file_names"]),
            memory_limit_bytes=int(request["memory_mb"]) * 2**20,
            tokenizer_max_bytes=int(request["tokenizer_max_bytes"]),
            time_limit_seconds=float(request["timeout_seconds"]),
            on_step=lambda step: report({"step": step}),
        )
        reply: dict[str, Any] = {
            "result": {
                "errors": result.errors,
                "warnings": result.warnings,
                "signature": result.signature,
                "ir_version": result.ir_version,
                "opset": result.opset,
                "producer": result.producer,
                "external_data_files": sorted(result.external_data_files),
                "batch_check": result.batch_check,
                "batch_note": result.batch_note,
            }
        }
    except MemoryError:
        reply = {"stopped": "memory"}
    except BaseException as exc:  # noqa: BLE001 - every surprise becomes a readable error, never a traceback
        text = str(exc).strip()
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
