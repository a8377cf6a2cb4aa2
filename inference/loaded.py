"""A loaded version: one ONNX Runtime session (or several lanes) with its batcher, metrics and traffic.

What the request path holds while it runs a request (``acquire``/``release``), and what the
reconcile loop (``inference/runtime.py``) routes to, reconfigures when the model's batching
settings change, and drains before it lets the session go. The loader (``inference/loader.py``)
makes one.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from inference import metrics
from inference.batcher import Batcher
from inference.protocol import BodyLimit, body_limit, can_batch
from inference.sessions import GPU_PROVIDERS, FixedAddressRunner, run_with_iobinding
from inference.statistics import VersionStats
from inference.text import TextEncoder
from inference.traffic import Traffic
from registry.serving import LoadState, VersionSpec

__all__ = ["LoadedVersion", "NotLoaded", "instances_for"]

logger = logging.getLogger(__name__)


class NotLoaded(Exception):
    """The version exists in the routing table no more (or not yet); the caller retries or answers 503."""


class LoadedVersion:
    """One loaded ONNX Runtime session with its batcher, and an in-flight counter so it can be drained before release.

    The batcher is made with the version and closed when the version is drained and released, so
    whatever serves the version (REST or gRPC) shares one queue, and nothing outlives the session.
    """

    def __init__(
        self,
        spec: VersionSpec,
        session: Any,
        provider: str,
        load_seconds: float,
        memory_bytes: int,
        note: str = "",
        labels: tuple[str, ...] = (),
        text: TextEncoder | None = None,
        runner: FixedAddressRunner | None = None,
        lanes: list[Any] | None = None,
        make_lanes: Callable[[int], list[Any]] | None = None,
    ) -> None:
        self.spec = spec
        self.session = session
        self.runner = runner  # CUDA graphs: runs at fixed addresses, one at a time
        # On the CPU, with instances > 1: one narrow session per instance (sessions.build_cpu_lanes), which
        # make_lanes builds again when the model's instances change.
        self.lane_sessions: list[Any] = list(lanes or [])
        self._make_lanes = make_lanes
        self.provider = provider
        self.load_seconds = load_seconds
        self.memory_bytes = memory_bytes
        self.note = note  # e.g. why the session fell back to the CPU
        self.labels = labels  # the classification extension's labels, by class index
        self.text = text  # the tokenizer, when the version takes text (inference/text.py)
        self.stats = VersionStats()
        self.state = LoadState.READY
        self.version_label = str(spec.version)  # the version as /v2 names it, made once
        self.metrics = metrics.VersionMetrics(spec.model, self.version_label)
        # Merging concurrent requests: what the registry decided (validation's check, the model's setting),
        # where the signature allows it. Also what /config says (max_batch_size 0 when not) and how
        # classification reads the first dimension.
        self.batching = spec.batching and can_batch(spec.signature)
        self.output_names = [output.name for output in session.get_outputs()]
        self.io_binding = provider in GPU_PROVIDERS  # outputs bound to CPU memory (sessions.run_with_iobinding)
        self.batcher = Batcher(
            self._run_all,
            batching=self.batching,
            max_batch_size=spec.max_batch_size,
            max_queue_delay_us=spec.max_queue_delay_us,
            max_queue_size=spec.max_queue_size,
            instances=self.instances_for(spec),
            lanes=self._lane_runs(),
            on_batch=self._observe_batch,
            on_close=self._forget_queue_depth,
            stats=self.stats,
        )
        self.traffic = Traffic()  # the last minutes of requests, for the fleet page
        self._body_limit: tuple[int, BodyLimit] | None = None
        self._inflight = 0
        self._closed = False
        self._cond = threading.Condition()

    def acquire(self) -> None:
        with self._cond:
            if self._closed:
                raise NotLoaded(f"{self.spec.model} v{self.spec.version} was unloaded")
            self._inflight += 1

    def release(self) -> None:
        with self._cond:
            self._inflight -= 1
            if self._inflight == 0:
                self._cond.notify_all()

    def run(self, feeds: dict[str, Any], output_names: list[str] | None = None) -> list[Any]:
        if self.runner is not None:
            return self.runner.run(output_names, feeds)
        if self.io_binding:
            return run_with_iobinding(self.session, feeds, output_names or self.output_names)
        return self.session.run(output_names, feeds)

    def _run_all(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """Every output by name; the batcher's run (``self.run`` is looked up each time, so tests can hold it)."""
        return dict(zip(self.output_names, self.run(feeds), strict=True))

    def _run_lane(self, index: int, feeds: dict[str, Any]) -> dict[str, Any]:
        """Every output by name, from lane ``index``'s session (looked up each time, like ``self.run``).

        While the lanes are being replaced, the batcher may still pick an index that the new list does
        not have; that batch runs on the version's session instead (the same outputs).
        """
        lanes = self.lane_sessions
        if index >= len(lanes):
            return self._run_all(feeds)
        return dict(zip(self.output_names, lanes[index].run(None, feeds), strict=True))

    def _lane_runs(self) -> list[Callable[[dict[str, Any]], dict[str, Any]]]:
        return [functools.partial(self._run_lane, index) for index in range(len(self.lane_sessions))]

    def instances_for(self, spec: VersionSpec) -> int:
        return instances_for(spec, self.provider, fixed_address=self.runner is not None)

    @property
    def instances(self) -> int:
        """Batches this version runs at once."""
        return self.batcher.instances

    def _observe_batch(self, requests: int, rows: int) -> None:
        self.metrics.batched(requests, self.batcher.queued)

    def _forget_queue_depth(self) -> None:
        self.metrics.retire()

    def reconfigure(self, spec: VersionSpec) -> None:
        """Take the model's new batching settings (``PATCH /api/v1/models/{m}``) without reloading the session.

        The batcher follows them from its next request and batch on; what is queued stays queued.
        """
        self.spec = dataclasses.replace(
            self.spec,
            max_batch_size=spec.max_batch_size,
            max_queue_delay_us=spec.max_queue_delay_us,
            max_queue_size=spec.max_queue_size,
            instances=spec.instances,
            batching=spec.batching,
            batching_reason=spec.batching_reason,
        )
        self.batching = spec.batching and can_batch(self.spec.signature)
        instances = self.instances_for(spec)
        lanes = None  # keep them
        if self._make_lanes is not None and instances != max(1, len(self.lane_sessions)):
            try:
                self.lane_sessions = self._make_lanes(instances) if instances > 1 else []
            except Exception:
                # e.g. out of memory: the instances share the one session instead, which works, only slower.
                logger.exception("%s v%s: could not build %d CPU lanes", spec.model, spec.version, instances)
                self.lane_sessions = []
            lanes = self._lane_runs()
        self.batcher.configure(
            max_batch_size=spec.max_batch_size,
            max_queue_delay_us=spec.max_queue_delay_us,
            max_queue_size=spec.max_queue_size,
            instances=instances,
            lanes=lanes,
            batching=self.batching,
        )

    def body_limit(self, default: int) -> BodyLimit:
        """The request body limit for this version under the global ``default``, worked out once per default."""
        cached = self._body_limit
        if cached is None or cached[0] != default:
            cached = self._body_limit = (default, body_limit(self.spec.model, self.spec.signature, default))
        return cached[1]

    def drain_and_close(self, timeout: float) -> bool:
        """Wait for requests in flight, then drop the session and close the batcher; False if the wait timed out."""
        with self._cond:
            self.state = LoadState.DRAINING
            drained = self._cond.wait_for(lambda: self._inflight == 0, timeout=timeout)
            self._closed = True
            self.session = None
            self.lane_sessions = []
            self.state = LoadState.CLOSED
        self.batcher.close()
        return drained

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def closed(self) -> bool:
        return self._closed


def instances_for(spec: VersionSpec, provider: str, *, fixed_address: bool = False) -> int:
    """The model's ``instances``, or by provider when unset: 2 on a GPU (one batch runs while the next is
    merged and the last split and encoded), 1 on the CPU (one ORT run already takes every core)."""
    if fixed_address:
        return 1  # one set of fixed buffers (and one captured graph): runs take turns whatever is asked
    if spec.instances:
        return spec.instances
    return 2 if provider in GPU_PROVIDERS else 1
