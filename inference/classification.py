"""Triton's classification extension: an output asked for with ``classification: N`` comes back as its top N classes.

Each class is a BYTES element ``"score:index"``, or ``"score:index:label"`` when the version was
uploaded with a ``labels.txt`` (line ``index``, from 0, is the label). Scores are written as Triton
writes them (six decimals for floats). A batching model's output is classified row by row
(``[B, ...]`` becomes ``[B, N]``); any other output is classified whole (``[N]``). Ties keep the lower index first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _entry(value: object, index: int, labels: Sequence[str]) -> str:
    score = f"{value:f}" if isinstance(value, float) else str(value)
    label = labels[index] if index < len(labels) else ""
    return f"{score}:{index}:{label}" if label else f"{score}:{index}"


def _top(values: np.ndarray, count: int, labels: Sequence[str]) -> list[str]:
    flat = values.reshape(-1)
    order = np.argsort(-flat.astype(np.float64), kind="stable")[:count]
    return [_entry(flat[index].item(), int(index), labels) for index in order]


def classify(array: np.ndarray, count: int, labels: Sequence[str], *, batched: bool) -> np.ndarray:
    """The top ``count`` classes of ``array`` as an object array of ``str`` (BYTES)."""
    if batched and array.ndim >= 1:
        rows = [_top(row, count, labels) for row in array]
        width = min(count, int(np.prod(array.shape[1:])) if array.ndim > 1 else 1)
        table = np.empty((len(rows), width), dtype=object)
        for index, row in enumerate(rows):
            table[index, :] = row
        return table
    top = _top(array, count, labels)
    column = np.empty(len(top), dtype=object)
    column[:] = top
    return column
