"""Handing jobs to a worker: a Celery task by its name, or without a broker an in-process job thread.

What queues a job names its task (the Celery name, which queued messages carry from one release to
the next) instead of importing ``registry/tasks.py``: the tasks call the services and the services
queue the tasks, so only the name ties them and the imports form no cycle. :func:`task` finds the
task by its name, discovering the task modules first as a worker does.

Without a broker there is no Celery worker, and Celery's eager mode runs a task on the thread that
sends it. A new version's validation then runs in its upload request, after commit. A validation
re-queued by the sweep would run on the embedded scheduler's thread, and no sweep, promotion expiry
or orphan collection would run until it ended; a derivation would hold its POST for the whole
conversion. Those go to a :class:`JobThread` instead. One at a time is enough: each job runs in a
child process under its limits (``onnxkit/sandbox.py``), so the queue always moves, and a laptop does
not validate in parallel.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from celery import current_app
from django.db import connection

logger = logging.getLogger(__name__)

VALIDATE_TASK = "registry.tasks.validate_version"
# The name it had in registry/tasks.py, kept for the messages queued before it joined registry/tasks.py.
DERIVE_TASK = "registry.derive_tasks.derive_version"
PURGE_TASK = "registry.tasks.purge_deleted_version"


# Discovering the task modules runs Celery's Django fix-up (the system checks, the URLconf) and imports the
# whole registry: one thread at a time, since the embedded beat and the job threads may both ask first.
_DISCOVERY = threading.Lock()
_discovered = False


def register_tasks(name: str | None = None) -> None:
    """Discover and register the task modules, once (with ``name``: unless that task is registered already)."""
    global _discovered
    with _DISCOVERY:
        if _discovered or (name is not None and name in current_app.tasks):
            return
        current_app.loader.import_default_modules()
        _discovered = True


def task(name: str) -> Any:
    """The Celery task registered as ``name``; the task modules are discovered on first use, as a worker does."""
    if name not in current_app.tasks:
        register_tasks(name)
    return current_app.tasks[name]


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


# --- Validation ----------------------------------------------------------------------------------


def validation_enqueue(version_id: int) -> None:
    """Queue a new version's validation; called once its row is committed.

    Nothing may escape: the upload has succeeded by now, and an error here (a broker that is
    down, or, without a broker, the in-process run itself) would turn it into a 500. The version
    stays ``pending`` (or ``validating`` with a heartbeat that goes stale) and the sweep queues it again.
    """
    try:
        task(VALIDATE_TASK).delay(version_id)
    except Exception:
        logger.exception("could not queue or run the validation of version %s; the sweep queues it again", version_id)


def validation_requeue(version_id: int) -> None:
    """Queue a validation that the sweep found lost.

    Without a broker Celery runs a task on the thread that sends it, here the embedded scheduler's,
    which would stop every other periodic job until the validation ended; the in-process validation
    thread runs it instead.
    """
    if current_app.conf.task_always_eager:
        _validation_thread.submit(version_id)
    else:
        validation_enqueue(version_id)


def _validate_in_process(version_id: int) -> None:
    task(VALIDATE_TASK).apply(args=(version_id,))


_validation_thread = JobThread(name="modelyard-validation", run=_validate_in_process)


# --- Derivations ---------------------------------------------------------------------------------


def derive_enqueue(job_id: int) -> None:
    """Queue a committed derive job: to Celery, or without a broker to the in-process derive thread.

    Without a broker Celery would run the task on the thread that queues it, the request's, and the
    POST would wait for the whole conversion; the job thread runs it instead and the POST answers 202.
    """
    try:
        if current_app.conf.task_always_eager:
            _derive_thread.submit(job_id)
        else:
            task(DERIVE_TASK).delay(job_id)
    except Exception:
        logger.exception("could not queue derive job %s", job_id)


def _derive_in_process(job_id: int) -> None:
    task(DERIVE_TASK).apply(args=(job_id,))


_derive_thread = JobThread(name="modelyard-derive", run=_derive_in_process)


# --- Deleted versions' files -----------------------------------------------------------------------


def purge_enqueue(version_id: int) -> None:
    """Queue the removal of a deleted version's files; called once the deletion is committed.

    Nothing may escape: the deletion has succeeded by now. A removal that is never queued, or that fails,
    is done by the periodic ``purge-deleted-versions`` job. Without a broker it runs here, on the
    request's thread: a few deletes in the store.
    """
    try:
        task(PURGE_TASK).delay(version_id)
    except Exception:
        logger.exception(
            "could not queue the removal of deleted version %s's files; the periodic job does it", version_id
        )


# --- Inference jobs ------------------------------------------------------------------------------------

PREPARE_JOB_TASK = "registry.tasks.prepare_inference_job"
FINISH_JOB_TASK = "registry.tasks.finish_inference_job"


def inference_job_prepare_enqueue(job_id: int) -> None:
    """Queue the splitting of a committed inference job's input: to Celery, or without a broker to a job thread.

    Without a broker Celery would run it on the request's thread, and the POST would wait for the
    split; the job thread runs it instead. A job whose queueing is lost is queued again by the sweep.
    """
    _job_step(PREPARE_JOB_TASK, _prepare_thread, job_id)


def inference_job_finish_enqueue(job_id: int) -> None:
    """Queue the assembling of a job's result once its last chunk is done (the chunk's own thread must not wait)."""
    _job_step(FINISH_JOB_TASK, _finish_thread, job_id)


# The sweep runs on the embedded scheduler's thread: the same job threads keep it from waiting on a step.
inference_job_prepare_requeue = inference_job_prepare_enqueue
inference_job_finish_requeue = inference_job_finish_enqueue


def _job_step(name: str, thread: JobThread, job_id: int) -> None:
    try:
        if current_app.conf.task_always_eager:
            thread.submit(job_id)
        else:
            task(name).delay(job_id)
    except Exception:
        logger.exception("could not queue %s for inference job %s; the sweep queues it again", name, job_id)


def _prepare_in_process(job_id: int) -> None:
    task(PREPARE_JOB_TASK).apply(args=(job_id,))


def _finish_in_process(job_id: int) -> None:
    task(FINISH_JOB_TASK).apply(args=(job_id,))


_prepare_thread = JobThread(name="modelyard-job-prepare", run=_prepare_in_process)
_finish_thread = JobThread(name="modelyard-job-finish", run=_finish_in_process)
