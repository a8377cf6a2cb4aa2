"""The derive task and its queueing (beside ``registry/tasks.py``, which the upload service imports).

Kept apart so that the upload service, which queues validations from ``registry.tasks``, and the
derive job, which calls the upload service, form no import cycle.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from registry import derive_job, inprocess

logger = logging.getLogger(__name__)


@shared_task(acks_late=True, reject_on_worker_lost=True, bind=True)
def derive_version(self: Any, job_id: int) -> str:
    """Build the derived version of one derive job (claimed once, however often delivered)."""
    return derive_job.run_derive_job(job_id)


def derive_enqueue(job_id: int) -> None:
    """Queue a committed derive job: to Celery, or without a broker to the in-process derive thread.

    Without a broker Celery would run the task on the thread that queues it, the request's, and the
    POST would wait for the whole conversion; the job thread runs it instead and the POST answers 202.
    """
    try:
        if derive_version.app.conf.task_always_eager:
            _derive_thread.submit(job_id)
        else:
            derive_version.delay(job_id)
    except Exception:
        logger.exception("could not queue derive job %s", job_id)


def _derive_in_process(job_id: int) -> None:
    derive_version.apply(args=(job_id,))


_derive_thread = inprocess.JobThread(name="modelyard-derive", run=_derive_in_process)
