"""The embedded default's validation worker: one daemon thread that runs queued jobs in turn.

Without a broker there is no Celery worker, and Celery's eager mode runs a task on the thread that
sends it. A validation re-queued by the sweep would then run on the embedded scheduler's thread,
and no sweep, promotion expiry or orphan collection would run until it ended. The sweep hands
such validations to a :class:`JobThread` instead (``registry.tasks.validation_requeue``). One at a
time is enough: each validation runs in a child process under the validation limits, so the queue
always moves, and a laptop does not validate in parallel.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from django.db import connection

logger = logging.getLogger(__name__)


class JobThread:
    """A queue of ids and the one thread that runs ``run(id)`` for each, started on first use."""

    def __init__(self, *, name: str, run: Callable[[int], object]) -> None:
        self._name = name
        self._run_one = run
        self._queue: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._queued: set[int] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, item_id: int) -> None:
        """Run the job for ``item_id`` after those queued before it; an id already waiting is not queued twice."""
        with self._lock:
            if item_id in self._queued:
                return  # the sweep found it again before its turn came
            self._queued.add(item_id)
            self._queue.put(item_id)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            item_id = self._queue.get()
            with self._lock:
                self._queued.discard(item_id)
            try:
                self._run_one(item_id)
            except Exception:  # one failed job must not stop the queue
                logger.exception("in-process job %s for %s failed", self._name, item_id)
            finally:
                connection.close()  # idle between jobs, this thread holds no database connection
