"""The embedded default's validation worker: one daemon thread that validates queued versions in turn.

Without a broker there is no Celery worker, and Celery's eager mode runs a task on the thread that
sends it. A validation re-queued by the sweep would then run on the embedded scheduler's thread,
and no sweep, promotion expiry or orphan collection would run until it ended. The sweep hands
such validations here instead. One at a time is enough: each runs in a child process under the
validation limits, so the queue always moves, and a laptop does not validate in parallel.
"""

from __future__ import annotations

import logging
import queue
import threading

from django.db import connection

logger = logging.getLogger(__name__)


class ValidationThread:
    """A queue of version ids and the one thread that validates them, started on first use."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._queued: set[int] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, version_id: int) -> None:
        with self._lock:
            if version_id in self._queued:
                return  # the sweep found it again before its turn came
            self._queued.add(version_id)
            self._queue.put(version_id)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="modelyard-validation", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        from registry.tasks import validate_version

        while True:
            version_id = self._queue.get()
            with self._lock:
                self._queued.discard(version_id)
            try:
                validate_version.apply(args=(version_id,))
            except Exception:  # one failed validation must not stop the queue
                logger.exception("in-process validation of version %s failed", version_id)
            finally:
                connection.close()  # idle between jobs, this thread holds no database connection


_worker = ValidationThread()


def submit_validation(version_id: int) -> None:
    """Validate the version on the in-process validation thread, after those queued before it."""
    _worker.submit(version_id)
