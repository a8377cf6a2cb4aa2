# Stand-ins for loaded versions and requests: only what the code under test reads of them.
# mypy: disable-error-code="arg-type"
"""The shadow runner's limits: it drops work, and counts why, rather than ever holding up the primary.

The runner is driven on a real event loop with stand-ins for the two loaded versions (a batcher's
queue length, the run-time counters, acquire and release are all it reads of them) and a run
function of the test's own, which moves those counters and the runner's clock: the cost budget is
exact. The end-to-end behaviour, with real inference processes and real ONNX Runtime sessions, is
in ``test_shadow_processes.py``.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from inference.loaded import NotLoaded
from inference.shadow import SHADOW_PRIORITY, ShadowRoute, ShadowRunner
from inference.statistics import VersionStats
from registry.serving import ShadowSpec

OUTPUTS = {"y": np.arange(8, dtype=np.float32).reshape(2, 4)}


class Version:
    """What the runner reads of a loaded version: its batcher's queue, its run time, and acquire/release."""

    def __init__(self, *, queued: int = 0, running: int = 0, unloaded: bool = False, version_id: int = 1) -> None:
        self.batcher = SimpleNamespace(queued=queued, running=running)
        self.spec = SimpleNamespace(version_id=version_id)
        self.stats = VersionStats()
        self.unloaded = unloaded
        self.held = 0

    def acquire(self) -> None:
        if self.unloaded:
            raise NotLoaded("gone")
        self.held += 1

    def release(self) -> None:
        self.held -= 1


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def route(candidate: Version, sample: float = 1.0) -> ShadowRoute:
    return ShadowRoute(ShadowSpec(5, 2, sample), "demo", "production", candidate)


async def drain() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


def counts(runner: ShadowRunner) -> dict[str, Any]:
    [row] = runner.report({5})
    return dict(row.tally)


@pytest.fixture
def cheap_budget(settings: Any) -> Any:
    settings.SHADOW_MAX_COST = 100.0
    settings.SHADOW_QUEUE_SIZE = 16
    return settings


def test_the_cost_budget_drops_what_would_take_more_than_its_share_of_the_primarys_run_time(settings):
    settings.SHADOW_MAX_COST = 0.5
    settings.SHADOW_QUEUE_SIZE = 16
    clock = Clock()
    runner = ShadowRunner(clock=clock)
    primary, candidate = Version(), Version(version_id=2)

    async def run(loaded: Any, request: Any, priority: int) -> dict[str, np.ndarray]:
        assert loaded is candidate and priority == SHADOW_PRIORITY
        candidate.stats.batch_done(1, 1, 0, 0, 10_000_000, 0)  # each mirrored run takes as long as a primary's
        clock.now += 0.030  # and three times that on the clock: waiting is not what the budget counts
        return OUTPUTS

    runner.attach(run)

    async def scenario() -> None:
        for _ in range(40):
            primary.stats.batch_done(1, 1, 5_000_000, 0, 10_000_000, 0)  # the primary's run for this request
            runner.offer(route(candidate), primary, SimpleNamespace(), OUTPUTS, 0.050)  # its latency: not counted
            await drain()

    asyncio.run(scenario())
    tally = counts(runner)
    # Counted from the first offer (the primary's runs after it): every other sampled request runs.
    assert tally["requests"] == 20 and tally["dropped"] == {"budget": 20}
    assert tally["compared"] == 20 and candidate.held == 0


def test_a_failing_candidate_run_is_charged_all_the_time_it_took(settings):
    settings.SHADOW_MAX_COST = 0.5
    settings.SHADOW_QUEUE_SIZE = 16
    clock = Clock()
    runner = ShadowRunner(clock=clock)
    primary, candidate = Version(), Version(version_id=2)

    async def run(loaded: Any, request: Any, priority: int) -> dict[str, np.ndarray]:
        clock.now += 0.040  # a failed run leaves the candidate's counters as they were
        raise RuntimeError("out of memory")

    runner.attach(run)

    async def scenario() -> None:
        for _ in range(8):
            primary.stats.batch_done(1, 1, 0, 0, 10_000_000, 0)
            runner.offer(route(candidate), primary, SimpleNamespace(), OUTPUTS, 0.010)
            await drain()

    asyncio.run(scenario())
    tally = counts(runner)
    # 40 ms charged per failure against 5 ms earned per primary run: the 1st and the 9th would run.
    assert tally["requests"] == 1 and tally["dropped"] == {"budget": 7}
    assert tally["candidate"]["errors"] == 1


def test_a_reloaded_primary_starts_a_new_budget(settings):
    settings.SHADOW_MAX_COST = 0.5
    settings.SHADOW_QUEUE_SIZE = 16
    runner = ShadowRunner()
    before, candidate = Version(), Version(version_id=2)

    async def run(loaded: Any, request: Any, priority: int) -> dict[str, np.ndarray]:
        candidate.stats.batch_done(1, 1, 0, 0, 10_000_000, 0)
        return OUTPUTS

    runner.attach(run)

    async def scenario() -> None:
        before.stats.batch_done(1, 1, 0, 0, 1_000_000_000, 0)  # a second of runs on the first load
        runner.offer(route(candidate), before, SimpleNamespace(), OUTPUTS, 0.010)
        await drain()
        after = Version()  # the same version loaded again: its counters start at zero
        for _ in range(3):
            runner.offer(route(candidate), after, SimpleNamespace(), OUTPUTS, 0.010)
            await drain()

    asyncio.run(scenario())
    tally = counts(runner)
    # The new load has run nothing yet: its first offer runs (nothing spent), the next two are over budget.
    assert tally["requests"] == 2 and tally["dropped"] == {"budget": 2}


def test_a_full_queue_a_busy_primary_and_an_unloaded_candidate_drop_and_count(cheap_budget, settings):
    settings.SHADOW_QUEUE_SIZE = 2
    runner = ShadowRunner()
    candidate = Version()
    ran = []

    async def run(loaded: Any, request: Any, priority: int) -> dict[str, np.ndarray]:
        ran.append(request)
        return OUTPUTS

    runner.attach(run)

    async def scenario() -> None:
        for index in range(5):  # offered back to back, before the runner's task gets a turn
            runner.offer(route(candidate), Version(), index, OUTPUTS, 0.01)
        await drain()
        runner.offer(route(candidate), Version(queued=3), "busy", OUTPUTS, 0.01)
        await drain()
        runner.offer(route(candidate), Version(running=1), "running", OUTPUTS, 0.01)
        await drain()
        runner.offer(route(Version(unloaded=True)), Version(), "gone", OUTPUTS, 0.01)
        await drain()
        runner.offer(route(candidate, sample=0.0), Version(), "never", OUTPUTS, 0.01)  # not sampled
        await drain()

    asyncio.run(scenario())
    assert ran == [0, 1]
    tally = counts(runner)
    assert tally["dropped"] == {"queue_full": 3, "busy": 2, "unloaded": 1}
    assert tally["requests"] == 2


def test_a_failing_candidate_is_counted_and_the_offer_never_raises(cheap_budget):
    runner = ShadowRunner()

    async def run(loaded: Any, request: Any, priority: int) -> dict[str, np.ndarray]:
        raise RuntimeError("the candidate fell over")

    runner.attach(run)

    async def scenario() -> None:
        for _ in range(3):
            runner.offer(route(Version()), Version(), SimpleNamespace(), OUTPUTS, 0.01)
        runner.offer(route(Version()), Version(), SimpleNamespace(), None, 0.01, "Overloaded: queue full")
        await drain()

    asyncio.run(scenario())
    tally = counts(runner)
    assert tally["requests"] == 4 and tally["compared"] == 0
    assert tally["candidate"]["errors"] == 4
    assert tally["candidate"]["last_error"] == "RuntimeError: the candidate fell over"
    assert tally["primary"]["errors"] == 1 and tally["primary"]["last_error"] == "Overloaded: queue full"


def test_the_heartbeat_reports_running_shadows_and_the_last_counts_of_ended_ones_once(cheap_budget):
    runner = ShadowRunner()

    async def run(loaded: Any, request: Any, priority: int) -> dict[str, np.ndarray]:
        return OUTPUTS

    runner.attach(run)

    async def offer() -> None:
        runner.offer(route(Version()), Version(), SimpleNamespace(), OUTPUTS, 0.01)
        await drain()

    asyncio.run(offer())
    assert [row.shadow_id for row in runner.report({5})] == [5]
    assert [row.shadow_id for row in runner.report({5})] == [5]  # running: every heartbeat
    asyncio.run(offer())
    assert [row.shadow_id for row in runner.report(set())] == [5]  # ended, but counted since: once more
    assert runner.report(set()) == ()  # then forgotten
