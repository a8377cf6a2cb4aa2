"""The batcher's worker threads (``_RunThreads``): as many as runs at once, every outcome handed back, a clean end."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

from inference.batcher import _Outcome, _RunThreads


class Outcomes:
    """Collects what the threads hand back, with the thread that handed each back."""

    def __init__(self) -> None:
        self.got: list[tuple[_Outcome, str]] = []
        self.arrived = threading.Semaphore(0)

    def __call__(self, outcome: _Outcome) -> None:
        self.got.append((outcome, threading.current_thread().name))
        self.arrived.release()

    def wait(self, count: int) -> None:
        for _ in range(count):
            assert self.arrived.acquire(timeout=5), f"{len(self.got)} of {count} outcomes came back"


def live(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(name)]


def test_runs_one_after_another_share_one_thread():
    threads, outcomes = _RunThreads("rt-seq"), Outcomes()
    try:
        for value in range(3):
            threads.submit(lambda v: [{"y": np.array([v])}], (value,), outcomes)
            outcomes.wait(1)
        assert [int(o.result[0]["y"][0]) for o, _ in outcomes.got] == [0, 1, 2]
        assert all(o.error is None for o, _ in outcomes.got)
        assert {name for _, name in outcomes.got} == {"rt-seq_0"}
        assert [t.name for t in live("rt-seq")] == ["rt-seq_0"]
    finally:
        threads.shutdown(wait=True)


def test_runs_at_once_get_a_thread_each_and_no_more():
    threads, outcomes = _RunThreads("rt-par"), Outcomes()
    gate, started = threading.Event(), threading.Semaphore(0)

    def held(value: int) -> list[dict[str, np.ndarray]]:
        started.release()
        gate.wait(5)
        return [{"y": np.array([value])}]

    try:
        threads.submit(held, (1,), outcomes)
        threads.submit(held, (2,), outcomes)
        for _ in range(2):
            assert started.acquire(timeout=5)  # both run at once: each on a thread of its own
        gate.set()
        outcomes.wait(2)
        assert sorted(name for _, name in outcomes.got) == ["rt-par_0", "rt-par_1"]
        threads.submit(held, (3,), outcomes)  # both idle now: no third thread
        outcomes.wait(1)
        assert len(live("rt-par")) == 2
    finally:
        threads.shutdown(wait=True)


def test_an_error_is_handed_back_as_the_outcome_and_the_thread_goes_on():
    threads, outcomes = _RunThreads("rt-err"), Outcomes()

    def fails() -> list[dict[str, np.ndarray]]:
        raise ValueError("bad input")

    try:
        threads.submit(fails, (), outcomes)
        outcomes.wait(1)
        threads.submit(lambda: [{"y": np.ones(1)}], (), outcomes)
        outcomes.wait(1)
        (failed, _), (ok, _) = outcomes.got
        assert isinstance(failed.error, ValueError) and str(failed.error) == "bad input"
        assert failed.result == []
        assert ok.error is None and ok.result[0]["y"].tolist() == [1.0]
        assert len(live("rt-err")) == 1
    finally:
        threads.shutdown(wait=True)


def test_a_hand_back_that_raises_is_logged_and_the_next_run_still_comes_back(caplog):
    threads, outcomes = _RunThreads("rt-cb"), Outcomes()

    called = threading.Event()

    def broken(outcome: _Outcome) -> None:
        called.set()
        raise KeyError("gone")

    try:
        with caplog.at_level("ERROR", logger="inference.batcher"):
            threads.submit(lambda: [], (), broken)
            assert called.wait(5)
            threads.submit(lambda: [{"y": np.zeros(1)}], (), outcomes)  # the same thread, once it has logged
            outcomes.wait(1)
        assert [r.getMessage() for r in caplog.records] == ["handing back a run failed"]
        assert len(live("rt-cb")) == 1
    finally:
        threads.shutdown(wait=True)


def test_a_thread_keeps_nothing_of_a_run_once_it_is_handed_back():
    threads, outcomes = _RunThreads("rt-ref"), Outcomes()

    class Feeds:
        pass

    feeds = Feeds()
    gone = weakref.ref(feeds)
    try:
        threads.submit(lambda f: [{"y": np.zeros(1)}], (feeds,), outcomes)
        outcomes.wait(1)
        del feeds
        outcomes.got.clear()
        for _ in range(50):  # the thread drops its references just after the hand-back
            gc.collect()
            if gone() is None:
                break
            threading.Event().wait(0.01)
        assert gone() is None
    finally:
        threads.shutdown(wait=True)


def test_after_shutdown_the_queued_runs_finish_then_the_threads_end_and_nothing_more_is_taken():
    threads, outcomes = _RunThreads("rt-end"), Outcomes()
    gate = threading.Event()

    def held(value: int) -> list[dict[str, np.ndarray]]:
        gate.wait(5)
        return [{"y": np.array([value])}]

    threads.submit(held, (1,), outcomes)
    threads.submit(lambda: [{"y": np.array([2])}], (), outcomes)  # a second thread starts for it
    threads.shutdown()
    with pytest.raises(RuntimeError, match=r"^the batcher's threads were shut down$"):
        threads.submit(held, (3,), outcomes)
    gate.set()
    threads.shutdown(wait=True)
    assert sorted(int(o.result[0]["y"][0]) for o, _ in outcomes.got) == [1, 2]
    assert live("rt-end") == []
