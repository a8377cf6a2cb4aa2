# Stand-ins for loaded versions and requests: only what the code under test reads of them.
# mypy: disable-error-code="arg-type"
"""The shadow runner's limits: it drops work, and counts why, rather than ever holding up the primary.

The runner is driven on a real event loop with stand-ins for the two loaded versions (a batcher's
queue length, acquire and release are all it reads of them) and a run function of the test's own;
its clock is the test's, so the cost budget is exact. The end-to-end behaviour, with real inference
processes and real ONNX Runtime sessions, is in ``test_shadow_processes.py``.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from inference.loaded import NotLoaded
from inference.shadow import SHADOW_PRIORITY, ShadowRoute, ShadowRunner
from registry.serving import ShadowSpec

OUTPUTS = {"y": np.arange(8, dtype=np.float32).reshape(2, 4)}


class Version:
    """What the runner reads of a loaded version: its batcher's queue, and acquire/release."""

    def __init__(self, *, queued: int = 0, unloaded: bool = False) -> None:
        self.batcher = SimpleNamespace(queued=queued)
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


def test_the_cost_budget_drops_what_would_take_more_than_its_share_of_the_primarys_time(settings):
    settings.SHADOW_MAX_COST = 0.5
    settings.SHADOW_QUEUE_SIZE = 16
    clock = Clock()
    runner = ShadowRunner(clock=clock)
    primary, candidate = Version(), Version()

    async def run(loaded: Any, request: Any, priority: int) -> dict[str, np.ndarray]:
        assert loaded is candidate and priority == SHADOW_PRIORITY
        clock.now += 0.010  # each mirrored run costs as much as a primary answer
        return OUTPUTS

    runner.attach(run)

    async def scenario() -> None:
        for _ in range(40):
            runner.offer(route(candidate), primary, SimpleNamespace(), OUTPUTS, 0.010)
            await drain()

    asyncio.run(scenario())
    tally = counts(runner)
    # Half the primary's time (0.2 s of 0.4 s) and the run that went past it: 21 of the 40 sampled requests.
    assert tally["requests"] == 21 and tally["dropped"] == {"budget": 19}
    assert tally["compared"] == 21 and candidate.held == 0


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
        runner.offer(route(Version(unloaded=True)), Version(), "gone", OUTPUTS, 0.01)
        await drain()
        runner.offer(route(candidate, sample=0.0), Version(), "never", OUTPUTS, 0.01)  # not sampled
        await drain()

    asyncio.run(scenario())
    assert ran == [0, 1]
    tally = counts(runner)
    assert tally["dropped"] == {"queue_full": 3, "busy": 1, "unloaded": 1}
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
