"""The reconcile loop of one inference process: desired state in, loaded versions and the routing table out.

The database holds the desired state (which versions the served aliases point to); this process
holds the actual state (its loaded versions, ``inference/loaded.py``). The loop closes the gap:
it loads in the background (``inference/loader.py``: bundle, session, lanes, warm-up), switches
the routing table atomically, drains the old version and releases it, and reports what it serves
to the fleet (the heartbeat). A failed load never touches what is serving. The request path reads
only the in-memory routing table (:class:`Router`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.utils import timezone

from inference import metrics, telemetry
from inference.batcher import CLASS_NAMES
from inference.benchmarks import BenchmarkRunner
from inference.cache import ArtifactCache
from inference.jobs import JobRunner
from inference.loaded import LoadedVersion
from inference.loader import load_version
from inference.response_cache import ResponseCaches
from inference.sessions import device_description, host_notice
from inference.shadow import ShadowRoute, ShadowRunner
from inference.verify import VerificationFailed
from modelyard.provenance import preload_verifier
from registry import serving
from registry.serving import PRODUCTION, DesiredState, LoadedRow, LoadState, SplitSpec, VersionSpec

__all__ = ["InferenceRuntime", "Router"]

logger = logging.getLogger(__name__)


class Router:
    """An immutable routing snapshot; the runtime replaces it whole, so readers never see a half-update.

    ``shadows`` names, per (model, alias), the loaded candidate that mirrors a sample of that alias's
    requests (``inference/shadow.py``); a shadow whose candidate is not loaded yet is not in it.
    """

    def __init__(
        self,
        table: dict[str, dict[str, LoadedVersion]] | None = None,
        shadows: dict[tuple[str, str], ShadowRoute] | None = None,
        splits: dict[tuple[str, str], Split] | None = None,
    ) -> None:
        self.table = table or {}
        self.shadows = shadows or {}
        self.splits = splits or {}

    def split(self, model: str, ref: str | None = None) -> Split | None:
        """The rollout splitting the alias ``ref`` names (production for None); none for a version number."""
        if not self.splits:
            return None
        return self.splits.get((model, ref or PRODUCTION))

    def shadow(self, model: str, ref: str | None = None) -> ShadowRoute | None:
        """The shadow of the alias ``ref`` names (the production alias for None); none for a version number."""
        if not self.shadows:
            return None
        return self.shadows.get((model, ref or PRODUCTION))

    def resolve(self, model: str, ref: str | None = None, draw: float | None = None) -> LoadedVersion | None:
        """``ref`` is None (the production alias), an alias name, or a version number.

        ``draw`` (in [0, 1)) places an inference request in a rollout's split of the alias: below the
        candidate's share it routes to the candidate. Without one (metadata, readiness) the alias's
        own version answers.
        """
        routes = self.table.get(model)
        if routes is None:
            return None
        if draw is not None and self.splits:
            split = self.splits.get((model, ref or PRODUCTION))
            if split is not None and draw * 100 < split.spec.percent:
                return split.candidate
        return routes.get(ref or PRODUCTION)


@dataclass(frozen=True)
class Split:
    """A rollout's split as the routing snapshot holds it: the spec and the loaded candidate."""

    spec: SplitSpec
    candidate: LoadedVersion


@dataclass
class LoadFailure:
    error: str
    attempts: int
    retry_at: float


@dataclass
class RuntimeStatus:
    loading: dict[int, VersionSpec] = field(default_factory=dict)
    failures: dict[int, LoadFailure] = field(default_factory=dict)
    db_error: str = ""


class InferenceRuntime:
    """Owns the loaded versions of this process and the thread that reconciles them with the registry."""

    def __init__(self, *, worker_id: str | None = None) -> None:
        self.worker_id = worker_id or settings.WORKER_ID or f"{socket.gethostname()}-{os.getpid()}"
        self.router = Router()
        self.shadows = ShadowRunner()
        self.responses = ResponseCaches()  # the aliases' response caches (``inference/response_cache.py``)
        self.loaded: dict[int, LoadedVersion] = {}
        self.status = RuntimeStatus()
        self.cache = ArtifactCache(Path(settings.CACHE_DIR), settings.CACHE_MAX_BYTES)
        self.started_at = timezone.now()
        self.device, self.provider = device_description()
        self.notice = host_notice()
        self._desired = DesiredState(versions={}, routes={})
        self._loads: dict[int, Future[LoadedVersion]] = {}
        # A shadow's candidate loaded with sleeping threads (VersionSpec.mirror_only) that now serves: loaded
        # again with the setting's threads while the first session serves; switched to when ready.
        self._reloads: dict[int, Future[LoadedVersion]] = {}
        self._reload_failed: set[int] = set()  # keeps its first session: a failed reload is not tried again
        self._replaced: list[LoadedVersion] = []  # released once the routes no longer name them
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-load")
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._threads: list[threading.Thread] = []
        self._last_heartbeat = 0.0
        self._passes = 0
        self._synced = False
        self._last_snapshot: tuple[LoadedRow, ...] = ()
        self.benchmarks = BenchmarkRunner(
            cache=self.cache,
            provider=self.provider,
            host_kind=self.device,
            worker_id=self.worker_id,
            served=self._requests_served,
        )
        # The server's event loop, where every batcher lives: the job runner submits its slices there.
        self.loop: asyncio.AbstractEventLoop | None = None
        self.jobs = JobRunner(worker_id=self.worker_id, versions=lambda: self.loaded, loop=lambda: self.loop)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the reconcile and listener threads.

        Called on the server's event loop (the ASGI lifespan), it keeps that loop for the job runner.
        """
        try:
            self.loop = asyncio.get_running_loop()
        except RuntimeError:  # started outside a server (tests): set ``loop`` to run jobs
            pass
        for target, name in ((self._reconcile_loop, "reconcile"), (self._listen_loop, "alias-listener")):
            thread = threading.Thread(target=target, name=f"modelyard-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        # Every load verifies signatures: their library is imported beside the first query and download.
        threading.Thread(target=preload_verifier, name="modelyard-verifier-import", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.jobs.stop()  # first, so it takes no other chunk; the one it runs is handed back before the versions close
        for thread in self._threads:
            thread.join(timeout=10)
        self._executor.shutdown(wait=False, cancel_futures=True)
        for loaded in list(self.loaded.values()):
            loaded.drain_and_close(timeout=1)
        self.loaded.clear()
        self.router = Router()
        self.shadows.close()

    @property
    def ready(self) -> bool:
        """True once the desired state has been read and each of its versions loaded or tried once.

        A process that has just started therefore takes no traffic before its models are in
        memory; later swaps never make it unready again.
        """
        return self._synced

    def known_models(self) -> set[str]:
        return set(self._desired.routes)

    def known_refs(self, model: str) -> set[str]:
        """Alias names and version numbers this process is meant to serve for ``model``."""
        aliases = self._desired.routes.get(model, {})
        numbers = {
            str(self._desired.versions[vid].version) for vid in aliases.values() if vid in self._desired.versions
        }
        return set(aliases) | numbers

    # --- the loop ----------------------------------------------------------------------------

    def _reconcile_loop(self) -> None:
        try:
            while not self._stop.is_set():
                # Cleared before the pass, so a wake-up that arrives during it is not lost.
                self._wake.clear()
                try:
                    self.reconcile_once()
                except Exception:  # the loop must outlive any one bad pass
                    logger.exception("reconcile pass failed; retrying")
                    self._close_connection()
                self._wake.wait(settings.RECONCILE_POLL_SECONDS)
        finally:
            if self._stop.is_set():
                self._leave_fleet()
            self._close_connection()

    def _leave_fleet(self) -> None:
        """On a clean stop, leave the fleet (``registry.serving.worker_leave``)."""
        try:
            serving.worker_leave(self.worker_id)
        except DatabaseError as exc:
            logger.warning("could not leave the fleet: %s", exc)

    @staticmethod
    def _close_connection() -> None:
        try:
            connection.close()
        except DatabaseError as exc:  # a connection broken by an outage may fail to close
            logger.debug("closing the database connection failed: %s", exc)

    def _listen_loop(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                with serving.alias_changes() as listener:
                    backoff = 0.5
                    while not self._stop.is_set():
                        if listener.wait(1.0):
                            self._wake.set()
            except Exception as exc:  # noqa: BLE001 - database or Redis away: polling still covers us
                logger.debug("alias listener lost its connection: %s", exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30)
            finally:
                self._close_connection()

    def reconcile_once(self) -> None:
        """One pass: read the desired state, start or finish loads, switch routes, release leftovers."""
        fresh = True
        try:
            close_old_connections()
            desired = serving.desired_state()
            self.status.db_error = ""
        except DatabaseError as exc:
            # Keep serving what we have; try again on the next pass.
            self.status.db_error = f"database unreachable: {exc}".strip()
            logger.warning("%s", self.status.db_error)
            self._close_connection()
            desired, fresh = self._desired, False
        with self._lock:
            self._desired = desired
            self._passes += 1
            self._collect_finished_loads()
            # A version no longer wanted forgets its failures: if it is promoted again, it loads at once.
            for version_id in [vid for vid in self.status.failures if vid not in desired.versions]:
                del self.status.failures[version_id]
            self._start_loads(desired)
            self._switch_routes(desired)
            metrics.load_failures(self._failing_versions(desired))
            self._apply_settings(desired)
            if fresh and not self._synced:
                self._synced = all(vid in self.loaded or vid in self.status.failures for vid in desired.versions)
        self._heartbeat_if_due()
        if fresh and settings.BENCHMARKS_ENABLED:
            self.benchmarks.poll()  # on its own thread, one job at a time, in a child at low priority
        metrics.class_queue_depths(self.queued_by_class())
        if fresh:
            self.jobs.poll()  # on its own thread, one chunk at a time, through the batchers in the job class

    def queued_by_class(self) -> dict[str, int]:
        """Requests waiting in this process's batchers, by priority class (``inference.batcher.CLASS_NAMES``)."""
        totals = dict.fromkeys(CLASS_NAMES, 0)
        for loaded in list(self.loaded.values()):
            batcher = loaded.batcher
            if batcher.started and not batcher.closed:
                for name, queued in batcher.queued_by_class().items():
                    totals[name] += queued
        return totals

    def _requests_served(self) -> int:
        """Requests answered so far by the versions loaded now (a benchmark notes when this moved during its run)."""
        return sum(v.stats.success_count + v.stats.fail_count for v in list(self.loaded.values()))

    def _failing_versions(self, desired: DesiredState) -> dict[tuple[str, int], int]:
        """(model, version) -> failed attempts so far, for each wanted version that failed to load."""
        specs = desired.versions
        return {(specs[v].model, specs[v].version): f.attempts for v, f in self.status.failures.items() if v in specs}

    def _start_loads(self, desired: DesiredState) -> None:
        now = time.monotonic()
        for version_id, spec in desired.versions.items():
            loaded = self.loaded.get(version_id)
            if loaded is not None and loaded.spec.mirror_only and not spec.mirror_only:
                self._start_reload(version_id, spec)
            if version_id in self.loaded or version_id in self._loads:
                continue
            failure = self.status.failures.get(version_id)
            if failure is not None and failure.retry_at > now:
                continue
            if spec.strategy == serving.ServingStrategy.REPLACE:
                self._unload_other_versions(spec.model, keep=set(desired.versions))
            self.status.loading[version_id] = spec
            future = self._executor.submit(load_version, spec, self.cache)
            future.add_done_callback(lambda _f: self._wake.set())
            self._loads[version_id] = future

    def _start_reload(self, version_id: int, spec: VersionSpec) -> None:
        if version_id in self._reloads or version_id in self._reload_failed:
            return
        logger.info("%s v%s serves now: loading it again with serving threads", spec.model, spec.version)
        future = self._executor.submit(load_version, spec, self.cache)
        future.add_done_callback(lambda _f: self._wake.set())
        self._reloads[version_id] = future

    def _collect_finished_reloads(self) -> None:
        for version_id, future in list(self._reloads.items()):
            if not future.done():
                continue
            del self._reloads[version_id]
            try:
                fresh = future.result()
            except Exception as exc:  # noqa: BLE001 - the first session keeps serving
                self._reload_failed.add(version_id)
                logger.warning("loading version id %s again failed; its first session serves on: %s", version_id, exc)
                continue
            current = self.loaded.get(version_id)
            if current is None:  # released meanwhile
                self._replaced.append(fresh)
                continue
            self.loaded[version_id] = fresh
            self._replaced.append(current)

    def _collect_finished_loads(self) -> None:
        self._collect_finished_reloads()
        for version_id, future in list(self._loads.items()):
            if not future.done():
                continue
            del self._loads[version_id]
            spec = self.status.loading.pop(version_id)
            try:
                self.loaded[version_id] = future.result()
                self.status.failures.pop(version_id, None)
            except Exception as exc:  # noqa: BLE001 - any load error is recorded and retried
                previous = self.status.failures.get(version_id)
                attempts = (previous.attempts if previous else 0) + 1
                delay = min(300.0, 2.0**attempts)
                self.status.failures[version_id] = LoadFailure(
                    error=f"{type(exc).__name__}: {exc}", attempts=attempts, retry_at=time.monotonic() + delay
                )
                logger.warning("loading %s v%s failed (attempt %d): %s", spec.model, spec.version, attempts, exc)
                if isinstance(exc, VerificationFailed):
                    self._verify_failed(spec, str(exc))

    def _verify_failed(self, spec: VersionSpec, reason: str) -> None:
        """A version's bytes refused: counted on every attempt, audited once per host (the registry dedups)."""
        metrics.VERIFY_FAILURES.labels(spec.model, str(spec.version)).inc()
        try:
            serving.verify_failed_record(
                worker_id=self.worker_id,
                host=socket.gethostname(),
                model=spec.model,
                version=spec.version,
                reason=reason,
            )
        except DatabaseError as exc:  # the next attempt's failure records it
            logger.warning("could not audit the refused load of %s v%s: %s", spec.model, spec.version, exc)

    def _switch_routes(self, desired: DesiredState) -> None:
        old = self.router.table
        table: dict[str, dict[str, LoadedVersion]] = {}
        for model, aliases in desired.routes.items():
            for alias, version_id in aliases.items():
                target = self.loaded.get(version_id)
                if target is None:
                    # Blue-green: until the new version is ready, the alias keeps its current session.
                    target = old.get(model, {}).get(alias)
                    if target is not None and target.spec.version_id not in self.loaded:
                        target = None
                if target is not None:
                    table.setdefault(model, {})[alias] = target
        for loaded in self.loaded.values():
            table.setdefault(loaded.spec.model, {})[str(loaded.spec.version)] = loaded
        # Versions neither desired nor still routed by an alias are drained and released.
        in_use = {v.spec.version_id for routes in table.values() for k, v in routes.items() if not k.isdigit()}
        leftovers = [vid for vid in self.loaded if vid not in desired.versions and vid not in in_use]
        for version_id in leftovers:
            stale = self.loaded[version_id]
            table.get(stale.spec.model, {}).pop(str(stale.spec.version), None)
        shadows = {
            (model, alias): ShadowRoute(spec, model, alias, self.loaded[spec.version_id])
            for model, by_alias in desired.shadows.items()
            for alias, spec in by_alias.items()
            if spec.version_id in self.loaded and alias in table.get(model, {})
        }
        splits = {
            (model, alias): Split(spec, self.loaded[spec.version_id])
            for model, by_alias in desired.splits.items()
            for alias, spec in by_alias.items()
            if spec.version_id in self.loaded and alias in table.get(model, {})
        }
        metrics.count_swaps(old, table)
        self.responses.configure(desired.caches)
        self.router = Router(table, shadows, splits)  # the atomic switch
        for version_id in leftovers:
            self._release(self.loaded.pop(version_id))
            self._reload_failed.discard(version_id)
        while self._replaced:  # sessions loaded again: the router names the new ones now
            self._release(self._replaced.pop())
        # Never evict what serves, nor a bundle that a load in the background is still reading.
        keep = {v.spec.sha256 for v in self.loaded.values()} | {s.sha256 for s in self.status.loading.values()}
        self.cache.evict(keep=keep)

    def _apply_settings(self, desired: DesiredState) -> None:
        """A model's batching settings changed in the registry: its loaded versions take them, without a reload."""
        for version_id, loaded in self.loaded.items():
            spec = desired.versions.get(version_id)
            if spec is not None and spec.batching_settings != loaded.spec.batching_settings:
                logger.info(
                    "%s v%s: batching settings %s -> %s",
                    spec.model,
                    spec.version,
                    loaded.spec.batching_settings,
                    spec.batching_settings,
                )
                loaded.reconfigure(spec)

    def _unload_other_versions(self, model: str, keep: set[int]) -> None:
        """The replace strategy: free the model's old sessions before loading the new one (brief 503s)."""
        doomed = {vid for vid, v in self.loaded.items() if v.spec.model == model and vid not in keep}
        if not doomed:
            return
        table = {
            m: {name: v for name, v in routes.items() if v.spec.version_id not in doomed}
            for m, routes in self.router.table.items()
        }
        shadows = {
            key: route for key, route in self.router.shadows.items() if route.candidate.spec.version_id not in doomed
        }
        splits = {
            key: split for key, split in self.router.splits.items() if split.candidate.spec.version_id not in doomed
        }
        self.router = Router(table, shadows, splits)
        for version_id in doomed:
            self._release(self.loaded.pop(version_id))

    def _release(self, loaded: LoadedVersion) -> None:
        def drain() -> None:
            if not loaded.drain_and_close(settings.DRAIN_TIMEOUT_SECONDS):
                logger.warning("%s v%s released with requests still in flight", loaded.spec.model, loaded.spec.version)
            # After the drain: no request that holds it can write an answer of the old version any more. A
            # version loaded again (new settings, a new session) keeps its entries: its bytes are the same.
            if self.loaded.get(loaded.spec.version_id) in (None, loaded):
                self.responses.release(loaded.spec)

        threading.Thread(target=drain, name="drain", daemon=True).start()

    # --- fleet status --------------------------------------------------------------------------

    def snapshot(self) -> tuple[LoadedRow, ...]:
        """What this process serves, loads and failed to load, by model and version: its fleet report."""
        with self._lock:
            aliases_of: dict[int, list[str]] = {}
            router = self.router
            for routes in router.table.values():
                for name, loaded in routes.items():
                    if not name.isdigit():
                        aliases_of.setdefault(loaded.spec.version_id, []).append(name)
            splits_of: dict[int, dict[str, int]] = {}
            for (_, alias), split in router.splits.items():
                splits_of.setdefault(split.candidate.spec.version_id, {})[alias] = split.spec.percent
            shadows_of: dict[int, list[str]] = {}
            for (_, alias), shadow in router.shadows.items():
                shadows_of.setdefault(shadow.candidate.spec.version_id, []).append(alias)
            failures = self.status.failures
            rows = [
                LoadedRow(
                    model=v.spec.model,
                    version=v.spec.version,
                    state=v.state,
                    aliases=tuple(sorted(aliases_of.get(vid, []))),
                    load_seconds=round(v.load_seconds, 3),
                    memory_bytes=v.memory_bytes,
                    provider=v.provider,
                    note=v.note,
                    instances=v.instances,
                    batching=v.batching,
                    batching_reason=v.spec.batching_reason,
                    traffic=v.traffic.summary(),
                    totals=v.traffic.totals(),
                    splits=splits_of.get(vid, {}),
                    shadows=tuple(sorted(shadows_of.get(vid, []))),
                    cache=self.responses.totals(vid),
                )
                for vid, v in self.loaded.items()
            ]
            rows += [
                LoadedRow(
                    model=s.model,
                    version=s.version,
                    state=LoadState.LOADING,
                    error=failures[vid].error if vid in failures else "",
                    attempts=failures[vid].attempts if vid in failures else 0,
                )
                for vid, s in self.status.loading.items()
            ]
            for version_id, failure in failures.items():
                spec = self._desired.versions.get(version_id)
                if spec is not None and version_id not in self.status.loading:
                    rows.append(
                        LoadedRow(
                            model=spec.model,
                            version=spec.version,
                            state=LoadState.FAILED,
                            error=failure.error,
                            attempts=failure.attempts,
                        )
                    )
        return tuple(sorted(rows, key=lambda r: (r.model, r.version)))

    def _heartbeat_if_due(self) -> None:
        """Report at the heartbeat interval, and at once whenever what this process serves changed."""
        snapshot = self.snapshot()
        due = time.monotonic() - self._last_heartbeat >= settings.FLEET_HEARTBEAT_SECONDS
        if due or snapshot != self._last_snapshot:
            self.heartbeat(snapshot)

    def _running_shadows(self) -> set[int]:
        return {spec.shadow_id for by_alias in self._desired.shadows.values() for spec in by_alias.values()}

    def heartbeat(self, snapshot: tuple[LoadedRow, ...] | None = None) -> None:
        snapshot = self.snapshot() if snapshot is None else snapshot
        report = serving.WorkerReport(
            worker_id=self.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            device=self.device,
            provider=self.provider,
            started_at=self.started_at,
            loaded=snapshot,
            errors=(self.status.db_error,) if self.status.db_error else (),
            notice=self.notice,
            shadows=self.shadows.report(self._running_shadows()),
            devices=tuple(
                serving.DeviceRow(d.index, d.name, d.memory_used_bytes, d.memory_total_bytes)
                for d in telemetry.read_devices()
            ),
        )
        try:
            serving.worker_heartbeat(report)
            self._last_heartbeat = time.monotonic()
            self._last_snapshot = snapshot
        except DatabaseError as exc:
            logger.warning("fleet heartbeat failed: %s", exc)
            self._close_connection()
