"""``bench/single_profile.py`` sorts the event loop's py-spy samples into the steps of one request."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
single_profile = importlib.import_module("single_profile")

LOOP = "thread (4242): MainThread;<module> (modelyard:6);Runner.run (asyncio/runners.py:118);uv_run (core.c)"
RAW = "\n".join(
    [
        f"{LOOP};uv__io_poll (linux.c);epoll_wait (libc.so.6) 50",  # waiting: not busy
        f"{LOOP};Response.__call__ (starlette/responses.py:171);UVStream_write (loop.c);write (libc.so.6) 6",
        f"{LOOP};HttpToolsProtocol.data_received (uvicorn/protocols/http/httptools_impl.py:174) 2",
        f"{LOOP};build_app.<locals>._answer (inference/app.py:202);decode_request (inference/protocol.py:540) 3",
        f"{LOOP};Batcher.submit (inference/batcher.py:310);_RunThreads.submit (inference/batcher.py:122) 4",
        f"{LOOP};DataPlane.admit (inference/dataplane.py:278) 4",
        f"{LOOP};Handle__run (loop.c) 1",
        # Another thread's samples are not the loop's.
        "thread (4250): ort-run_0;Batcher._run_batch (inference/batcher.py:507) 90",
    ]
)


def test_the_loops_busy_samples_are_shared_out_by_step_and_its_waiting_and_other_threads_left_out():
    found = single_profile.steps(RAW)
    assert found["samples_waiting"] == 50
    assert found["samples_busy"] == 20
    steps = [name for name, _ in single_profile.STEPS]
    assert found["busy_by_step"] == {
        steps[0]: 0.3,  # the write, although a Starlette frame is above it: the first step that matches wins
        steps[2]: 0.2,
        steps[7]: 0.2,
        steps[4]: 0.15,
        steps[1]: 0.1,
        single_profile.OTHER: 0.05,
    }
