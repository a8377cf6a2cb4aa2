"""Mirroring a sample of an alias's requests to a candidate version, after the primary has answered.

The registry says which alias a candidate shadows and what share of its requests to mirror
(``registry.serving.ShadowSpec``); the runtime puts the loaded candidate into the routing snapshot
(:class:`ShadowRoute`). When the data plane has the primary's outputs for a request to that alias,
it offers the request here (:meth:`ShadowRunner.offer`) and returns the primary's answer: nothing
here can delay or fail it.

What an offer costs the request path: a random draw, and for a sampled request a ``put_nowait`` on
a bounded queue. One task per process takes the queue in order and runs each request on the
candidate's own batcher, behind any request of its own (lowest priority). Shadow work is dropped,
and counted by reason, rather than allowed to compete with the primary:

- ``queue_full``: ``MODELYARD_SHADOW_QUEUE_SIZE`` requests are already waiting to be mirrored;
- ``busy``: the primary's batcher has requests waiting or a batch on its way (checked when offered
  and again before the mirror runs), or the candidate's has requests waiting: a mirrored run starts
  only on an idle primary, since on a small CPU two versions' runs side by side wait on each other's
  threads (and spinning threads make that cost the primary more than the mirror's own run time);
- ``budget``: the candidate's runs for this shadow have taken ``MODELYARD_SHADOW_MAX_COST`` (0.03)
  of the time the primary's ONNX Runtime runs took in this process since the shadow started here
  (``VersionStats.busy_ns``: each run once, however many requests it merged, and no time spent
  waiting); so a candidate as costly as the primary, mirrored at a sample of 0.1, runs about a third
  of the sampled requests, and the shadow costs the primary about that share of its throughput when
  the CPU is the limit (its runs' threads sleep when idle: ``inference/loader.py`` ``spinning``);
- ``unloaded``: the candidate was released meanwhile (the shadow ended or changed).

Each mirrored request is compared (``onnxkit.agreement.Tally``); the runtime reports the tallies with
its heartbeat, and the registry merges them into the shadow's report.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.conf import settings

from inference import metrics
from inference.loaded import LoadedVersion, NotLoaded
from inference.protocol import InferRequest
from inference.statistics import VersionStats
from onnxkit.agreement import Tally
from registry.serving import ShadowSpec, ShadowTallyRow

__all__ = ["ShadowRoute", "ShadowRunner"]

logger = logging.getLogger(__name__)

SHADOW_PRIORITY = 2**31 - 1  # behind every request the candidate serves in its own right


@dataclass(frozen=True)
class ShadowRoute:
    """A running shadow as the routing snapshot holds it: the spec and the loaded candidate."""

    spec: ShadowSpec
    model: str
    alias: str
    candidate: LoadedVersion


@dataclass
class _Budget:
    """One shadow's spending against one primary version in this process (event loop only)."""

    primary: VersionStats  # the primary's counters (a reload starts new ones, and a new budget)
    primary_from_ns: int  # its busy time when the shadow first saw it
    spent_ns: int = 0  # the candidate's run time for this shadow since

    def exhausted(self, share: float) -> bool:
        return self.spent_ns > share * (self.primary.busy_ns - self.primary_from_ns)


@dataclass
class _Mirror:
    route: ShadowRoute
    primary: LoadedVersion
    budget: _Budget
    request: InferRequest
    outputs: dict[str, np.ndarray] | None
    seconds: float
    error: str


class ShadowRunner:
    """The bounded queue of requests to mirror, the task that runs them, and a tally per shadow.

    The data plane attaches how a request runs (:meth:`attach`: ``run(loaded, request, priority)``
    returns the outputs, through its own path, tokenizer included). Offers come from the event loop;
    the tallies are read from the reconcile thread (:meth:`report`), under a lock.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._run: Any = None
        self._queue: asyncio.Queue[_Mirror] | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = threading.Lock()
        self._tallies: dict[int, Tally] = {}
        self._dirty: set[int] = set()
        self._random = random.Random()
        self._budgets: dict[tuple[int, int], _Budget] = {}  # (shadow, primary version id) -> spending

    def attach(self, run: Any) -> None:
        self._run = run

    # --- the request path ---------------------------------------------------------------------

    def offer(
        self,
        route: ShadowRoute,
        primary: LoadedVersion,
        request: InferRequest,
        outputs: dict[str, np.ndarray] | None,
        seconds: float,
        error: str = "",
    ) -> None:
        """Mirror this request with probability ``route.spec.sample``, unless the process is busy; never raises."""
        try:
            budget = self._budget(route.spec.shadow_id, primary)
            if self._run is None or self._random.random() >= route.spec.sample:
                return
            if primary.batcher.queued or primary.batcher.running:
                self._drop(route, "busy")
                return
            if budget.exhausted(settings.SHADOW_MAX_COST):
                self._drop(route, "budget")
                return
            queue = self._ensure_started()
            queue.put_nowait(_Mirror(route, primary, budget, request, outputs, seconds, error))
        except asyncio.QueueFull:
            self._drop(route, "queue_full")
        except Exception:
            logger.exception("offering a request to the shadow of %s@%s failed", route.model, route.alias)

    def _budget(self, shadow_id: int, primary: LoadedVersion) -> _Budget:
        """The shadow's spending against this primary, counted from the first request it offers here."""
        key = (shadow_id, primary.spec.version_id)
        budget = self._budgets.get(key)
        if budget is None or budget.primary is not primary.stats:
            budget = self._budgets[key] = _Budget(primary.stats, primary.stats.busy_ns)
        return budget

    def _ensure_started(self) -> asyncio.Queue[_Mirror]:
        if self._queue is None or self._task is None or self._task.done():
            self._queue = asyncio.Queue(maxsize=settings.SHADOW_QUEUE_SIZE)
            self._task = asyncio.get_running_loop().create_task(self._work(self._queue), name="modelyard-shadow")
        return self._queue

    async def _work(self, queue: asyncio.Queue[_Mirror]) -> None:
        while True:
            job = await queue.get()
            try:
                await self._mirror(job)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("mirroring a request to %s@%s failed", job.route.model, job.route.alias)

    async def _mirror(self, job: _Mirror) -> None:
        route = job.route
        candidate = route.candidate
        if job.primary.batcher.queued or job.primary.batcher.running or candidate.batcher.queued:
            self._drop(route, "busy")
            return
        try:
            candidate.acquire()
        except NotLoaded:
            self._drop(route, "unloaded")
            return
        busy_from = candidate.stats.busy_ns
        started = self._clock()
        outputs: dict[str, np.ndarray] | None = None
        error = ""
        try:
            outputs = await self._run(candidate, job.request, SHADOW_PRIORITY)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failing candidate is what a shadow is there to find
            error = f"{type(exc).__name__}: {exc}"
        finally:
            candidate.release()
        seconds = self._clock() - started
        ran_ns = candidate.stats.busy_ns - busy_from
        # A failed run is not in the candidate's counters: it is charged all the time it took.
        job.budget.spent_ns += ran_ns if ran_ns > 0 else round(seconds * 1e9)
        tally = self._tally(route.spec.shadow_id)
        with self._lock:
            tally.record(
                primary=job.outputs,
                primary_seconds=job.seconds,
                candidate=outputs,
                candidate_seconds=seconds,
                primary_error=job.error,
                candidate_error=error,
            )
            self._dirty.add(route.spec.shadow_id)
        outcome = "candidate_error" if outputs is None else ("primary_error" if job.outputs is None else "compared")
        metrics.shadow_mirrored(route.model, route.alias, outcome)

    def _drop(self, route: ShadowRoute, reason: str) -> None:
        tally = self._tally(route.spec.shadow_id)
        with self._lock:
            tally.dropped(reason)
            self._dirty.add(route.spec.shadow_id)
        metrics.shadow_dropped(route.model, route.alias, reason)

    def _tally(self, shadow_id: int) -> Tally:
        with self._lock:
            tally = self._tallies.get(shadow_id)
            if tally is None:
                tally = self._tallies[shadow_id] = Tally()
            return tally

    # --- the heartbeat --------------------------------------------------------------------------

    def report(self, running: set[int]) -> tuple[ShadowTallyRow, ...]:
        """Each running shadow's tally, and the last counts of ended ones not yet reported; forgets the rest.

        The rows are copies: the request path goes on counting while the heartbeat writes them.
        """
        with self._lock:
            ids = sorted(i for i in self._tallies if i in running or i in self._dirty)
            rows = tuple(ShadowTallyRow(i, copy.deepcopy(self._tallies[i].as_json())) for i in ids)
            for shadow_id in [i for i in self._tallies if i not in running and i not in self._dirty]:
                del self._tallies[shadow_id]
            # The budgets are the event loop's; a key read here at worst outlives its shadow by a beat.
            for key in [k for k in list(self._budgets) if k[0] not in running]:
                self._budgets.pop(key, None)
            self._dirty.clear()
        return rows

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
