"""Triton's statistics extension: what each loaded version has done, in counters a request bumps without a lock.

Each loaded version owns one :class:`VersionStats`. Every field has exactly one writer, so no lock
is needed on the request path: the event loop records how each request ended
(:meth:`VersionStats.request_done`, :meth:`VersionStats.request_failed`), and the version's one
ONNX Runtime thread records each run (:meth:`VersionStats.batch_done`). Readers take a snapshot;
a counter read while the other thread bumps it is at worst one request behind. Durations are
``time.monotonic_ns`` differences, summed as Triton sums them: a batch's compute time is counted
once for each request in it.

The JSON of :meth:`VersionStats.as_json` is Triton's (``GET /v2/models/stats``), so
``tritonclient``'s ``get_inference_statistics()`` reads it; the gRPC server builds its message from it.
"""

from __future__ import annotations

import time
from typing import Any


def _duration(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


class VersionStats:
    """Counters of one loaded version: requests that succeeded or failed, time queued and computing, runs by size."""

    __slots__ = (
        "batches",
        "busy_ns",
        "cache_hit_count",
        "cache_hit_ns",
        "cache_miss_count",
        "cache_miss_ns",
        "compute_infer_ns",
        "compute_input_ns",
        "compute_output_ns",
        "computed",
        "execution_count",
        "fail_count",
        "fail_ns",
        "inference_count",
        "last_inference_ms",
        "queue_ns",
        "success_count",
        "success_ns",
    )

    def __init__(self) -> None:
        # Written on the event loop.
        self.success_count = 0
        self.success_ns = 0
        self.fail_count = 0
        self.fail_ns = 0
        self.last_inference_ms = 0
        # The response cache (``inference/response_cache.py``), as Triton counts its own: a hit's time is its
        # lookup, a miss's its lookup and the insertion of the answer.
        self.cache_hit_count = 0
        self.cache_hit_ns = 0
        self.cache_miss_count = 0
        self.cache_miss_ns = 0
        # Written on the version's ONNX Runtime thread.
        self.computed = 0  # requests whose run finished (the count of queue and compute_*)
        self.queue_ns = 0
        self.compute_input_ns = 0
        self.compute_infer_ns = 0
        self.compute_output_ns = 0
        self.inference_count = 0  # rows of those requests (a batch-4 request is 4 inferences)
        self.execution_count = 0  # ONNX Runtime runs
        self.batches: dict[int, list[int]] = {}  # rows in a run -> [runs, input ns, infer ns, output ns]
        self.busy_ns = 0  # time spent in those runs, once per run (what a shadow's cost is measured against)

    # --- writers ---------------------------------------------------------------------------------------

    def request_done(self, started_ns: int) -> None:
        """On the event loop: a request got its outputs; ``started_ns`` is when the data plane took it."""
        self.success_count += 1
        self.success_ns += time.monotonic_ns() - started_ns
        self.last_inference_ms = time.time_ns() // 1_000_000

    def cache_hit(self, started_ns: int) -> None:
        """On the event loop: a request answered from the response cache (a success, with no run)."""
        now = time.monotonic_ns()
        self.cache_hit_count += 1
        self.cache_hit_ns += now - started_ns
        self.success_count += 1
        self.success_ns += now - started_ns
        self.last_inference_ms = time.time_ns() // 1_000_000

    def cache_miss(self, ns: int) -> None:
        """On the event loop: a request the response cache could not answer; ``ns``: its lookup and insertion."""
        self.cache_miss_count += 1
        self.cache_miss_ns += ns

    def request_failed(self, started_ns: int) -> None:
        """On the event loop: a request reached the version and got no outputs (queue full, timed out, run failed)."""
        self.fail_count += 1
        self.fail_ns += time.monotonic_ns() - started_ns
        self.last_inference_ms = time.time_ns() // 1_000_000

    def batch_done(
        self, rows: int, requests: int, queued_ns: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """On the ONNX Runtime thread: one successful run of ``requests`` requests holding ``rows`` rows.

        ``queued_ns`` is the time those requests waited in the queue, added up.
        """
        self.computed += requests
        self.queue_ns += queued_ns
        self.compute_input_ns += input_ns * requests
        self.compute_infer_ns += infer_ns * requests
        self.compute_output_ns += output_ns * requests
        self.inference_count += rows
        self.execution_count += 1
        self.busy_ns += input_ns + infer_ns + output_ns
        by_size = self.batches.get(rows)
        if by_size is None:
            by_size = self.batches[rows] = [0, 0, 0, 0]
        by_size[0] += 1
        by_size[1] += input_ns
        by_size[2] += infer_ns
        by_size[3] += output_ns

    # --- reader ----------------------------------------------------------------------------------------

    def as_json(self, model: str, version: str) -> dict[str, Any]:
        """Triton's model statistics object for this version."""
        computed = self.computed
        batches = sorted(self.batches.items())  # one C call: safe while the ONNX Runtime thread adds a size
        return {
            "name": model,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": _duration(self.success_count, self.success_ns),
                "fail": _duration(self.fail_count, self.fail_ns),
                "queue": _duration(computed, self.queue_ns),
                "compute_input": _duration(computed, self.compute_input_ns),
                "compute_infer": _duration(computed, self.compute_infer_ns),
                "compute_output": _duration(computed, self.compute_output_ns),
                "cache_hit": _duration(self.cache_hit_count, self.cache_hit_ns),
                "cache_miss": _duration(self.cache_miss_count, self.cache_miss_ns),
            },
            "batch_stats": [
                {
                    "batch_size": rows,
                    "compute_input": _duration(runs, input_ns),
                    "compute_infer": _duration(runs, infer_ns),
                    "compute_output": _duration(runs, output_ns),
                }
                for rows, (runs, input_ns, infer_ns, output_ns) in batches
            ],
            "memory_usage": [],
        }
