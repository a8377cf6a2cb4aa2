"""The shadow's tally (``onnxkit.agreement``): what it counts per request, how tallies merge, what the report says.

Every expected number is computed here with NumPy from the arrays recorded, never read back from the tally.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from onnxkit.agreement import LAST_ERROR_CHARS, VALUES_PER_OUTPUT, Tally, psi

RATIO = 2 ** (1 / 8)  # the distance histogram's bins: 1 - cosine, this factor apart
ROUNDING = 1e-9  # the report rounds cosines to nine digits


def record(tally: Tally, primary: dict[str, Any] | None, candidate: dict[str, Any] | None, **kwargs: Any) -> Tally:
    tally.record(
        primary=primary,
        primary_seconds=kwargs.pop("primary_seconds", 0.002),
        candidate=candidate,
        candidate_seconds=kwargs.pop("candidate_seconds", 0.003),
        **kwargs,
    )
    return tally


def one(primary: dict[str, Any] | None, candidate: dict[str, Any] | None, **kwargs: Any) -> dict[str, Any]:
    """The report of a tally that recorded this one request."""
    return record(Tally(), primary, candidate, **kwargs).report()


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64).reshape(a.shape[0], -1), b.astype(np.float64).reshape(b.shape[0], -1)
    return np.sum(a64 * b64, axis=1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1))


def nearest_rank(values: np.ndarray, q: float) -> float:
    """The ``q`` quantile by nearest rank: the value ranked ``ceil(q * n)`` from the bottom."""
    ordered = np.sort(values)
    return float(ordered[max(1, math.ceil(q * len(ordered))) - 1])


# --- identical and offset outputs -----------------------------------------------------------------------------


def test_identical_outputs_agree_fully():
    x = np.random.default_rng(1).normal(size=(8, 5)).astype(np.float32)

    report = one({"y": x}, {"y": x.copy()})

    assert (report["requests"], report["compared"], report["dropped"]) == (1, 1, 0)
    out = report["outputs"]["y"]
    assert out["rows"] == 8
    for name in ("cosine_p1", "cosine_p50", "cosine_min"):
        assert out[name] == pytest.approx(1.0, abs=2e-9), name
    assert (out["max_abs_diff"], out["mean_abs_diff"]) == (0.0, 0.0)
    assert out["psi"] == pytest.approx(0.0, abs=1e-12)
    assert out["top1_agreement"] == 1.0
    assert (out["mismatched"], out["mismatch"]) == (0, "")


def test_a_known_offset_gives_the_exact_differences_and_the_lowest_cosine():
    x = np.arange(24, dtype=np.float32).reshape(6, 4)

    out = one({"y": x + 1}, {"y": x + 1.25})["outputs"]["y"]

    assert out["max_abs_diff"] == 0.25
    assert out["mean_abs_diff"] == 0.25
    cosines = row_cosines(x + 1, x + 1.25)
    assert out["cosine_min"] == pytest.approx(float(cosines.min()), abs=ROUNDING)
    # The percentiles are bins' far edges: never better than the truth, within one bin of it.
    assert out["cosine_p1"] <= float(cosines.min()) + ROUNDING
    assert 1 - out["cosine_p1"] <= (1 - float(cosines.min())) * RATIO + ROUNDING
    assert out["top1_agreement"] == 1.0  # a constant added moves no row's largest value


@pytest.mark.parametrize("rows", [2, 37, 100, 200, 250, 1000])
def test_cosine_percentiles_are_never_above_the_true_ones_and_within_one_bin(rows):
    rng = np.random.default_rng(rows)
    primary = rng.normal(size=(rows, 16))
    # Each row moved by its own amount, so the cosines spread over several decades of distance from 1...
    scale = 10.0 ** rng.uniform(-4, -0.5, size=(rows, 1))
    candidate = primary + rng.normal(size=(rows, 16)) * scale
    # ...and the worst row turned around: the 1st percentile must not skip over it.
    candidate[0] = -primary[0]

    out = one({"y": primary}, {"y": candidate})["outputs"]["y"]

    cosines = row_cosines(primary, candidate)
    for name, q in (("cosine_p1", 0.01), ("cosine_p50", 0.5)):
        # The truth by nearest rank, and as NumPy interpolates it (never below the nearest rank's).
        for truth in (nearest_rank(cosines, q), float(np.percentile(cosines, q * 100))):
            assert out[name] <= truth + ROUNDING, (name, out[name], truth)
        truth = nearest_rank(cosines, q)
        assert 1 - out[name] <= min(2.0, (1 - truth) * RATIO) + ROUNDING, (name, out[name], truth)
    assert out["cosine_min"] == pytest.approx(-1.0, abs=ROUNDING)


# --- top-1 agreement ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("differ", [0, 1, 3, 10])
def test_top1_agreement_counts_the_rows_whose_largest_column_moved(differ):
    rows, columns = 10, 5
    rng = np.random.default_rng(differ)
    scores = rng.uniform(0, 1, size=(rows, columns)).astype(np.float32)
    winners = rng.integers(0, columns, size=rows)
    scores[np.arange(rows), winners] = 2.0  # one clear winner a row
    candidate = scores.copy()
    for row in range(differ):  # the first ``differ`` rows: another column wins
        candidate[row, (winners[row] + 1) % columns] = 3.0
    assert int(np.count_nonzero(scores.argmax(axis=1) != candidate.argmax(axis=1))) == differ

    out = one({"scores": scores}, {"scores": candidate})["outputs"]["scores"]

    assert out["top1_agreement"] == pytest.approx((rows - differ) / rows)


def test_top1_agreement_adds_up_over_requests():
    scores = np.eye(4, dtype=np.float32)
    moved = scores[:, ::-1].copy()  # every row's winner moves (4 columns, so none stays put)
    tally = Tally()
    record(tally, {"s": scores}, {"s": scores})
    record(tally, {"s": scores}, {"s": moved})
    record(tally, {"s": scores[:2]}, {"s": scores[:2]})

    assert tally.report()["outputs"]["s"]["top1_agreement"] == pytest.approx(6 / 10)


@pytest.mark.parametrize(
    "shape, dtype",
    [((5,), np.float32), ((2, 3, 4), np.float32), ((6, 1), np.float32), ((3, 4), np.int64), ((), np.float32)],
)
def test_no_top1_agreement_where_the_output_is_not_class_scores(shape, dtype):
    values = np.arange(math.prod(shape), dtype=dtype).reshape(shape)

    out = one({"y": values}, {"y": values + 1})["outputs"]["y"]

    assert out["top1_agreement"] is None
    assert out["max_abs_diff"] == 1.0


def test_rows_are_items_of_the_first_dimension():
    for shape, rows in (((), 1), ((7,), 1), ((3, 2), 3), ((4, 2, 3), 4), ((0, 3, 4), 0)):
        values = np.ones(shape, dtype=np.float32)
        out = one({"y": values}, {"y": values})["outputs"]["y"]
        assert out["rows"] == rows, shape


# --- mismatches and errors ------------------------------------------------------------------------------------


def test_a_shape_mismatch_is_counted_with_its_message_and_not_compared():
    tally = Tally()
    record(tally, {"y": np.zeros((2, 4), np.float32)}, {"y": np.zeros((2, 5), np.float32)})
    record(tally, {"y": np.zeros((3, 4), np.float32)}, {"y": np.zeros((3, 4, 1), np.float32)})

    report = tally.report()

    assert report["compared"] == 2  # both answered; the outputs could not be compared
    out = report["outputs"]["y"]
    assert out["mismatched"] == 2
    assert out["mismatch"] == "shape [3, 4, 1] where the primary's is [3, 4]"
    assert (out["rows"], out["cosine_p1"], out["cosine_min"], out["max_abs_diff"], out["psi"]) == (
        0,
        None,
        None,
        None,
        None,
    )


def test_an_output_the_candidate_lacks_is_counted_as_mismatched():
    x = np.ones((2, 3), np.float32)

    report = one({"y": x, "z": x}, {"z": x, "extra": x})

    assert report["outputs"]["y"]["mismatched"] == 1
    assert report["outputs"]["y"]["mismatch"] == "the candidate has no such output"
    assert report["outputs"]["z"]["mismatched"] == 0
    assert "extra" not in report["outputs"]  # the primary's outputs are the ones compared


def test_a_candidate_error_counts_an_error_and_compares_nothing():
    error = "InvalidArgument: " + "x" * 1000

    report = one({"y": np.ones(3, np.float32)}, None, candidate_error=error)

    assert (report["requests"], report["compared"], report["outputs"]) == (1, 0, {})
    candidate = report["candidate"]
    assert (candidate["answered"], candidate["errors"], candidate["error_rate"]) == (0, 1, 1.0)
    assert candidate["last_error"] == error[:LAST_ERROR_CHARS]
    assert (candidate["p50_ms"], candidate["p99_ms"]) == (None, None)  # no latency for a failed run
    primary = report["primary"]
    assert (primary["answered"], primary["errors"], primary["error_rate"], primary["last_error"]) == (1, 0, 0.0, "")


def test_a_primary_error_compares_nothing_either():
    report = one(None, {"y": np.ones(3, np.float32)}, primary_error="primary broke")

    assert (report["requests"], report["compared"], report["outputs"]) == (1, 0, {})
    assert (report["primary"]["errors"], report["primary"]["last_error"]) == (1, "primary broke")
    assert (report["candidate"]["answered"], report["candidate"]["errors"]) == (1, 0)


def test_latency_percentiles_are_bin_edges_at_or_above_the_times():
    tally = Tally()
    for _ in range(99):
        record(tally, {"y": np.ones(1)}, {"y": np.ones(1)}, primary_seconds=0.010, candidate_seconds=0.004)
    record(tally, {"y": np.ones(1)}, {"y": np.ones(1)}, primary_seconds=0.010, candidate_seconds=0.5)

    report = tally.report()

    assert 10.0 <= report["primary"]["p50_ms"] <= 10.0 * 2 ** (1 / 4) * 1.01
    assert report["primary"]["p99_ms"] == report["primary"]["p50_ms"]
    assert 4.0 <= report["candidate"]["p50_ms"] <= 4.0 * 2 ** (1 / 4) * 1.01
    assert report["candidate"]["p99_ms"] == report["candidate"]["p50_ms"]  # 99 of 100 took 4 ms
    assert report["candidate"]["error_rate"] == 0.0


def test_dropped_requests_are_counted_by_reason():
    tally = Tally()
    for reason in ("busy", "queue_full", "busy", "unloaded", "busy"):
        tally.dropped(reason)

    report = tally.report()

    assert (report["requests"], report["dropped"]) == (0, 5)
    assert report["dropped_by_reason"] == {"busy": 3, "queue_full": 1, "unloaded": 1}
    assert list(report["dropped_by_reason"]) == ["busy", "queue_full", "unloaded"]


# --- merging --------------------------------------------------------------------------------------------------


def traffic(seed: int, requests: int) -> list[tuple[dict[str, Any] | None, dict[str, Any] | None, dict[str, Any]]]:
    """Mixed requests: agreeing, differing, shifted, mismatched, failing. Values are multiples of 1/64, so that
    sums are exact in any order."""
    rng = np.random.default_rng(seed)
    made: list[tuple[dict[str, Any] | None, dict[str, Any] | None, dict[str, Any]]] = []
    for i in range(requests):
        rows = int(rng.integers(1, 6))
        scores = np.round(rng.normal(size=(rows, 4)) * 64) / 64
        labels = np.array([f"c{j}" for j in rng.integers(0, 3, size=rows)])
        noise = np.round(rng.normal(size=(rows, 4)) * 8) / 64
        primary = {"scores": scores.astype(np.float32), "labels": labels}
        candidate = {"scores": (scores + noise).astype(np.float32), "labels": labels if i % 3 else labels[::-1]}
        kind = i % 7
        times = {"primary_seconds": float(rng.uniform(0.001, 0.05)), "candidate_seconds": float(rng.uniform(0, 0.1))}
        if kind == 5:
            made.append((primary, None, {**times, "candidate_error": "Fail: boom"}))
        elif kind == 6:
            made.append((primary, {"scores": scores[:, :3].astype(np.float32)}, times))
        else:
            made.append((primary, candidate, times))
    return made


def replay(tally: Tally, requests: list[Any], drops: int = 0) -> Tally:
    for primary, candidate, kwargs in requests:
        record(tally, primary, candidate, **kwargs)
    for i in range(drops):
        tally.dropped(("busy", "queue_full")[i % 2])
    return tally


def test_merged_tallies_report_as_one_tally_that_recorded_everything():
    first, second, third = traffic(1, 20), traffic(2, 15), traffic(3, 9)
    together = replay(replay(replay(Tally(), first, drops=3), second, drops=2), third)

    # As the registry does it: each process's tally through JSON, then summed.
    parts = [replay(Tally(), first, drops=3), replay(Tally(), second, drops=2), replay(Tally(), third)]
    stored = [json.loads(json.dumps(part.as_json(), allow_nan=False)) for part in parts]
    merged = Tally()
    for data in stored:
        merged.merge(data)
    backwards = Tally()
    for data in reversed(stored):
        backwards.merge(data)

    expected = together.report()
    assert expected["requests"] == 44 and expected["dropped"] == 5
    assert expected["outputs"]["scores"]["mismatched"] > 0 and expected["candidate"]["errors"] > 0
    assert merged.report() == expected
    assert Tally(stored[0]).merge(stored[1]).merge(stored[2]).report() == expected
    # In another order, the same but for the text: the last error and mismatch of the last tally that has one.
    reversed_report = backwards.report()
    assert reversed_report["outputs"]["scores"]["mismatch"] == parts[0].report()["outputs"]["scores"]["mismatch"]
    for report in (reversed_report, expected):
        for output in report["outputs"].values():
            output["mismatch"] = ""
    assert reversed_report == expected
    assert stored[0] == parts[0].as_json()  # merging took nothing from the parts


def test_merging_an_empty_tally_changes_nothing():
    tally = replay(Tally(), traffic(4, 10))
    before = tally.report()

    assert tally.merge(Tally().as_json()).report() == before
    assert Tally().merge(tally.as_json()).report() == before
    assert Tally().report()["outputs"] == {}


# --- drift (PSI) ----------------------------------------------------------------------------------------------


def drift(primary: np.ndarray, candidate: np.ndarray, requests: int = 8) -> float | None:
    tally = Tally()
    for p, c in zip(np.array_split(primary, requests), np.array_split(candidate, requests), strict=True):
        record(tally, {"y": p}, {"y": c})
    return tally.report()["outputs"]["y"]["psi"]


def test_psi_is_small_for_the_same_distribution():
    rng = np.random.default_rng(5)
    primary = rng.lognormal(0, 1.5, size=(4000, 4))
    candidate = rng.lognormal(0, 1.5, size=(4000, 4))  # another draw of the same

    value = drift(primary, candidate)

    assert value is not None and value < 0.1
    assert drift(primary, primary.copy()) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("factor", [1e3, 1e-3, -1.0])
def test_psi_is_large_for_values_shifted_by_orders_of_magnitude(factor):
    rng = np.random.default_rng(6)
    primary = rng.lognormal(0, 0.5, size=(2000, 4))

    value = drift(primary, primary * factor)

    assert value is not None and value > 0.25, value


def test_psi_is_large_for_a_concentrated_primary_whichever_way_the_candidate_moves():
    primary = np.full((100, 4), 1.0)
    for factor in (1e3, 1e-3):
        value = drift(primary, primary * factor)
        assert value is not None and value > 0.25, (factor, value)


def test_psi_of_an_empty_histogram_is_none():
    assert psi({}, {"3": 1}) is None
    assert psi({"3": 1}, {}) is None
    assert psi({"3": 5, "4": 5}, {"3": 5, "4": 5}) == 0.0


# --- strings, non-finite values, large outputs ----------------------------------------------------------------


def test_strings_are_the_same_or_not():
    labels = np.array(["cat", "dog", "owl"])

    same = one({"label": labels}, {"label": labels.copy()})["outputs"]["label"]
    other = one({"label": labels}, {"label": np.array(["cat", "dog", "emu"])})["outputs"]["label"]

    assert same["rows"] == 1
    assert same["cosine_p1"] == pytest.approx(1.0, abs=2e-9) and same["cosine_min"] == 1.0
    assert other["cosine_p1"] == -1.0 and other["cosine_min"] == -1.0
    for out in (same, other):
        assert (out["max_abs_diff"], out["mean_abs_diff"], out["top1_agreement"], out["psi"]) == (
            None,
            None,
            None,
            None,
        )
        assert out["mismatched"] == 0


def test_non_finite_values_are_left_out_of_the_differences_and_do_not_crash():
    primary = np.array([[1.0, np.nan, np.inf, 2.0], [1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    candidate = np.array([[1.5, np.nan, np.inf, -np.inf], [1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    tally = Tally()

    with np.errstate(all="ignore"):
        record(tally, {"y": primary}, {"y": candidate})
        record(tally, {"y": np.full(3, np.nan)}, {"y": np.full(3, np.nan)})
    report = tally.report()

    out = report["outputs"]["y"]
    # Finite differences only: 0.5 and the second row's zeros (nan - nan, inf - inf, 2 - -inf are left out).
    assert out["max_abs_diff"] == 0.5
    assert out["mean_abs_diff"] == pytest.approx(0.5 / 5)
    assert out["cosine_min"] is not None and -1.0 <= out["cosine_min"] <= 0.0  # a row with NaN does not agree
    assert out["cosine_p1"] is not None and out["cosine_p1"] <= 0.0
    assert out["rows"] == 3
    # The tally is stored as JSON (PostgreSQL's jsonb has no NaN) and the report is sent as JSON.
    json.dumps(tally.as_json(), allow_nan=False)
    json.dumps(report, allow_nan=False)


def test_at_most_values_per_output_values_of_a_huge_output_are_counted_for_drift():
    size = VALUES_PER_OUTPUT * 25 + 7
    huge = np.linspace(0.5, 5.0, size, dtype=np.float32).reshape(1, size)

    tally = record(Tally(), {"y": huge}, {"y": huge * 2})
    entry = tally.as_json()["outputs"]["y"]

    counted = sum(entry["primary_values"].values())
    assert VALUES_PER_OUTPUT // 2 < counted <= VALUES_PER_OUTPUT
    assert sum(entry["candidate_values"].values()) == counted
    assert entry["values"] == size  # the differences still see every value
    small = record(Tally(), {"y": huge[:, :100]}, {"y": huge[:, :100]}).as_json()["outputs"]["y"]
    assert sum(small["primary_values"].values()) == 100
