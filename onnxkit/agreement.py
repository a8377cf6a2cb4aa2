"""How closely a candidate version's outputs follow the primary's on live requests: a shadow's tally.

An inference process that mirrors an alias's requests to a candidate (``inference/shadow.py``)
records each comparison into a :class:`Tally`; the registry merges the tallies of every process
(:meth:`Tally.merge`) and reads the report from the sum (:meth:`Tally.report`). Everything in a tally
is a count, a sum, a maximum or a fixed-bin histogram, so tallies add up across processes and
restarts and the report is the same whichever way they were merged. The one exception is text: the
last error and the last mismatch message come from the last tally merged that has one.

Per output, over the rows of the requests both versions answered (a row: one item of the first
dimension; a 0- or 1-dimensional output is one row):

- cosine similarity: its lowest value, and its 1st and 50th percentiles from a histogram of
  ``1 - cosine`` in log-scale bins ``2**(1/8)`` apart from 1e-9 (a percentile is the bin's far edge,
  so it is never better than the truth, and within about 9 % of the distance from 1);
- the largest absolute difference (exact) and the mean one;
- top-1 agreement, for outputs that look like class scores: floating point, two dimensions, more
  than one column (the same rule as a derived version's accuracy delta, ``onnxkit/derive.py``);
- drift: the population stability index between the two versions' output values. The values are
  counted in fixed bins (sign and decade, four to a decade, from 1e-6 to 1e6); the report groups
  those bins into ten of roughly equal share of the primary's values, then sums
  ``(c - p) * ln(c / p)`` over the groups (shares floored at 1e-4); the candidate's values outside
  the primary's bins, below or above, are groups of their own. Below 0.1 is usually read as no
  shift, above 0.25 as a large one. At most ``VALUES_PER_OUTPUT`` values of each output of a request
  are counted (evenly strided), so a large output costs the same as a small one.

And for each version: its errors, and its latency (p50, p99) from log-scale bins ``2**(1/4)``
apart from 0.1 ms.

No Django and no ONNX Runtime here; NumPy only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["Tally", "psi"]

_DISTANCE_FLOOR = 1e-9
_DISTANCE_RATIO = 2 ** (1 / 8)
_LATENCY_FLOOR = 0.0001  # seconds
_LATENCY_RATIO = 2 ** (1 / 4)
_LATENCY_BINS = int(math.log(120 / _LATENCY_FLOOR, _LATENCY_RATIO)) + 2
_VALUE_FLOOR = 1e-6
_VALUE_STEPS = 4  # bins per decade
_VALUE_DECADES = 12  # 1e-6 .. 1e6
_VALUE_TOP = _VALUE_STEPS * _VALUE_DECADES + 1  # the last bin holds everything larger
VALUES_PER_OUTPUT = 4096
PSI_GROUPS = 10
_PSI_FLOOR = 1e-4
LAST_ERROR_CHARS = 300


def _distance_bin(distance: np.ndarray) -> np.ndarray:
    """0 for a distance up to 1e-9, then one bin per factor ``2**(1/8)``."""
    clipped = np.maximum(distance, _DISTANCE_FLOOR)
    return np.ceil(np.log(clipped / _DISTANCE_FLOOR) / math.log(_DISTANCE_RATIO) - 1e-9).astype(np.int64)


def _distance_edge(index: int) -> float:
    return _DISTANCE_FLOOR * _DISTANCE_RATIO**index


def _latency_bin(seconds: float) -> int:
    if seconds <= _LATENCY_FLOOR:
        return 0
    return min(_LATENCY_BINS, math.ceil(math.log(seconds / _LATENCY_FLOOR, _LATENCY_RATIO) - 1e-9))


def _latency_edge_ms(index: int) -> float:
    return float(f"{_LATENCY_FLOOR * _LATENCY_RATIO**index * 1000:.3g}")


def _value_bins(values: np.ndarray) -> np.ndarray:
    """Signed bins: 0 for |v| below 1e-6, else the sign times 1 + the quarter-decades above it (capped)."""
    magnitude = np.abs(values)
    steps = np.floor(np.log10(np.maximum(magnitude, _VALUE_FLOOR) / _VALUE_FLOOR) * _VALUE_STEPS).astype(np.int64)
    index = np.minimum(steps + 1, _VALUE_TOP)
    index = np.where(magnitude < _VALUE_FLOOR, 0, index)
    return np.where(values < 0, -index, index)


def _add(histogram: dict[str, int], bins: np.ndarray) -> None:
    if bins.size == 0:
        return
    keys, counts = np.unique(bins, return_counts=True)
    for key, count in zip(keys.tolist(), counts.tolist(), strict=True):
        name = str(key)
        histogram[name] = histogram.get(name, 0) + count


def _merge_histogram(into: dict[str, int], other: Mapping[str, int]) -> None:
    for key, count in other.items():
        into[key] = into.get(key, 0) + int(count)


def _quantile_bin(histogram: Mapping[str, int], q: float, *, from_top: bool = False) -> int | None:
    """The bin holding the ``q`` quantile of what the histogram counted; None when it counted nothing.

    ``from_top``: the ``q`` quantile counted from the largest value down (the value ranked ``ceil(q * n)``
    from the top), which is what a low percentile of the cosine is in a histogram of ``1 - cosine``.
    """
    total = sum(histogram.values())
    if not total:
        return None
    rank = max(1, math.ceil(q * total))
    if from_top:
        rank = total - rank + 1
    seen = 0
    for key in sorted(histogram, key=int):
        seen += histogram[key]
        if seen >= rank:
            return int(key)
    raise AssertionError("unreachable: the ranks add up to the total")  # pragma: no cover


def psi(primary: Mapping[str, int], candidate: Mapping[str, int], groups: int = PSI_GROUPS) -> float | None:
    """The population stability index of two value histograms over the same fixed bins (see the module text)."""
    total_p, total_c = sum(primary.values()), sum(candidate.values())
    if not total_p or not total_c:
        return None
    keys = sorted({*primary, *candidate}, key=int)
    # Group consecutive bins until each group holds about 1/groups of the primary's values.
    grouped: list[tuple[int, int]] = []
    share_p = share_c = 0
    target = total_p / groups
    closed = 0  # groups closed on the primary's share
    for key in keys:
        if not share_p and share_c and primary.get(key, 0):
            # The candidate's values below the primary's lowest are a group of their own, as those above
            # its highest are (the last group): else a candidate shifted down hides in the first group.
            grouped.append((0, share_c))
        share_p += primary.get(key, 0)
        share_c += candidate.get(key, 0)
        if share_p >= target * (closed + 1) - 1e-9:
            grouped.append((share_p, share_c))
            closed += 1
    if not grouped or grouped[-1] != (share_p, share_c):
        grouped.append((share_p, share_c))
    index = 0.0
    last_p = last_c = 0
    for cumulative_p, cumulative_c in grouped:
        p = max((cumulative_p - last_p) / total_p, _PSI_FLOOR)
        c = max((cumulative_c - last_c) / total_c, _PSI_FLOOR)
        index += (c - p) * math.log(c / p)
        last_p, last_c = cumulative_p, cumulative_c
    return round(index, 6)


def _rows(array: np.ndarray) -> np.ndarray:
    """The output as rows of float64: one per item of the first dimension (one in all below two dimensions)."""
    values = np.asarray(array, dtype=np.float64)
    if values.ndim < 2:
        return values.reshape(1, values.size)
    # The width is spelled out: ``-1`` is refused for an empty batch of three or more dimensions.
    return values.reshape(values.shape[0], math.prod(values.shape[1:]))


def _strided(values: np.ndarray) -> np.ndarray:
    flat = values.reshape(-1)
    if flat.size <= VALUES_PER_OUTPUT:
        return flat
    return flat[:: math.ceil(flat.size / VALUES_PER_OUTPUT)]


def _new_output() -> dict[str, Any]:
    return {
        "rows": 0,
        "distance": {},
        "cosine_min": None,
        "max_abs_diff": 0.0,
        "abs_diff_sum": 0.0,
        "values": 0,
        "top1": None,
        "primary_values": {},
        "candidate_values": {},
        "mismatched": 0,
        "mismatch": "",
    }


def _new_side() -> dict[str, Any]:
    return {"answered": 0, "errors": 0, "latency": {}, "last_error": ""}


class Tally:
    """The counts of one shadow in one process, or merged over several: a plain JSON document underneath."""

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self.data: dict[str, Any] = {
            "requests": 0,
            "compared": 0,
            "dropped": {},
            "primary": _new_side(),
            "candidate": _new_side(),
            "outputs": {},
        }
        if data:
            self.merge(data)

    # --- recording (an inference process) ------------------------------------------------------

    def dropped(self, reason: str) -> None:
        """One sampled request not mirrored, and why (``queue_full``, ``busy``, ``unloaded``)."""
        self.data["dropped"][reason] = self.data["dropped"].get(reason, 0) + 1

    def record(
        self,
        *,
        primary: Mapping[str, Any] | None,
        primary_seconds: float,
        candidate: Mapping[str, Any] | None,
        candidate_seconds: float,
        primary_error: str = "",
        candidate_error: str = "",
    ) -> None:
        """One mirrored request: each version's outputs (None with its error when it failed) and time."""
        self.data["requests"] += 1
        for side, outputs, seconds, error in (
            ("primary", primary, primary_seconds, primary_error),
            ("candidate", candidate, candidate_seconds, candidate_error),
        ):
            entry = self.data[side]
            if outputs is None:
                entry["errors"] += 1
                entry["last_error"] = error[:LAST_ERROR_CHARS]
            else:
                entry["answered"] += 1
                _add(entry["latency"], np.array([_latency_bin(seconds)]))
        if primary is None or candidate is None:
            return
        self.data["compared"] += 1
        for name, reference in primary.items():
            self._compare(name, np.asarray(reference), candidate.get(name))

    def _compare(self, name: str, reference: np.ndarray, got: Any) -> None:
        entry = self.data["outputs"].setdefault(name, _new_output())
        if got is None:
            entry["mismatched"] += 1
            entry["mismatch"] = "the candidate has no such output"
            return
        got = np.asarray(got)
        if got.shape != reference.shape:
            entry["mismatched"] += 1
            entry["mismatch"] = f"shape {list(got.shape)} where the primary's is {list(reference.shape)}"
            return
        numeric = np.issubdtype(reference.dtype, np.number) and np.issubdtype(got.dtype, np.number)
        if not numeric:
            # Strings: a row is the same (cosine 1) or not (cosine -1); nothing else applies.
            same = bool(np.array_equal(reference, got))
            entry["rows"] += 1
            _add(entry["distance"], _distance_bin(np.array([0.0 if same else 2.0])))
            row_cosine = 1.0 if same else -1.0
            entry["cosine_min"] = row_cosine if entry["cosine_min"] is None else min(entry["cosine_min"], row_cosine)
            return
        a, b = _rows(reference), _rows(got)
        entry["rows"] += a.shape[0]
        if a.size:
            diff = np.abs(a - b)
            finite = diff[np.isfinite(diff)]
            if finite.size:
                entry["max_abs_diff"] = max(entry["max_abs_diff"], float(finite.max()))
                entry["abs_diff_sum"] += float(finite.sum())
                entry["values"] += int(finite.size)
        if np.issubdtype(reference.dtype, np.floating):
            norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
            dots = np.einsum("ij,ij->i", a, b)
            with np.errstate(invalid="ignore", divide="ignore"):
                cosine = np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), 0.0)
            both_zero = (np.abs(a).sum(axis=1) == 0) & (np.abs(b).sum(axis=1) == 0)
            cosine = np.where(both_zero, 1.0, cosine)
            cosine = np.where(np.isfinite(cosine), np.clip(cosine, -1.0, 1.0), -1.0)
            _add(entry["distance"], _distance_bin(1.0 - cosine))
            lowest = float(cosine.min()) if cosine.size else None
            if lowest is not None:
                entry["cosine_min"] = lowest if entry["cosine_min"] is None else min(entry["cosine_min"], lowest)
            if reference.ndim == 2 and reference.shape[1] > 1:
                agree = int(np.count_nonzero(np.argmax(reference, axis=1) == np.argmax(got, axis=1)))
                top1 = entry["top1"] or [0, 0]
                entry["top1"] = [top1[0] + agree, top1[1] + reference.shape[0]]
        p_values, c_values = _strided(a), _strided(b)
        _add(entry["primary_values"], _value_bins(p_values[np.isfinite(p_values)]))
        _add(entry["candidate_values"], _value_bins(c_values[np.isfinite(c_values)]))

    # --- merging and reading (the registry) ------------------------------------------------------

    def merge(self, other: Mapping[str, Any]) -> Tally:
        data = self.data
        data["requests"] += int(other.get("requests", 0))
        data["compared"] += int(other.get("compared", 0))
        _merge_histogram(data["dropped"], other.get("dropped", {}))
        for side in ("primary", "candidate"):
            theirs = other.get(side) or {}
            mine = data[side]
            mine["answered"] += int(theirs.get("answered", 0))
            mine["errors"] += int(theirs.get("errors", 0))
            _merge_histogram(mine["latency"], theirs.get("latency", {}))
            if theirs.get("last_error"):
                mine["last_error"] = theirs["last_error"]
        for name, theirs in (other.get("outputs") or {}).items():
            mine = data["outputs"].setdefault(name, _new_output())
            mine["rows"] += int(theirs.get("rows", 0))
            _merge_histogram(mine["distance"], theirs.get("distance", {}))
            if theirs.get("cosine_min") is not None:
                low = theirs["cosine_min"]
                mine["cosine_min"] = low if mine["cosine_min"] is None else min(mine["cosine_min"], low)
            mine["max_abs_diff"] = max(mine["max_abs_diff"], float(theirs.get("max_abs_diff", 0.0)))
            mine["abs_diff_sum"] += float(theirs.get("abs_diff_sum", 0.0))
            mine["values"] += int(theirs.get("values", 0))
            if theirs.get("top1") is not None:
                top1 = mine["top1"] or [0, 0]
                mine["top1"] = [top1[0] + int(theirs["top1"][0]), top1[1] + int(theirs["top1"][1])]
            _merge_histogram(mine["primary_values"], theirs.get("primary_values", {}))
            _merge_histogram(mine["candidate_values"], theirs.get("candidate_values", {}))
            mine["mismatched"] += int(theirs.get("mismatched", 0))
            if theirs.get("mismatch"):
                mine["mismatch"] = theirs["mismatch"]
        return self

    def as_json(self) -> dict[str, Any]:
        return self.data

    def report(self) -> dict[str, Any]:
        """What people read: counts, each version's errors and latency, and per output how closely they agree."""
        data = self.data

        def side(entry: dict[str, Any]) -> dict[str, Any]:
            runs = entry["answered"] + entry["errors"]
            p50, p99 = _quantile_bin(entry["latency"], 0.5), _quantile_bin(entry["latency"], 0.99)
            return {
                "answered": entry["answered"],
                "errors": entry["errors"],
                "error_rate": round(entry["errors"] / runs, 6) if runs else None,
                "p50_ms": _latency_edge_ms(p50) if p50 is not None else None,
                "p99_ms": _latency_edge_ms(p99) if p99 is not None else None,
                "last_error": entry["last_error"],
            }

        outputs = {}
        for name, entry in sorted(data["outputs"].items()):
            # Low percentiles of the cosine are high ones of the distance, ranked from the top.
            p1 = _quantile_bin(entry["distance"], 0.01, from_top=True)
            p50 = _quantile_bin(entry["distance"], 0.5, from_top=True)
            top1 = entry["top1"]
            outputs[name] = {
                "rows": entry["rows"],
                "cosine_p1": _cosine(p1),
                "cosine_p50": _cosine(p50),
                "cosine_min": _rounded(entry["cosine_min"]),
                "max_abs_diff": float(f"{entry['max_abs_diff']:.6g}") if entry["values"] else None,
                "mean_abs_diff": float(f"{entry['abs_diff_sum'] / entry['values']:.6g}") if entry["values"] else None,
                "top1_agreement": round(top1[0] / top1[1], 6) if top1 and top1[1] else None,
                "psi": psi(entry["primary_values"], entry["candidate_values"]),
                "mismatched": entry["mismatched"],
                "mismatch": entry["mismatch"],
            }
        dropped = data["dropped"]
        return {
            "requests": data["requests"],
            "compared": data["compared"],
            "dropped": sum(dropped.values()),
            "dropped_by_reason": dict(sorted(dropped.items())),
            "primary": side(data["primary"]),
            "candidate": side(data["candidate"]),
            "outputs": outputs,
        }


def _cosine(distance_bin: int | None) -> float | None:
    """The cosine at a distance bin's far edge: never better than the rows it stands for."""
    if distance_bin is None:
        return None
    return _rounded(1.0 - min(2.0, _distance_edge(distance_bin)))


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 9)
