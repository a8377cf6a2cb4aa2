"""The one seam between the registry (the control plane) and the inference runtime (the data plane).

``inference/`` imports nothing else from ``registry``; a test walks its imports to keep it so. What
crosses the seam are typed, frozen rows, never ORM objects or dicts read back by string keys:

- the desired state: which versions the served aliases point to (:func:`desired_state`);
- the worker report: what one inference process serves, written by its heartbeat
  (:func:`worker_heartbeat`), read back as the fleet (:func:`fleet_list`) with the one
  definition of "online" (:func:`offline_after`);
- the laggards of ``PUT alias?wait=``: online workers that do not serve a version yet
  (:func:`fleet_laggards`, :func:`fleet_wait`);
- the token check of ``/v2`` (:func:`token_inference_access`, :func:`token_may_infer`);
- benchmarks: the providers the fleet serves with (:func:`fleet_providers`), and the jobs an
  inference process takes for its provider, measures in a bounded child and writes back
  (``benchmark_claim``, ``benchmark_measure``, ``benchmark_record`` from ``registry/benchmarks/services.py``);
- and the registry's own names the runtime reads the state with: the ``production`` alias, the
  serving strategies, and the alias-change listener.

What both planes need of ONNX itself (the datatype table, the tokenizer, warm-up inputs, the sandbox)
is not here: ``inference/`` imports it from ``onnxkit`` directly.

Everything here that touches the database blocks: the data plane calls it from worker threads.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from registry import notify
from registry.access import clients
from registry.access.auth import authenticate_token, bearer_token, split_token, token_roles
from registry.access.scopes import model_in_scope, out_of_scope_message
from registry.audit.chain import SYSTEM, audit_version
from registry.benchmarks.services import SHARED_NOTE, BenchmarkJob, benchmark_claim, benchmark_measure, benchmark_record
from registry.jobs.chunks import (
    JobChunk,
    job_chunk_claim,
    job_chunk_done,
    job_chunk_failed,
    job_chunk_progress,
    job_versions,
)
from registry.models import (
    PRODUCTION,
    Alias,
    AliasRollout,
    AliasShadow,
    AuditEvent,
    FileRole,
    InferenceWorker,
    ModelVersion,
    RegisteredModel,
    Role,
    RolloutState,
    ServingStrategy,
    ShadowTally,
    VersionStatus,
)
from registry.provenance.services import ServedSignature, served_signatures

__all__ = [
    "PRODUCTION",
    "REFUSED_GRANT",
    "SHARED_NOTE",
    "TRAFFIC_BUCKETS",
    "TRAFFIC_BUCKET_SECONDS",
    "BenchmarkJob",
    "CacheSpec",
    "CacheTotals",
    "DesiredState",
    "DeviceRow",
    "FleetWorker",
    "InferenceAccess",
    "JobChunk",
    "Laggard",
    "LoadState",
    "LoadedRow",
    "ServedFile",
    "ServingStrategy",
    "ShadowSpec",
    "ShadowTallyRow",
    "SplitSpec",
    "TokenGrant",
    "TrafficBucket",
    "TrafficTotals",
    "VersionSpec",
    "WorkerReport",
    "alias_changes",
    "bearer_token",
    "benchmark_claim",
    "benchmark_measure",
    "benchmark_record",
    "caller_address",
    "desired_state",
    "fleet_laggards",
    "fleet_list",
    "fleet_providers",
    "fleet_wait",
    "is_online",
    "job_chunk_claim",
    "job_chunk_done",
    "job_chunk_failed",
    "job_chunk_progress",
    "offline_after",
    "token_grant",
    "token_inference_access",
    "token_may_infer",
    "token_shaped",
    "worker_heartbeat",
    "worker_leave",
]


def caller_address(peer: str, forwarded_for: str) -> str:
    """The client's address as the registry records it: ``X-Forwarded-For`` counts only via a trusted proxy."""
    return clients.client_address({"REMOTE_ADDR": peer, "HTTP_X_FORWARDED_FOR": forwarded_for})[0]


# The least time without a heartbeat after which a worker counts as offline, whatever the interval.
MIN_OFFLINE_SECONDS = 15.0


class LoadState(models.TextChoices):
    """Where one version stands in one inference process."""

    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    DRAINING = "draining"
    CLOSED = "closed"


# --- The desired state ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ServedFile:
    """One file of a served version's bundle, as the artifact cache fetches and verifies it."""

    name: str
    storage_key: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True)
class VersionSpec:
    """What the registry says one served version is."""

    version_id: int
    model: str
    version: int
    sha256: str
    files: tuple[ServedFile, ...]
    model_file: str
    signature: dict[str, Any]
    strategy: str
    max_batch_size: int = 32
    max_queue_delay_us: int = 0
    max_queue_size: int = 1024
    instances: int | None = None  # batches in flight at once; None: by provider (1 on the CPU, 2 on a GPU)
    # Whether concurrent requests are merged into one run (ModelVersion.batching_decision), and why. The
    # runtime also merges only when every input and output has a dynamic first dimension.
    batching: bool = True
    batching_reason: str = ""
    # The bundles every load verifies; none means the version is not signed, and it is not loaded.
    signatures: tuple[ServedSignature, ...] = ()
    # Only a shadow's candidate: no alias or rollout routes requests to it (its session's threads sleep).
    mirror_only: bool = False

    @property
    def batching_settings(self) -> tuple[int, int, int, int | None, bool, str]:
        """What ``PATCH /api/v1/models/{m}`` may change while the version serves: a loaded version takes it as is."""
        return (
            self.max_batch_size,
            self.max_queue_delay_us,
            self.max_queue_size,
            self.instances,
            self.batching,
            self.batching_reason,
        )


@dataclass(frozen=True)
class ShadowSpec:
    """A candidate mirroring a sample of one served alias's requests (``registry/shadow/services.py``)."""

    shadow_id: int
    version_id: int
    sample: float  # the share of the alias's requests mirrored


@dataclass(frozen=True)
class SplitSpec:
    """A rollout's split of one served alias: ``percent`` of its requests go to the candidate version."""

    rollout_id: int
    version_id: int
    percent: int


@dataclass(frozen=True)
class CacheSpec:
    """An alias's response cache (``Alias.cache_max_bytes``, ``cache_ttl_seconds``): on when it is in the state."""

    max_bytes: int
    ttl_seconds: int


@dataclass(frozen=True)
class DesiredState:
    """Every version a served alias points to or shadows, and the routes to them."""

    versions: Mapping[int, VersionSpec]
    # model name -> alias name -> version id
    routes: Mapping[str, Mapping[str, int]]
    # model name -> alias name -> the running shadow of that alias; its version is in ``versions``
    shadows: Mapping[str, Mapping[str, ShadowSpec]] = field(default_factory=dict)
    # model name -> alias name -> the rollout splitting that alias's requests; its version is in ``versions``
    splits: Mapping[str, Mapping[str, SplitSpec]] = field(default_factory=dict)
    # model name -> alias name -> its response cache, for the served aliases that opted in
    caches: Mapping[str, Mapping[str, CacheSpec]] = field(default_factory=dict)


def _version_spec(model: RegisteredModel, version: ModelVersion) -> VersionSpec:
    files = version.files.all()
    batching = version.batching_decision(model)
    return VersionSpec(
        version_id=version.pk,
        model=model.name,
        version=version.version,
        sha256=version.sha256,
        files=tuple(ServedFile(f.name, f.storage_key, f.sha256, f.size_bytes) for f in files),
        model_file=next(f.name for f in files if f.role == FileRole.MODEL),
        signature=version.signature,
        strategy=model.serving_strategy,
        max_batch_size=model.max_batch_size,
        max_queue_delay_us=model.max_queue_delay_us,
        max_queue_size=model.max_queue_size,
        instances=model.instances,
        batching=batching.merges,
        batching_reason=batching.reason,
        signatures=served_signatures(version),
    )


def desired_state() -> DesiredState:
    """Read every version a served alias points to or shadows (a query each, plus the files and signatures)."""
    aliases = (
        Alias.objects.filter(served=True, version__isnull=False, version__status=VersionStatus.READY)
        .select_related("model", "version")
        .prefetch_related("version__files", "version__signatures")
    )
    versions: dict[int, VersionSpec] = {}
    routes: dict[str, dict[str, int]] = {}
    caches: dict[str, dict[str, CacheSpec]] = {}
    for alias in aliases:
        version = alias.version
        assert version is not None
        versions[version.pk] = _version_spec(alias.model, version)
        routes.setdefault(alias.model.name, {})[alias.name] = version.pk
        if alias.cache_max_bytes is not None and alias.cache_ttl_seconds is not None:
            caches.setdefault(alias.model.name, {})[alias.name] = CacheSpec(
                alias.cache_max_bytes, alias.cache_ttl_seconds
            )
    shadows: dict[str, dict[str, ShadowSpec]] = {}
    running = (
        AliasShadow.objects.filter(
            ended_at__isnull=True,
            alias__served=True,
            alias__version__status=VersionStatus.READY,
            version__status=VersionStatus.READY,
        )
        .select_related("alias__model", "version")
        .prefetch_related("version__files", "version__signatures")
    )
    for shadow in running:
        model = shadow.alias.model
        if shadow.version_id == shadow.alias.version_id:
            continue  # the alias serves the candidate itself now: nothing to compare
        if shadow.version_id not in versions:
            versions[shadow.version_id] = replace(_version_spec(model, shadow.version), mirror_only=True)
        shadows.setdefault(model.name, {})[shadow.alias.name] = ShadowSpec(shadow.pk, shadow.version_id, shadow.sample)
    splits: dict[str, dict[str, SplitSpec]] = {}
    rolling = (
        AliasRollout.objects.filter(
            state__in=(RolloutState.RUNNING, RolloutState.PAUSED),
            alias__served=True,
            alias__version__status=VersionStatus.READY,
            version__status=VersionStatus.READY,
        )
        .select_related("alias__model", "version")
        .prefetch_related("version__files", "version__signatures")
    )
    for rollout in rolling:
        model = rollout.alias.model
        if rollout.version_id == rollout.alias.version_id or not rollout.percent:
            continue
        if rollout.version_id not in versions:
            versions[rollout.version_id] = _version_spec(model, rollout.version)
        elif versions[rollout.version_id].mirror_only:  # shadowed on one alias, routed a share on another
            versions[rollout.version_id] = replace(versions[rollout.version_id], mirror_only=False)
        splits.setdefault(model.name, {})[rollout.alias.name] = SplitSpec(
            rollout.pk, rollout.version_id, rollout.percent
        )
    for version in job_versions():  # a queued or running job keeps its version loaded, routed or not (registry/jobs)
        if version.pk not in versions:
            versions[version.pk] = _version_spec(version.model, version)
    return DesiredState(versions=versions, routes=routes, shadows=shadows, splits=splits, caches=caches)


# --- The worker report -----------------------------------------------------------------------------


# The traffic an inference process reports per loaded version: this many intervals of this many seconds.
TRAFFIC_BUCKET_SECONDS = 10
TRAFFIC_BUCKETS = 30
# Latency bins of those figures: upper edges from 0.1 ms, 2**(1/4) apart, to two minutes; one more bin
# past the last catches anything slower. A quantile is reported as its bin's upper edge.
TRAFFIC_LATENCY_RATIO = 2 ** (1 / 4)
TRAFFIC_LATENCY_BOUNDS: tuple[float, ...] = tuple(
    0.0001 * TRAFFIC_LATENCY_RATIO**i for i in range(int(math.log(120 / 0.0001, TRAFFIC_LATENCY_RATIO)) + 2)
)


@dataclass(frozen=True)
class TrafficTotals:
    """Every request one version answered in one process since it loaded (``inference/traffic.py``).

    Cumulative, so the registry can measure any interval exactly as the difference of two reports (a
    rollout's step, ``registry/rollout/services.py``). ``latency``: bin index (of
    ``TRAFFIC_LATENCY_BOUNDS``, as a string) -> requests.
    """

    requests: int = 0
    errors: int = 0
    latency: Mapping[str, int] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "errors": self.errors, "latency": dict(self.latency)}

    @classmethod
    def from_json(cls, row: Mapping[str, Any] | None) -> TrafficTotals:
        row = row or {}
        return cls(int(row.get("requests", 0)), int(row.get("errors", 0)), dict(row.get("latency") or {}))

    def minus(self, earlier: TrafficTotals) -> TrafficTotals:
        """What was added since ``earlier``; all of it when the counts went back (the version was loaded again)."""
        if self.requests < earlier.requests:
            return self
        latency = {k: n - earlier.latency.get(k, 0) for k, n in self.latency.items()}
        return TrafficTotals(
            self.requests - earlier.requests, self.errors - earlier.errors, {k: n for k, n in latency.items() if n > 0}
        )

    def plus(self, other: TrafficTotals) -> TrafficTotals:
        latency = dict(self.latency)
        for key, n in other.latency.items():
            latency[key] = latency.get(key, 0) + n
        return TrafficTotals(self.requests + other.requests, self.errors + other.errors, latency)

    def quantile_ms(self, q: float) -> float | None:
        """The upper edge of the bin holding the ``q`` quantile, in ms; None without requests."""
        total = sum(self.latency.values())
        if not total:
            return None
        rank, seen = max(1, math.ceil(q * total)), 0
        for key in sorted(self.latency, key=int):
            seen += self.latency[key]
            if seen >= rank:
                index = int(key)
                bounds = TRAFFIC_LATENCY_BOUNDS
                edge = bounds[index] if index < len(bounds) else bounds[-1] * TRAFFIC_LATENCY_RATIO
                return float(f"{edge * 1000:.3g}")
        return None  # pragma: no cover - the ranks add up to the total


@dataclass(frozen=True)
class TrafficBucket:
    """The requests one version answered in one interval of a worker's last minutes (``inference/traffic.py``)."""

    start: float  # seconds since the epoch
    seconds: float  # the interval's length; less for the one still filling
    requests: int
    errors: int
    p50_ms: float | None  # None when the interval saw no request
    p99_ms: float | None

    @property
    def rate(self) -> float:
        """Requests per second."""
        return self.requests / self.seconds if self.seconds else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "seconds": self.seconds,
            "requests": self.requests,
            "errors": self.errors,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
        }

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> TrafficBucket:
        return cls(
            start=row["start"],
            seconds=row["seconds"],
            requests=row["requests"],
            errors=row["errors"],
            p50_ms=row.get("p50_ms"),
            p99_ms=row.get("p99_ms"),
        )


@dataclass(frozen=True)
class CacheTotals:
    """One loaded version's response cache counts in one process, since it loaded."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes: int = 0  # in use in this process's memory (0 with Redis)

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float | None:
        """Hits over lookups; None before any lookup."""
        return self.hits / self.lookups if self.lookups else None

    def as_json(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions, "bytes": self.bytes}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> CacheTotals:
        return cls(
            hits=int(row.get("hits", 0)),
            misses=int(row.get("misses", 0)),
            evictions=int(row.get("evictions", 0)),
            bytes=int(row.get("bytes", 0)),
        )


@dataclass(frozen=True)
class LoadedRow:
    """One version in one worker's report: its state, the aliases it serves, and how its load went."""

    model: str
    version: int
    state: LoadState
    aliases: tuple[str, ...] = ()
    error: str = ""
    load_seconds: float | None = None
    memory_bytes: int | None = None
    provider: str = ""
    note: str = ""  # e.g. why the session runs on another provider than the one requested
    attempts: int = 0  # failed loads so far
    instances: int = 0  # batches it runs at once (the model's setting, or the provider's default); 0 when not loaded
    batching: bool | None = None  # whether it merges concurrent requests; None when not loaded
    batching_reason: str = ""
    # The last minutes of requests, for the fleet page; left out of comparisons, so that traffic alone
    # does not make the runtime report before its heartbeat is due.
    traffic: tuple[TrafficBucket, ...] = field(default=(), compare=False)
    totals: TrafficTotals = field(default_factory=TrafficTotals, compare=False)
    # The aliases whose share of requests this version answers in a rollout: alias -> percent
    splits: Mapping[str, int] = field(default_factory=dict)
    shadows: tuple[str, ...] = ()  # the aliases whose requests it answers on the side, as a shadow
    # Its response cache's counts since it loaded (``inference/response_cache.py``); None when no alias caches it.
    cache: CacheTotals | None = field(default=None, compare=False)

    def as_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "model": self.model,
            "version": self.version,
            "aliases": list(self.aliases),
            "state": self.state.value,
            "error": self.error,
            "load_seconds": self.load_seconds,
            "memory_bytes": self.memory_bytes,
            "provider": self.provider,
            "note": self.note,
            "attempts": self.attempts,
            "instances": self.instances,
            "batching": self.batching,
            "batching_reason": self.batching_reason,
            "traffic": [bucket.as_json() for bucket in self.traffic],
            "totals": self.totals.as_json(),
            "splits": dict(self.splits),
            "shadows": list(self.shadows),
        }
        if self.cache is not None:  # only where a caching alias reached the version
            row["cache"] = self.cache.as_json()
        return row

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> LoadedRow:
        return cls(
            model=row["model"],
            version=row["version"],
            state=LoadState(row["state"]),
            aliases=tuple(row.get("aliases", ())),
            error=row.get("error", ""),
            load_seconds=row.get("load_seconds"),
            memory_bytes=row.get("memory_bytes"),
            provider=row.get("provider", ""),
            note=row.get("note", ""),
            attempts=row.get("attempts", 0),
            instances=row.get("instances", 0),
            batching=row.get("batching"),
            batching_reason=row.get("batching_reason", ""),
            traffic=tuple(TrafficBucket.from_json(bucket) for bucket in row.get("traffic", ())),
            totals=TrafficTotals.from_json(row.get("totals")),
            splits=dict(row.get("splits") or {}),
            shadows=tuple(row.get("shadows", ())),
            cache=CacheTotals.from_json(row["cache"]) if row.get("cache") else None,
        )


@dataclass(frozen=True)
class DeviceRow:
    """One GPU an inference process sees, and its memory in use (all processes on it) when it reported."""

    index: int
    name: str
    memory_used_bytes: int | None
    memory_total_bytes: int | None

    def as_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "memory_used_bytes": self.memory_used_bytes,
            "memory_total_bytes": self.memory_total_bytes,
        }

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> DeviceRow:
        return cls(
            index=row["index"],
            name=row.get("name", ""),
            memory_used_bytes=row.get("memory_used_bytes"),
            memory_total_bytes=row.get("memory_total_bytes"),
        )


@dataclass(frozen=True)
class ShadowTallyRow:
    """What one process counted for one shadow since it began mirroring it (``onnxkit.agreement.Tally``)."""

    shadow_id: int
    tally: Mapping[str, Any]


@dataclass(frozen=True)
class WorkerReport:
    """What one inference process reports with each heartbeat."""

    worker_id: str
    host: str
    pid: int
    device: str
    provider: str
    started_at: datetime
    loaded: tuple[LoadedRow, ...]
    errors: tuple[str, ...] = ()
    devices: tuple[DeviceRow, ...] = ()  # GPUs read through NVML; none without one
    notice: str = ""  # why every session falls back from the GPU asked for (each loaded row's note repeats it)
    shadows: tuple[ShadowTallyRow, ...] = ()


def worker_heartbeat(report: WorkerReport) -> None:
    """Write the report as the worker's fleet row, stamped now; raises DatabaseError when the database is away.

    Its shadow tallies are kept apart, one row per shadow and worker, so they outlive the process.
    """
    InferenceWorker.objects.update_or_create(
        worker_id=report.worker_id,
        defaults={
            "host": report.host,
            "pid": report.pid,
            "device": report.device,
            "provider": report.provider,
            "loaded": [row.as_json() for row in report.loaded],
            "errors": list(report.errors),
            "devices": [row.as_json() for row in report.devices],
            "notice": report.notice,
            "started_at": report.started_at,
            "heartbeat_at": timezone.now(),
        },
    )
    if report.shadows:
        _shadow_tallies_write(report.worker_id, report.shadows)
    _versions_served_stamp(report.loaded)


# How often a served version's ``last_served_at`` is written: retention counts in days.
SERVED_STAMP_SECONDS = 60


def _versions_served_stamp(rows: tuple[LoadedRow, ...]) -> None:
    """Stamp the versions the worker serves as served now (once a minute at most), for retention rules."""
    served = Q()
    for row in rows:
        if row.state == LoadState.READY:
            served |= Q(model__name=row.model, version=row.version)
    if not served.children:
        return
    now = timezone.now()
    stale = Q(last_served_at__isnull=True) | Q(last_served_at__lt=now - timedelta(seconds=SERVED_STAMP_SECONDS))
    ModelVersion.objects.filter(served).filter(stale).update(last_served_at=now)


def _shadow_tallies_write(worker_id: str, rows: tuple[ShadowTallyRow, ...]) -> None:
    """Upsert the worker's tallies of the shadows that still exist (ended ones included: their last counts)."""
    known = set(AliasShadow.objects.filter(pk__in=[row.shadow_id for row in rows]).values_list("pk", flat=True))
    ShadowTally.objects.bulk_create(
        [
            ShadowTally(shadow_id=row.shadow_id, worker_id=worker_id, tally=dict(row.tally))
            for row in rows
            if row.shadow_id in known
        ],
        update_conflicts=True,
        unique_fields=["shadow", "worker_id"],
        update_fields=["tally", "updated_at"],
    )


def worker_leave(worker_id: str) -> None:
    """A cleanly stopping worker leaves the fleet: ``?wait=`` then neither waits for nor names it.

    Only a process that vanished without stopping (killed, cut off) stays in the fleet, offline.
    Raises DatabaseError when the database is away.
    """
    InferenceWorker.objects.filter(worker_id=worker_id).delete()


VERIFY_FAILED = "version.verify_failed"


def verify_failed_record(*, worker_id: str, host: str, model: str, version: int, reason: str) -> bool:
    """Audit that a host refused a version's bytes (``version.verify_failed``), once per host and version.

    The load is retried with backoff; only the first refusal on each host is an event. Returns
    whether this call wrote it.
    """
    with transaction.atomic(durable=True):
        target = ModelVersion.objects.select_related("model").filter(model__name=model, version=version).first()
        if target is None:
            return False
        seen = AuditEvent.objects.filter(action=VERIFY_FAILED, target=f"{model}/{version}", after__host=host)
        if seen.exists():
            return False
        actor = replace(SYSTEM, label=f"inference:{worker_id}")
        audit_version(
            target, actor=actor, action=VERIFY_FAILED, after={"host": host, "worker": worker_id, "reason": reason}
        )
    return True


# --- The fleet -------------------------------------------------------------------------------------


def offline_after() -> timedelta:
    """The one definition of offline: three missed heartbeats, and never less than 15 s."""
    return timedelta(seconds=max(3 * settings.FLEET_HEARTBEAT_SECONDS, MIN_OFFLINE_SECONDS))


def fleet_providers() -> set[str]:
    """The providers online inference processes serve with; the CPU's when none is online (the embedded default)."""
    since = timezone.now() - offline_after()
    providers = set(InferenceWorker.objects.filter(heartbeat_at__gte=since).values_list("provider", flat=True))
    return providers or {"CPUExecutionProvider"}


def is_online(heartbeat_at: datetime, *, now: datetime | None = None) -> bool:
    return heartbeat_at >= (now or timezone.now()) - offline_after()


@dataclass(frozen=True)
class FleetWorker:
    """One inference process as the fleet shows it."""

    worker_id: str
    host: str
    pid: int
    device: str
    provider: str
    online: bool
    heartbeat_at: datetime
    started_at: datetime
    loaded: tuple[LoadedRow, ...]
    errors: tuple[str, ...]
    devices: tuple[DeviceRow, ...] = ()
    notice: str = ""


def fleet_list(*, online_only: bool = False, seen_within: timedelta | None = None) -> list[FleetWorker]:
    """Every worker that has reported (only the online ones, or those heard from within ``seen_within``); one query."""
    now = timezone.now()
    workers = InferenceWorker.objects.order_by("worker_id")
    if online_only:
        workers = workers.filter(heartbeat_at__gte=now - offline_after())
    elif seen_within is not None:
        workers = workers.filter(heartbeat_at__gte=now - seen_within)
    return [
        FleetWorker(
            worker_id=worker.worker_id,
            host=worker.host,
            pid=worker.pid,
            device=worker.device,
            provider=worker.provider,
            online=is_online(worker.heartbeat_at, now=now),
            heartbeat_at=worker.heartbeat_at,
            started_at=worker.started_at,
            loaded=tuple(LoadedRow.from_json(row) for row in worker.loaded),
            errors=tuple(worker.errors),
            devices=tuple(DeviceRow.from_json(row) for row in worker.devices or ()),
            notice=worker.notice,
        )
        for worker in workers
    ]


OFFLINE = "offline"


@dataclass(frozen=True)
class Laggard:
    """A worker that does not serve the version under the alias yet, and why, as far as it says."""

    worker_id: str
    serving: int | None  # the version it serves under the alias now, if any
    state: str  # the version's load state in that worker, "not loaded", or "offline"
    error: str

    def as_json(self) -> dict[str, Any]:
        return {"worker_id": self.worker_id, "serving": self.serving, "state": self.state, "error": self.error}


def fleet_laggards(*, model: str, alias: str, version: int) -> list[Laggard]:
    """Inference workers that do not serve ``version`` under ``alias``.

    Online workers that have not loaded it (yet, or at all), and workers that went offline within
    ``MODELYARD_FLEET_FORGET_SECONDS`` without leaving the fleet: cut off from the registry, they may
    well go on serving their last version to whoever still reaches them, which is what an operator
    waiting on a promotion needs to hear. A cleanly stopped worker has left the fleet.
    """
    behind = []
    for worker in fleet_list(seen_within=timedelta(seconds=settings.FLEET_FORGET_SECONDS)):
        serving = [
            row for row in worker.loaded if row.model == model and alias in row.aliases and row.state == LoadState.READY
        ]
        if any(row.version == version for row in serving):
            continue
        if not worker.online:
            state, error = OFFLINE, f"no heartbeat since {worker.heartbeat_at.isoformat()}"
        else:
            tried = [row for row in worker.loaded if row.model == model and row.version == version]
            state = tried[0].state.value if tried else "not loaded"
            error = tried[0].error if tried else ""
        behind.append(
            Laggard(
                worker_id=worker.worker_id,
                serving=serving[0].version if serving else None,
                state=state,
                error=error,
            )
        )
    return behind


def fleet_wait(*, model: str, alias: str, version: int, timeout: float) -> list[Laggard]:
    """Poll the fleet until every online worker serves the version; returns the laggards left.

    Offline workers cannot catch up while they are cut off, so they do not hold the wait up; they
    are named among the laggards all the same.
    """
    deadline = time.monotonic() + timeout
    while True:
        behind = fleet_laggards(model=model, alias=alias, version=version)
        if all(lag.state == OFFLINE for lag in behind) or time.monotonic() >= deadline:
            return behind
        time.sleep(0.1)


# --- The /v2 token check -----------------------------------------------------------------------------


def token_shaped(raw: str) -> bool:
    """Whether ``raw`` can be a Modelyard token at all; no database query."""
    return split_token(raw) is not None


class InferenceAccess(enum.Enum):
    """What a bearer token may do on ``/v2``: the one verdict both the 401 and the 403 come from."""

    ALLOWED = "allowed"  # a live token carrying the inference role (admins have every role)
    NO_ROLE = "no-role"  # a live token without the role (its own roles, within its user's): known, but refused (403)
    NO_MODEL = "no-model"  # a live token with the role, limited to other models (403)
    REFUSED = "refused"  # no such token, revoked, expired, or its user inactive (401)


@dataclass(frozen=True)
class TokenGrant:
    """What a bearer token may do on ``/v2``, decided once from the database and then per model, in memory.

    ``model_patterns`` are the token's fnmatch patterns on model names (none: every model); see
    ``registry.access.scopes``. ``priority`` is the token's class (``registry.models.PriorityClass``), which
    the data plane hands the batcher as its ``klass``. The ``/v2`` token cache (``inference.auth``) keeps these.
    """

    access: InferenceAccess
    model_patterns: tuple[str, ...] = ()
    priority: str = "normal"

    def on(self, model: str | None) -> InferenceAccess:
        """The verdict for a request about ``model``; None for one about no model (the server, the index)."""
        allowed = self.access is InferenceAccess.ALLOWED
        if allowed and model is not None and not model_in_scope(model, self.model_patterns):
            return InferenceAccess.NO_MODEL
        return self.access

    def covers(self, model: str) -> bool:
        """Whether a list shown to this token (the repository index, statistics) may include ``model``."""
        return model_in_scope(model, self.model_patterns)

    def refusal(self, model: str) -> str:
        """The message of a :attr:`InferenceAccess.NO_MODEL` refusal."""
        return out_of_scope_message(model, self.model_patterns)


REFUSED_GRANT = TokenGrant(InferenceAccess.REFUSED)


def token_grant(raw: str) -> TokenGrant:
    """What this bearer token may do on ``/v2``. Blocking: it queries the database."""
    token = authenticate_token(raw)
    if token is None:
        return REFUSED_GRANT
    roles = token_roles(token)
    allowed = Role.INFERENCE in roles or Role.ADMIN in roles
    return TokenGrant(
        InferenceAccess.ALLOWED if allowed else InferenceAccess.NO_ROLE,
        tuple(token.model_patterns or ()),
        priority=token.priority,
    )


def token_inference_access(raw: str, model: str | None = None) -> InferenceAccess:
    """What this bearer token may do on ``/v2`` (for ``model``, when named). Blocking: it queries the database."""
    return token_grant(raw).on(model)


def token_may_infer(raw: str) -> bool:
    """May this bearer token call ``/v2``? Blocking: it queries the database.

    Yes for a live token (not revoked, not expired, its user active) carrying the inference role;
    admins have every role. Its model patterns are checked per request (:class:`TokenGrant`).
    """
    return token_inference_access(raw) is InferenceAccess.ALLOWED


# --- Alias changes -----------------------------------------------------------------------------------


def alias_changes() -> AbstractContextManager[notify.Listener]:
    """Subscribe to alias-change notifications for the duration of a ``with`` block."""
    return notify.listen()
