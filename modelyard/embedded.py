"""Periodic jobs for the embedded default, where there is no broker and no Celery beat.

``modelyard serve`` starts this thread when MODELYARD_BROKER_URL is unset and the process serves the
registry (:func:`runs_in`), so a laptop install still sweeps stuck validations and collects orphaned
artifacts on the beat schedule. No job runs a validation on this thread: the sweep hands what it finds
to the in-process validation thread (``registry/queueing.py``), so one slow or hostile model cannot
stop the schedule.
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import close_old_connections, connection

logger = logging.getLogger(__name__)


def runs_in(role: str) -> bool:
    """Whether a ``modelyard serve --role`` process runs the embedded beat: without a broker, unless it serves
    only inference. The jobs are the registry's; a process that serves only ``/v2`` would import the whole
    registry for them (onnx and validation, a second of CPU on a slow machine) and spend the cores of the
    models it serves on them, while the registry's own process runs the same schedule."""
    return settings.BROKER_URL is None and role != "inference"


class EmbeddedScheduler(threading.Thread):
    """Runs each CELERY_BEAT_SCHEDULE entry in-process at its interval."""

    def __init__(self) -> None:
        super().__init__(name="modelyard-embedded-beat", daemon=True)
        self._stop_event = threading.Event()

    def run(self) -> None:
        entries = {
            name: (str(entry["task"]), float(entry["schedule"]))
            for name, entry in settings.CELERY_BEAT_SCHEDULE.items()
        }
        next_run = {name: time.monotonic() + interval for name, (_, interval) in entries.items()}
        try:
            self._loop(entries, next_run)
        finally:
            connection.close()

    def _loop(self, entries: dict[str, tuple[str, float]], next_run: dict[str, float]) -> None:
        # registry.queueing.task discovers the task modules at the first job, not at start: they import the
        # whole registry (onnx, validation), a second of a server's start on a slow CPU, spent while it is
        # loading its models; and one thread at a time, since a job thread may be discovering them too.
        from registry.queueing import task

        while not self._stop_event.wait(1.0):
            now = time.monotonic()
            for name, (task_name, interval) in entries.items():
                if now < next_run[name]:
                    continue
                next_run[name] = now + interval
                try:
                    task(task_name).apply()
                except Exception:  # a failed run must not stop the schedule
                    logger.exception("embedded periodic job %s failed", name)
                finally:
                    close_old_connections()

    def stop(self) -> None:
        self._stop_event.set()
