# Stand-ins for loaded versions and requests: only what the code under test reads of them.
# mypy: disable-error-code="arg-type"
"""A rollout's split of an alias in the routing snapshot: shares, routing keys, and what never splits.

The router is the in-memory snapshot the request path reads (``inference/runtime.py``); these tests
give it stand-ins for loaded versions (only their identity matters to routing) and count where
draws land. The cumulative figures the rollout check reads (``registry.serving.TrafficTotals``) are
tested here too: their differences are what a step is judged on.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

from inference.dataplane import routing_draw
from inference.runtime import Router, Split
from inference.traffic import Traffic
from registry.serving import TRAFFIC_LATENCY_BOUNDS, SplitSpec, TrafficTotals

CURRENT = SimpleNamespace(name="v1")
CANDIDATE = SimpleNamespace(name="v2")


def router(percent: int, alias: str = "production") -> Router:
    table = {"demo": {"production": CURRENT, alias: CURRENT, "1": CURRENT, "2": CANDIDATE}}
    return Router(table, splits={("demo", alias): Split(SplitSpec(7, 2, percent), CANDIDATE)})


def test_a_ten_percent_canary_takes_eight_to_twelve_percent_of_ten_thousand_random_requests():
    routes = router(10)
    landed = [routes.resolve("demo", None, routing_draw("")) for _ in range(10_000)]
    share = landed.count(CANDIDATE) / len(landed)
    assert 0.08 <= share <= 0.12, share
    assert set(map(id, landed)) == {id(CURRENT), id(CANDIDATE)}


def test_routing_keys_spread_like_random_draws_and_always_land_on_the_same_version():
    routes = router(25)
    keys = [f"user-{n}" for n in range(10_000)]
    first = [routes.resolve("demo", None, routing_draw(key)) for key in keys]
    assert 0.23 <= first.count(CANDIDATE) / len(first) <= 0.27
    shuffled = random.Random(3).sample(keys, len(keys))
    again = {key: routes.resolve("demo", None, routing_draw(key)) for key in shuffled}
    assert [again[key] for key in keys] == first
    assert routing_draw("user-1") == routing_draw("user-1") != routing_draw("user-2")


def test_a_key_on_the_candidate_stays_there_as_its_share_grows():
    keys = [f"k{n}" for n in range(2_000)]
    on_candidate = [
        {k for k in keys if router(p).resolve("demo", None, routing_draw(k)) is CANDIDATE} for p in (5, 25, 50)
    ]
    assert on_candidate[0] <= on_candidate[1] <= on_candidate[2]
    assert len(on_candidate[0]) < len(on_candidate[1]) < len(on_candidate[2])
    assert all(router(100).resolve("demo", None, routing_draw(k)) is CANDIDATE for k in keys)


def test_without_a_draw_other_aliases_or_a_version_number_nothing_splits():
    routes = router(100)
    assert routes.resolve("demo", None) is CURRENT  # metadata and readiness: the alias's own version
    assert routes.resolve("demo", "1", 0.0) is CURRENT  # a version number is never split
    assert routes.resolve("demo", "production", 0.0) is CANDIDATE
    assert router(100, alias="staging").resolve("demo", None, 0.0) is CURRENT
    assert routes.split("demo", "1") is None and routes.split("demo") is not None


def upper_edge_ms(seconds: float) -> float:
    """The upper edge of the latency bin ``seconds`` falls in, as the figures report it."""
    return float(f"{next(edge for edge in TRAFFIC_LATENCY_BOUNDS if edge >= seconds) * 1000:.3g}")


def test_totals_measure_an_interval_as_the_difference_of_two_reports():
    clock = [1000.0]
    traffic = Traffic(clock=lambda: clock[0])
    for seconds in [0.001] * 98 + [0.5, 0.5]:
        traffic.record(seconds)
    earlier = traffic.totals()
    for seconds in [0.002] * 50:
        traffic.record(seconds, error=True)
    clock[0] += 3600  # far past the five minutes the rolling figures keep: the totals keep everything
    now = traffic.totals()
    assert (earlier.requests, earlier.errors) == (100, 0)
    assert (now.requests, now.errors) == (150, 50)
    step = now.minus(earlier)
    assert (step.requests, step.errors) == (50, 50)
    assert step.quantile_ms(0.99) == upper_edge_ms(0.002) == 2.26  # bins 2**(1/4) apart from 0.1 ms
    assert earlier.quantile_ms(0.99) == upper_edge_ms(0.5) and earlier.quantile_ms(0.5) == upper_edge_ms(0.001)
    assert TrafficTotals.from_json(now.as_json()) == now
    # A version loaded again starts from zero: the difference is then everything since.
    assert TrafficTotals(3, 1, {"5": 3}).minus(now) == TrafficTotals(3, 1, {"5": 3})
    assert earlier.plus(step).requests == now.requests and TrafficTotals().quantile_ms(0.99) is None
