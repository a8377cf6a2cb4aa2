"""Helpers the benchmark scripts share: a throwaway work folder, the JSON result, stopping servers.

Process groups are killed with ``modelyard.processes.kill_group``, the helper the tests use too.
"""

from __future__ import annotations

import json
import os
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


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def stat_cpu_seconds(stat: Path) -> float:
    """CPU seconds (user + system) in a /proc ``stat`` file: a process's (all its threads) or one thread's."""
    fields = stat.read_text().rsplit(")", 1)[1].split()  # after the name: state, ppid, ..., utime (12), stime (13)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of process group ``pgid`` (Linux)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ..., utime (12), stime (13)
            total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all cores, everything but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLOCK_TICKS


class CpuMeter:
    """Where the CPU went between :meth:`start` and :meth:`stop`: each named process group, this
    process (the load clients), and the rest of the machine (the database, anything else)."""

    def __init__(self, groups: dict[str, int]) -> None:
        self.groups = groups
        self._start: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        times = os.times()
        reading = {name: group_cpu_seconds(pgid) for name, pgid in self.groups.items()}
        reading["bench"] = times.user + times.system
        reading["machine"] = machine_busy_seconds()
        return reading

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> dict[str, float]:
        end = self._read()
        used = {name: round(end[name] - self._start[name], 2) for name in end}
        used["other"] = round(used["machine"] - sum(v for k, v in used.items() if k != "machine"), 2)
        return used


# --- closed-loop HTTP load ----------------------------------------------------------------------------

# One request's body and headers.
Request = tuple[bytes, dict[str, str]]
# What a connection sends next: given its random generator and how many it has sent so far.
NextRequest = Callable[[Any, int], Request]
# Whether an answer counts (``flagged`` in the summary): given the answer (its headers) and its whole body.
Flag = Callable[[Any, bytes], bool]


def _load_process(
    port: int, path: str, connections: int, seed: int, duration: float, make: NextRequest, flag: Flag | None, out: Any
) -> None:
    """``connections`` keep-alive connections, each sending one request after another until ``duration`` has passed."""
    import http.client
    import threading
    import time

    import numpy as np

    latencies: list[float] = []
    totals = {"errors": 0, "flagged": 0}
    lock = threading.Lock()
    end = time.monotonic() + duration

    def one_connection(index: int) -> None:
        rng = np.random.default_rng([seed, index])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine: list[float] = []
        failed = flagged = 0
        while time.monotonic() < end:
            body, headers = make(rng, len(mine))
            start = time.perf_counter()
            try:
                conn.request("POST", path, body=body, headers=headers)
                response = conn.getresponse()
                raw = response.read()
                if response.status != 200:
                    failed += 1
                elif flag is not None:
                    flagged += flag(response, raw)
            except OSError:
                failed += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            mine.append(time.perf_counter() - start)
        conn.close()
        with lock:
            latencies.extend(mine)
            totals["errors"] += failed
            totals["flagged"] += flagged

    threads = [threading.Thread(target=one_connection, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put((latencies, totals["errors"], totals["flagged"]))


class ClosedLoad:
    """``clients`` keep-alive connections over up to ``processes`` client processes, started at once.

    Each connection sends ``make(rng, sent)`` to ``path`` and waits for the answer before the next, for
    ``duration`` seconds; :meth:`join` waits for the end and sums them up.
    """

    def __init__(
        self,
        port: int,
        path: str,
        *,
        clients: int,
        duration: float,
        seed: int,
        make: NextRequest,
        flag: Flag | None = None,
        processes: int = 4,
    ) -> None:
        import multiprocessing

        self.duration = duration
        self.out: Any = multiprocessing.Queue()
        self.workers = []
        count = max(1, min(clients, processes))
        for index in range(count):
            share = clients // count + (1 if index < clients % count else 0)
            worker = multiprocessing.Process(
                target=_load_process,
                args=(port, path, share, seed * 100 + index, duration, make, flag, self.out),
            )
            worker.start()
            self.workers.append(worker)

    def join(self) -> Result:
        """Requests per second, p50 and p99 in ms, the request and error counts, and the flagged share."""
        import numpy as np

        latencies: list[float] = []
        errors = flagged = 0
        for _ in self.workers:
            got, failed, counted = self.out.get()
            latencies += got
            errors += failed
            flagged += counted
        for worker in self.workers:
            worker.join()
        ms = np.asarray(latencies) * 1000
        return {
            "req_per_s": round(len(latencies) / self.duration, 1),
            "p50_ms": round(float(np.percentile(ms, 50)), 2) if latencies else None,
            "p99_ms": round(float(np.percentile(ms, 99)), 2) if latencies else None,
            "requests": len(latencies),
            "errors": errors,
            "flagged_share": round(flagged / len(latencies), 3) if latencies else 0.0,
        }
