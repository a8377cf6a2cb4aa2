"""Prometheus exposition for every role: one ``/metrics`` answer that adds up across a server's processes.

``modelyard serve --workers N`` runs N processes behind one port, and a scrape reaches only one of
them. With a registry per process, successive scrapes would read different processes' counts,
which Prometheus takes for counter resets. So ``modelyard serve`` runs prometheus_client's
multiprocess mode: it makes a fresh folder for the run and names it in ``PROMETHEUS_MULTIPROC_DIR``
before any process imports prometheus_client (``modelyard/cli.py: serve``). Every process then keeps
its counts in memory-mapped files there, and whichever process answers a scrape sums them all.
Counters and histograms of a process that exited stay in the sum, so they never go back; gauges
are summed (or maxed) over live processes only: a worker that exits cleanly says so
(:func:`process_exit`), and the files of one that was killed are dropped at the next scrape
(:func:`_drop_dead_processes`).

Without that variable (tests, another ASGI server) the metrics are this process's own.

What a role adds at scrape time (GPU readings, numbers read from the database) are collectors
registered with :func:`add_collector`; they run on every scrape of this process and are never
summed, so they must report what is true of the host or the registry, not of one process.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

ENV = "PROMETHEUS_MULTIPROC_DIR"
NEEDS_TOKEN = "a bearer token with the inference or admin role is required (MODELYARD_METRICS_PUBLIC)"

# Every metric of the project is made with registry=REGISTRY: it is what a scrape renders when the
# process is not in multiprocess mode (in multiprocess mode the files are read instead).
REGISTRY = CollectorRegistry(auto_describe=True)

_collectors: list[Collector] = []


def add_collector(collector: Collector) -> None:
    """Run ``collector`` on every scrape of this process (once, however often it is added)."""
    if collector not in _collectors:
        _collectors.append(collector)


def remove_collector(collector: Collector) -> None:
    if collector in _collectors:
        _collectors.remove(collector)


def multiprocess_dir() -> str | None:
    return os.environ.get(ENV) or None


def process_exit() -> None:
    """This process stops: its live gauges (queue depth, ...) leave the sums. Its counters stay."""
    folder = multiprocess_dir()
    if folder:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid(), folder)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _drop_dead_processes(folder: str) -> None:
    """Gauges of a process that was killed (no clean exit) would stay in the live sums for ever."""
    from prometheus_client import multiprocess

    dead: set[int] = set()
    for path in glob.glob(os.path.join(folder, "gauge_live*_*.db")):
        suffix = Path(path).stem.rsplit("_", 1)[-1]
        if suffix.isdigit() and not _alive(int(suffix)):
            dead.add(int(suffix))
    for pid in dead:
        multiprocess.mark_process_dead(pid, folder)


class _Scrape:
    """The families of one scrape: every process's metrics (or this one's), then the role's collectors."""

    def __init__(self, sources: Iterable[Collector]) -> None:
        self.sources = list(sources)

    def collect(self) -> Iterator[Metric]:
        for source in self.sources:
            yield from source.collect()


def render() -> tuple[bytes, str]:
    """The exposition of this server for a scrape. Blocking (files, and the collectors' own reads)."""
    folder = multiprocess_dir()
    if folder:
        from prometheus_client import multiprocess

        _drop_dead_processes(folder)
        summed = CollectorRegistry()
        multiprocess.MultiProcessCollector(summed, folder)
        base: Collector = summed
    else:
        base = REGISTRY
    return generate_latest(_Scrape([base, *_collectors])), CONTENT_TYPE_LATEST
