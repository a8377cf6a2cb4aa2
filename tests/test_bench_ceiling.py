"""``bench/serve.py``'s no-server ceiling: what it runs, and how the goals are set against it.

The ceiling is ONNX Runtime in the benchmark's own process, in the shape Modelyard serves the model
(its instances side by side, each with a share of the cores), with nothing parsed or answered. A
goal above it cannot be met by any server on the machine; the report says so, and still judges the
goal as it is.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.onnx_models import token_sum_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
serve = importlib.import_module("serve")


@pytest.fixture
def token_model(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.onnx"
    path.write_bytes(token_sum_model().SerializeToString())
    return path


def test_the_ceiling_runs_every_instance_side_by_side_on_its_share_of_the_cores(token_model):
    duration = 0.3
    ceiling = serve.raw_ceiling(token_model, instances=2, batch=4, duration=duration)

    assert ceiling["instances"] == 2
    assert ceiling["batch"] == 4
    assert ceiling["threads_per_session"] == max(1, len(os.sched_getaffinity(0)) // 2)
    assert len(ceiling["runs_per_session"]) == 2
    assert all(runs > 0 for runs in ceiling["runs_per_session"])
    # Every lane runs until the same end, so the time divided by is at least the duration asked for.
    assert 0 < ceiling["seq_per_s"] <= sum(ceiling["runs_per_session"]) * 4 / duration


def test_one_instance_takes_every_core(token_model):
    ceiling = serve.raw_ceiling(token_model, instances=1, batch=2, duration=0.1)

    assert ceiling["threads_per_session"] == len(os.sched_getaffinity(0))
    assert len(ceiling["runs_per_session"]) == 1


def _raw(ceiling: float | None) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "batch1": {"seq_per_s": 73.5, "p50_ms": 13.4, "p99_ms": 18.7},
        "batch32": {"seq_per_s": 85.9, "ms_per_batch": 372.5},
    }
    if ceiling is not None:
        raw["ceiling"] = {"seq_per_s": ceiling, "instances": 2, "threads_per_session": 1, "batch": 16}
    return raw


def _servers(json_rps: float, naive_rps: float) -> dict[str, dict[int, dict[str, Any]]]:
    def row(rps: float) -> dict[str, Any]:
        return {"req_per_s": rps, "p50_ms": 600.0, "p99_ms": 800.0, "errors": 0}

    return {
        "modelyard": {64: row(json_rps + 1)},
        "modelyard-json": {64: row(json_rps)},
        "naive": {64: row(naive_rps)},
    }


def test_a_naive_goal_above_the_ceiling_is_reported_out_of_reach_and_still_missed():
    report = serve.summarise(_raw(96.0), _servers(89.4, 75.4), [64])
    t = report["targets"]

    assert t["vs_ceiling"] == pytest.approx(89.4 / 96.0)
    assert t["naive_goal_vs_ceiling"] == pytest.approx(1.5 * 75.4 / 96.0)
    assert report["servers"]["naive"][64]["vs_ceiling"] == pytest.approx(75.4 / 96.0)
    assert report["raw_ort"]["ceiling"]["seq_per_s"] == 96.0
    assert t["met"] is False  # 1.19x the naive server: the goal is judged as it stands
    assert serve.ceiling_line(t) == (
        "modelyard-json served 93% of the no-server ceiling (>= 90%); "
        "1.5x the naive server would be 118% of it, out of reach on this machine"
    )


def test_a_naive_goal_under_the_ceiling_is_not_called_out_of_reach():
    report = serve.summarise(_raw(285.0), _servers(265.0, 182.0), [64])
    t = report["targets"]

    assert t["naive_goal_vs_ceiling"] == pytest.approx(1.5 * 182.0 / 285.0)
    assert serve.ceiling_line(t) == (
        "modelyard-json served 93% of the no-server ceiling (>= 90%); 1.5x the naive server would be 96% of it"
    )


def test_without_a_ceiling_or_a_naive_server_the_line_says_only_what_was_measured():
    no_ceiling = serve.summarise(_raw(None), _servers(89.4, 75.4), [64])["targets"]
    assert "vs_ceiling" not in no_ceiling
    assert serve.ceiling_line(no_ceiling) is None

    servers = _servers(89.4, 75.4)
    del servers["naive"]
    no_naive = serve.summarise(_raw(96.0), servers, [64])["targets"]
    assert "naive_goal_vs_ceiling" not in no_naive
    assert serve.ceiling_line(no_naive) == "modelyard-json served 93% of the no-server ceiling (>= 90%)"


def test_a_share_of_the_ceiling_under_0_90_misses_the_goals():
    servers = _servers(89.4, 50.0)  # 1.79x the naive server: only the ceiling's share decides
    assert serve.summarise(_raw(96.0), servers, [64])["targets"]["met"] is True  # 93%
    missed = serve.summarise(_raw(100.0), servers, [64])["targets"]
    assert missed["vs_ceiling"] == pytest.approx(0.894)
    assert missed["met"] is False


def test_the_median_over_rounds_takes_the_ceiling_ratios_too():
    rounds = [
        serve.summarise(_raw(ceiling), _servers(89.0, naive), [64])
        for ceiling, naive in ((96.0, 75.0), (90.0, 70.0), (100.0, 80.0))
    ]
    median = serve.median_targets(rounds)

    assert median["vs_ceiling"] == pytest.approx(89.0 / 96.0)
    assert median["naive_goal_vs_ceiling"] == pytest.approx(1.5 * 75.0 / 96.0)
    assert median["met"] is False
