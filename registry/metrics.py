"""Prometheus metrics of the registry, exported by the web role's ``/metrics`` (and by ``--role all``).

Two kinds, added up differently:

- **Counted where they happen** (summed over a server's processes, like the data plane's): uploads
  by outcome with their duration, timed around :func:`registry.uploads.version_upload`.
- **Read from the database at scrape time** (:class:`DatabaseCollector`): validations by outcome
  with their duration, versions by status, the validation backlog, promotion requests by state,
  audit events, the periodic audit-chain verification's verdict, the fleet, asynchronous inference
  jobs queued and running with the rows they have left, and the Celery queue's length. These are
  the registry's state, the same whichever web process or replica answers, and they survive
  restarts; validations run in Celery workers, which serve no ``/metrics``, and are recorded on
  their version rows. Aggregate them across replicas with ``max``, not ``sum``.

The collector's queries are few and bounded: a few ``GROUP BY`` over the versions and promotion
requests tables (thousands of rows), single rows for the audit chain, the fleet seen within
``MODELYARD_FLEET_FORGET_SECONDS``, and one aggregate over the inference jobs that have not ended
(at most ``MODELYARD_INFERENCE_JOB_MAX_QUEUED``, on the kind-and-state index). None reads the audit
events table.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

from django.conf import settings
from django.db import close_old_connections, connection, models
from django.db.models import Count, DurationField, ExpressionWrapper, F, Min, Q, Sum
from django.utils import timezone
from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from modelyard import metrics as exposition
from registry import serving
from registry.errors import RegistryError, StorageDown
from registry.models import (
    AuditChainCheck,
    AuditChainHead,
    InferenceJob,
    InferenceJobState,
    InferenceWorker,
    ModelVersion,
    PromotionRequest,
    PromotionState,
    VersionStatus,
)

logger = logging.getLogger(__name__)

ACCEPTED, REFUSED, FAILED = "accepted", "refused", "failed"
VALIDATION_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)

UPLOAD_SECONDS = Histogram(
    "modelyard_upload_seconds",
    "Uploads through version_upload by outcome (accepted, refused with a 4xx, failed), and their duration",
    ["outcome"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
    registry=exposition.REGISTRY,
)

P = ParamSpec("P")
R = TypeVar("R")


def timed_upload(upload: Callable[P, R]) -> Callable[P, R]:
    """Count and time each call of ``upload`` by its outcome."""

    @functools.wraps(upload)
    def timed(*args: P.args, **kwargs: P.kwargs) -> R:
        started, outcome = time.perf_counter(), FAILED
        try:
            result = upload(*args, **kwargs)
            outcome = ACCEPTED
            return result
        except RegistryError as exc:
            outcome = FAILED if isinstance(exc, StorageDown) else REFUSED
            raise
        finally:
            UPLOAD_SECONDS.labels(outcome).observe(time.perf_counter() - started)

    return timed


# --- Read from the database and the broker at scrape time ---------------------------------------------


def _validations() -> HistogramMetricFamily:
    """Every validated version by outcome (ready, failed), with the time from its last claim to its verdict."""
    family = HistogramMetricFamily(
        "modelyard_validation_seconds",
        "Validations by outcome (ready, failed) and duration, from the version rows (all time)",
        labels=["outcome"],
    )
    took = ExpressionWrapper(F("validated_at") - F("validation_started_at"), output_field=DurationField())
    buckets = {
        f"le{i}": Count("id", filter=Q(took__lte=timedelta(seconds=b))) for i, b in enumerate(VALIDATION_BUCKETS)
    }
    rows = (
        ModelVersion.objects.filter(
            status__in=[VersionStatus.READY, VersionStatus.FAILED],
            validated_at__isnull=False,
            validation_started_at__isnull=False,
        )
        .annotate(took=took)
        .values("status")
        .annotate(count=Count("id"), total=Sum("took"), **buckets)
        .order_by("status")
    )
    found: dict[str, dict[str, Any]] = {row["status"]: dict(row) for row in rows}
    for outcome in (VersionStatus.READY, VersionStatus.FAILED):
        row = found.get(outcome)
        if row is None:
            counts, count, total = [0] * len(VALIDATION_BUCKETS), 0, 0.0
        else:
            counts = [row[f"le{i}"] for i in range(len(VALIDATION_BUCKETS))]
            count, total = row["count"], row["total"].total_seconds() if row["total"] else 0.0
        family.add_metric(
            [outcome.value],
            [(str(float(b)), c) for b, c in zip(VALIDATION_BUCKETS, counts, strict=True)] + [("+Inf", count)],
            total,
        )
    return family


def _versions() -> list[Metric]:
    by_status = dict(
        ModelVersion.objects.order_by().values_list("status").annotate(n=Count("id")).values_list("status", "n")
    )
    versions = GaugeMetricFamily("modelyard_model_versions", "Model versions by status", labels=["status"])
    for status in VersionStatus:
        versions.add_metric([status.value], by_status.get(status.value, 0))
    waiting = [VersionStatus.PENDING, VersionStatus.VALIDATING]
    oldest = ModelVersion.objects.filter(status__in=waiting).aggregate(oldest=Min("created_at"))["oldest"]
    backlog = GaugeMetricFamily(
        "modelyard_validation_backlog", "Versions waiting for or in validation (pending and validating)"
    )
    backlog.add_metric([], sum(by_status.get(s.value, 0) for s in waiting))
    age = GaugeMetricFamily(
        "modelyard_validation_backlog_oldest_seconds", "Age of the oldest version waiting for or in validation"
    )
    age.add_metric([], (timezone.now() - oldest).total_seconds() if oldest else 0.0)
    return [versions, backlog, age]


def _promotions() -> GaugeMetricFamily:
    by_state = dict(
        PromotionRequest.objects.order_by().values_list("state").annotate(n=Count("id")).values_list("state", "n")
    )
    family = GaugeMetricFamily(
        "modelyard_promotion_requests", "Promotion (and unprotect) requests by state", labels=["state"]
    )
    for state in PromotionState:
        family.add_metric([state.value], by_state.get(state.value, 0))
    return family


def _audit() -> list[Metric]:
    head = AuditChainHead.objects.filter(pk=1).values_list("last_seq", flat=True).first() or 0
    events = CounterMetricFamily("modelyard_audit_events", "Events appended to the audit chain")
    events.add_metric([], head)
    families: list[Metric] = [events]
    check = AuditChainCheck.objects.filter(pk=1).first()
    if check is not None and check.checked_at is not None:  # absent until the periodic check has run once
        ok = GaugeMetricFamily(
            "modelyard_audit_chain_ok", "1 while the periodic verification finds the audit chain sound, else 0"
        )
        ok.add_metric([], 1 if check.ok else 0)
        seq = GaugeMetricFamily(
            "modelyard_audit_chain_verified_seq", "The audit event up to which the chain has been verified"
        )
        seq.add_metric([], check.verified_seq)
        at = GaugeMetricFamily(
            "modelyard_audit_chain_checked_timestamp_seconds", "When the periodic verification last ran (Unix time)"
        )
        at.add_metric([], check.checked_at.timestamp())
        families += [ok, seq, at]
    return families


def _fleet() -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "modelyard_fleet_worker_up",
        "1 for an online inference process, 0 for one that stopped reporting without leaving the fleet",
        labels=["worker"],
    )
    now = timezone.now()
    seen = now - timedelta(seconds=settings.FLEET_FORGET_SECONDS)
    workers = InferenceWorker.objects.filter(heartbeat_at__gte=seen).order_by("worker_id")
    for worker_id, heartbeat_at in workers.values_list("worker_id", "heartbeat_at"):
        family.add_metric([worker_id], 1 if serving.is_online(heartbeat_at, now=now) else 0)
    return family


def _jobs() -> list[Metric]:
    """Inference jobs (batch jobs and infer-async requests) that have not ended, and their rows not yet computed."""
    waiting = [InferenceJobState.QUEUED, InferenceJobState.RUNNING]
    left = ExpressionWrapper(F("rows") - F("rows_done"), output_field=models.BigIntegerField())
    by_state: dict[str, dict[str, Any]] = {
        row["state"]: dict(row)
        for row in InferenceJob.objects.filter(state__in=waiting)
        .order_by()
        .values("state")
        .annotate(n=Count("id"), left=Sum(left))  # rows is null until the input is split: unknown, counted as 0
    }
    jobs = GaugeMetricFamily(
        "modelyard_inference_jobs",
        "Asynchronous inference jobs waiting (queued) or in progress (running)",
        labels=["state"],
    )
    for state in waiting:
        jobs.add_metric([state.value], by_state.get(state.value, {}).get("n", 0))
    rows = GaugeMetricFamily(
        "modelyard_inference_job_rows_queued",
        "Rows of queued and running inference jobs not computed yet (rows of inputs not yet split: not counted)",
    )
    rows.add_metric([], sum(max(row["left"] or 0, 0) for row in by_state.values()))
    return [jobs, rows]


def celery_queue_length(url: str, queue: str, timeout: float) -> int:
    """Messages waiting in a Celery queue: a passive declare (Redis LLEN, AMQP's message count), within ``timeout``."""
    from kombu import Connection
    from kombu.exceptions import ChannelError

    if url.startswith(("redis://", "rediss://", "unix://")):
        options: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    elif url.startswith(("amqp://", "amqps://", "pyamqp://")):
        options = {"read_timeout": timeout, "write_timeout": timeout}
    else:
        options = {}
    with Connection(url, connect_timeout=timeout, transport_options=options) as conn:
        conn.ensure_connection(max_retries=0)
        channel = conn.channel()
        try:
            return int(channel.queue_declare(queue=queue, passive=True).message_count)
        except ChannelError:  # never declared, or (Redis) empty: nothing waits
            return 0
        except Exception as exc:  # amqp's NotFound is a ChannelError subclass of its own library
            if getattr(exc, "code", None) == 404:
                return 0
            raise
        finally:
            channel.close()


class DatabaseCollector:
    """The registry's state for a scrape; blocking (run the scrape in a thread)."""

    def collect(self) -> Iterator[Metric]:
        _fresh_connection()
        up = GaugeMetricFamily(
            "modelyard_registry_metrics_up", "1 when the registry's metrics could be read from the database, else 0"
        )
        try:
            families = [_validations(), *_versions(), _promotions(), *_audit(), _fleet(), *_jobs()]
        except Exception as exc:  # noqa: BLE001 - a scrape still answers with everything else
            logger.warning("registry metrics: the database could not be read: %s", exc)
            families = []
        up.add_metric([], 1 if families else 0)
        yield up
        yield from families
        yield from self._broker()

    @staticmethod
    def _broker() -> Iterator[Metric]:
        url = settings.BROKER_URL
        if not url:  # tasks run in-process: there is no queue
            return
        from modelyard.celery import app

        queue = app.conf.task_default_queue or "celery"
        family = GaugeMetricFamily(
            "modelyard_celery_queue_length", "Tasks waiting in the Celery queue of the broker", labels=["queue"]
        )
        try:
            family.add_metric([queue], celery_queue_length(url, queue, settings.READY_TIMEOUT_SECONDS))
        except Exception as exc:  # noqa: BLE001 - a broker that is down leaves the metric out, not the scrape
            logger.warning("registry metrics: the broker could not be asked for the queue length: %s", exc)
            return
        yield family


DATABASE = DatabaseCollector()


# --- The web role's /metrics ---------------------------------------------------------------------------


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``GET /metrics`` of the web role: the same token rule as the data plane's (``MODELYARD_METRICS_PUBLIC``)."""
    method = scope.get("method", "GET")
    headers: list[tuple[bytes, bytes]]
    if method not in ("GET", "HEAD"):
        status, body = 405, json.dumps({"error": f"{method} is not allowed on /metrics"}).encode()
        headers = [(b"content-type", b"application/json"), (b"allow", b"GET, HEAD")]
    elif not settings.METRICS_PUBLIC and not await _token_allowed(scope):
        status, body = 401, json.dumps({"error": exposition.NEEDS_TOKEN}).encode()
        headers = [(b"content-type", b"application/json")]
    else:
        body, content_type = await asyncio.to_thread(exposition.render)
        status, headers = 200, [(b"content-type", content_type.encode())]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})


async def _token_allowed(scope: dict[str, Any]) -> bool:
    authorization = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
    token = serving.bearer_token(authorization.decode("latin-1")) or ""
    return bool(token) and await asyncio.to_thread(_may_scrape, token)


def _may_scrape(token: str) -> bool:
    _fresh_connection()
    return serving.token_may_infer(token)


def _fresh_connection() -> None:
    """Scrapes run on a server's worker threads, which keep their connections: drop one broken or too old.

    Not inside a transaction (a caller's own, as in tests), where Django would take it for a leak.
    """
    if not connection.in_atomic_block:
        close_old_connections()
