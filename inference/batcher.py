"""A per-version dynamic batcher: concurrent requests with matching shapes become one ONNX Runtime run.

Up to ``instances`` batches run at once (Triton's ``instance_group.count``) while the queue forms the
next, on as many worker threads. Without ``lanes`` they share the version's one ORT session, whose
``run()`` is thread-safe: two keep a GPU busy while one batch is being merged, split and encoded.
With ``lanes`` (one run function per instance, on the CPU: sessions that split the cores between
them) each batch in flight has a lane of its own, and a lone batch (nothing else in flight, nothing
waiting) runs on ``run`` instead, alone: the session with every core, so light traffic keeps the
latency of one wide run while a busy queue gets the throughput of narrow runs side by side.

A batch closes when it reaches ``max_batch_size`` or when its oldest request has waited
``max_queue_delay``. Requests carry a class (``CLASS_NAMES``: a token's priority class, then ``job`` for
the chunks of asynchronous jobs, ``inference/jobs.py``), a priority within it (lower first, 0 = default)
and an optional timeout, as in Triton; the queue is bounded and a full queue is refused at once. A job's
request joins a batch of online ones only in the room they leave as it closes. As in Triton, a request
waiting for its batch to fill still counts against ``max_queue_size``. ORT runs in a worker
thread, so the event loop never blocks.

The settings may change while the batcher serves (:meth:`Batcher.configure`): each is read where it
is used, so the next request and the next batch follow them, and nothing queued is lost.

A batcher belongs to one loaded version and lives on the event loop of its first request; it is
closed with its version, from whichever thread releases that.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inference.errors import Overloaded, RequestTimeout
from inference.statistics import VersionStats

__all__ = [
    "CLASS_HIGH",
    "CLASS_JOB",
    "CLASS_LOW",
    "CLASS_NAMES",
    "CLASS_NORMAL",
    "Batcher",
    "Overloaded",
    "RequestTimeout",
    "batch_key",
]

log = logging.getLogger(__name__)

DEFAULT_PRIORITY = 10
# Priority classes, served strictly in this order; a request's ``priority`` orders it within its class.
CLASS_NAMES = ("high", "normal", "low", "job")
CLASS_HIGH, CLASS_NORMAL, CLASS_LOW, CLASS_JOB = 0, 1, 2, 3
UNLOADED = "the model was unloaded"  # what a request that will not run hears once its version is unloaded
MAX_INSTANCES = 16  # the registry's bound on a model's ``instances``; the worker threads are made as needed
Arrays = dict[str, np.ndarray]


@dataclass(order=True)
class _Item:
    order: tuple[int, int, int]  # (class, priority, arrival): the heap's order
    key: tuple[Any, ...] = field(compare=False)
    feeds: Arrays = field(compare=False)
    rows: int = field(compare=False)
    future: asyncio.Future[Arrays] = field(compare=False)
    enqueued: float = field(compare=False)
    enqueued_ns: int = field(compare=False)
    deadline: float | None = field(compare=False)


class _Outcome:
    """A finished run: its result (one outputs dict per request), or the exception it raised."""

    __slots__ = ("error", "result")

    def __init__(self, result: list[Arrays], error: BaseException | None = None) -> None:
        self.result = result
        self.error = error


class _RunThreads:
    """The batcher's worker threads: each takes a run from one queue, runs it, and hands the outcome back.

    ``concurrent.futures.ThreadPoolExecutor`` made a future, a condition and a work item for every
    run, and its thread went on running Python after waking the event loop, which then waited for
    the GIL. Here a thread hands back (the caller's ``then``, one ``call_soon_threadsafe``) as its
    last step and goes straight back to the queue, where it lets the GIL go (measured in the README,
    "Measured"). A thread starts when a run is submitted and every thread started is busy, so there
    are as many as runs ever ran at once. After :meth:`shutdown`, the runs already queued still run,
    and then the threads end.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._work: queue.SimpleQueue[
            tuple[Callable[..., list[Arrays]], tuple[Any, ...], Callable[[_Outcome], None]] | None
        ] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._busy = 0  # runs submitted and not yet handed back
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., list[Arrays]], args: tuple[Any, ...], then: Callable[[_Outcome], None]) -> None:
        """Run ``fn(*args)`` on a worker thread, then call ``then`` with its outcome, on that thread."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the batcher's threads were shut down")
            self._busy += 1
            if self._busy > len(self._threads):
                thread = threading.Thread(target=self._serve, name=f"{self._name}_{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        self._work.put((fn, args, then))

    def _serve(self) -> None:
        work = self._work
        while (job := work.get()) is not None:
            fn, args, then = job
            try:
                outcome = _Outcome(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, as a future would hold it
                outcome = _Outcome([], exc)
            with self._lock:
                self._busy -= 1
            try:
                then(outcome)
            except Exception:  # a broken hand-back must not end the thread that the next runs wait for
                log.exception("handing back a run failed")
            del job, fn, args, then, outcome  # nothing of this run is kept while the thread waits

    def shutdown(self, *, wait: bool = False) -> None:
        """End every thread once the runs already queued are done; ``wait`` for them to end."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._work.put(None)
        if wait:
            for thread in threads:
                thread.join()


def batch_key(feeds: Arrays) -> tuple[Any, ...]:
    """Requests merge only when every input matches beyond the first (batch) dimension."""
    return tuple(sorted((name, a.dtype.str, a.shape[1:]) for name, a in feeds.items()))


def batch_rows(feeds: Arrays) -> int | None:
    """The first dimension every input shares: the request's rows; None when they differ (or one is a scalar).

    Outputs are split back by rows, so a request whose inputs disagree on them is never merged.
    """
    rows = {a.shape[0] if a.ndim else None for a in feeds.values()}
    return rows.pop() if len(rows) == 1 else None


class Batcher:
    def __init__(
        self,
        run: Callable[[Arrays], Arrays],
        *,
        batching: bool,
        max_batch_size: int,
        max_queue_delay_us: int,
        max_queue_size: int,
        instances: int = 1,
        lanes: Sequence[Callable[[Arrays], Arrays]] = (),
        on_batch: Callable[[int, int], None] | None = None,
        on_close: Callable[[], None] | None = None,
        stats: VersionStats | None = None,
    ) -> None:
        self._run = run
        self.batching = batching
        self.instances = 1
        self.lanes: tuple[Callable[[Arrays], Arrays], ...] = ()
        self.configure(
            max_batch_size=max_batch_size,
            max_queue_delay_us=max_queue_delay_us,
            max_queue_size=max_queue_size,
            instances=instances,
            lanes=lanes,
        )
        self._on_batch = on_batch
        self._on_close = on_close
        self._stats = stats
        self._queue: list[_Item] = []
        self._filling: list[_Item] = []  # requests taken from the queue into a batch that is still filling
        self._seq = itertools.count()
        self._arrived = asyncio.Event()
        self._running = 0  # batches in flight, at most ``instances``
        self._busy_lanes: set[int] = set()
        self._alone = False  # a lone batch runs on ``run`` and nothing starts beside it
        self._freed = asyncio.Event()  # a batch finished: the runner may start the next
        self._threads = _RunThreads("ort-run")
        self._runner: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the first request
        self._closed = False

    def configure(
        self,
        *,
        max_batch_size: int,
        max_queue_delay_us: int,
        max_queue_size: int,
        instances: int | None = None,
        lanes: Sequence[Callable[[Arrays], Arrays]] | None = None,
        batching: bool | None = None,
    ) -> None:
        """Take new settings; safe from any thread, since each is one attribute read where it is used.

        ``batching`` None keeps the current choice; a batch already filling finishes as it started.

        ``instances`` None keeps the current number. Fewer take effect as batches in flight finish;
        more, once the batch in flight ends. ``lanes`` None keeps the current ones; given, there must be
        one per instance (or none): a batch in flight keeps the lane it started on.
        """
        if batching is not None:
            self.batching = batching
        self.max_batch_size = max(1, max_batch_size)
        self.max_delay = max_queue_delay_us / 1e6
        self.max_queue_size = max_queue_size
        count = self.instances if instances is None else min(MAX_INSTANCES, max(1, instances))
        if lanes is not None:
            if lanes and len(lanes) != count:
                raise ValueError(f"{len(lanes)} lanes for {count} instances")
            self.lanes = tuple(lanes)
        elif self.lanes and count != len(self.lanes):
            raise ValueError(f"{count} instances need {count} lanes; {len(self.lanes)} are set")
        self.instances = count

    @property
    def queued(self) -> int:
        """Requests waiting: in the queue, and in a batch that is still filling."""
        return len(self._queue) + len(self._filling)

    @property
    def running(self) -> int:
        """Batches on their way: running on a thread, or being gathered to run."""
        return self._running

    @property
    def started(self) -> bool:
        """Whether a request ever came (and so the batcher has a loop to close on)."""
        return self._loop is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def queued_by_class(self) -> dict[str, int]:
        """Requests waiting, counted as :attr:`queued` counts them, by class name; every class is named.

        Safe from another thread (a scrape): the two lists are copied in one step each.
        """
        counts = dict.fromkeys(CLASS_NAMES, 0)
        for item in (*self._queue, *self._filling):
            counts[CLASS_NAMES[item.order[0]]] += 1
        return counts

    def submit(
        self, feeds: Arrays, *, priority: int = 0, timeout_us: int | None = None, klass: int = CLASS_NORMAL
    ) -> asyncio.Future[Arrays]:
        """Queue one request; the future resolves to its outputs. Cancel the future to drop it.

        ``klass`` (one of the ``CLASS_*``) comes before ``priority``: a queued request of a lower class
        never runs while one of a higher class waits.
        """
        if not 0 <= klass < len(CLASS_NAMES):
            raise ValueError(f"unknown priority class {klass}")
        if len(self._queue) + len(self._filling) >= self.max_queue_size:
            # Requests whose clients went away still sit in the heap (or the filling batch); they do not count.
            self._queue = [item for item in self._queue if not item.future.done()]
            heapq.heapify(self._queue)
            filling = sum(1 for item in self._filling if not item.future.done())
            if len(self._queue) + filling >= self.max_queue_size:
                raise Overloaded(f"the queue is full ({self.max_queue_size} requests)")
        if self._closed:
            raise Overloaded(UNLOADED)
        loop = asyncio.get_running_loop()
        now_ns = time.monotonic_ns()
        now = now_ns / 1e9  # the same clock as time.monotonic()
        rows = batch_rows(feeds)
        seq = next(self._seq)
        item = _Item(
            order=(klass, priority or DEFAULT_PRIORITY, seq),
            key=batch_key(feeds) if rows is not None else ("alone", seq),  # a key of its own: never merged
            feeds=feeds,
            rows=1 if rows is None else rows,
            future=loop.create_future(),
            enqueued=now,
            enqueued_ns=now_ns,
            deadline=now + timeout_us / 1e6 if timeout_us else None,
        )
        if self._runner is None or self._runner.done():
            self._loop = loop
            self._runner = loop.create_task(self._run_loop())
        if self._running == 0 and not self._queue and (self.max_delay == 0 or not self.batching):
            # Nothing in flight or waiting, and no delay to wait for company: the runner would make this
            # request a batch of its own on its next turn, so start it now (the lone-request latency).
            self._running += 1
            self._dispatch([item], *self._choose_lane())
            return item.future
        heapq.heappush(self._queue, item)
        self._arrived.set()
        return item.future

    async def _run_loop(self) -> None:
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            while self._alone or self._running >= self.instances:
                self._freed.clear()
                await self._freed.wait()
            self._running += 1
            batch = await self._gather()
            if not batch:
                self._running -= 1
                continue
            self._dispatch(batch, *self._choose_lane())

    def _choose_lane(self) -> tuple[int | None, Callable[[Arrays], Arrays]]:
        """Where the batch just gathered runs: ``run`` alone when nothing else is in flight or waiting, else a lane.

        Without lanes every batch runs on ``run``. Just after the lanes were replaced, a batch in flight
        may still hold an index the new ones need; then this batch shares ``run`` (only until it ends).
        """
        lanes = self.lanes
        if not lanes or (self._running == 1 and not self._queue):
            self._alone = bool(lanes)
            return None, self._run
        free = next((i for i in range(len(lanes)) if i not in self._busy_lanes), None)
        if free is None:
            return None, self._run
        self._busy_lanes.add(free)
        return free, lanes[free]

    def _slot_done(self, lane: int | None) -> None:
        self._running -= 1
        if lane is None:
            self._alone = False
        else:
            self._busy_lanes.discard(lane)
        self._freed.set()

    def _take_live(self) -> _Item | None:
        now = time.monotonic()
        while self._queue:
            item = heapq.heappop(self._queue)
            if item.future.done():  # cancelled: the client went away
                continue
            if item.deadline is not None and now > item.deadline:
                item.future.set_exception(RequestTimeout("the request timed out in the queue before it ran"))
                continue
            return item
        return None

    async def _gather(self) -> list[_Item]:
        head = self._take_live()
        if head is None:
            return []
        if not self.batching:
            return [head]
        self._filling = [head]
        try:
            return await self._fill(self._filling)
        finally:
            self._filling = []

    async def _fill(self, batch: list[_Item]) -> list[_Item]:
        """Add matching requests to ``batch`` until it is full or its first request has waited its delay.

        The queue gives them in order (class, priority, arrival). A job's request joins a batch of online
        ones only as it closes, in the room they left: it never takes the place of one arriving meanwhile.
        """
        head = batch[0]
        rows = head.rows
        close_at = head.enqueued + self.max_delay
        closing = deferred = False
        while rows < self.max_batch_size:
            keep: list[_Item] = []
            while self._queue and rows < self.max_batch_size:
                item = heapq.heappop(self._queue)
                if item.future.done():
                    continue
                waits = item.order[0] == CLASS_JOB and head.order[0] != CLASS_JOB and not closing
                if not waits and item.key == head.key and rows + item.rows <= self.max_batch_size:
                    batch.append(item)
                    rows += item.rows
                else:
                    deferred = deferred or waits
                    keep.append(item)
            for item in keep:
                heapq.heappush(self._queue, item)
            if rows >= self.max_batch_size or closing:
                break
            remaining = close_at - time.monotonic()
            if remaining <= 0:
                if not deferred:
                    break
                closing = True  # one more pass: the job's requests set aside may fill the room left
                continue
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                pass
        return batch

    def _dispatch(self, batch: list[_Item], lane: int | None, run: Callable[[Arrays], Arrays]) -> None:
        """Run ``batch`` on a worker thread; its requests' futures get their outputs when it is done.

        The worker thread hands the finished run straight to the loop (one ``call_soon_threadsafe``),
        without the asyncio future that ``run_in_executor`` would chain to it.
        """
        self._threads.submit(self._run_batch, (batch, run), self._hand_back(self._batch_done, batch, lane, run))

    def _hand_back(self, finish: Callable[..., None], *args: Any) -> Callable[[_Outcome], None]:
        """What a worker thread calls with a run's outcome: ``finish(*args, outcome)``, on the batcher's loop."""
        loop = self._loop
        assert loop is not None
        finish = functools.partial(finish, *args)

        def handed_back(outcome: _Outcome) -> None:
            try:
                loop.call_soon_threadsafe(finish, outcome)
            except RuntimeError:  # the loop closed meanwhile: nobody waits for these requests any more
                pass

        return handed_back

    def _batch_done(
        self,
        batch: list[_Item],
        lane: int | None,
        run: Callable[[Arrays], Arrays],
        done: _Outcome,
    ) -> None:
        error = done.error
        if error is not None and len(batch) > 1:
            # One request's data may have failed the merged run: run each alone so only it fails.
            assert self._loop is not None
            self._loop.create_task(self._execute_each(batch, lane, run))
            return  # the lane is freed when they are done
        # The lane is freed first: the runner, waiting for it, is then the first task to wake, so the next
        # batch is on its way before these requests' answers are encoded (the lane does not idle meanwhile).
        self._slot_done(lane)
        if error is None:
            for item, result in zip(batch, done.result, strict=True):
                if not item.future.done():
                    item.future.set_result(result)
        elif not batch[0].future.done():
            batch[0].future.set_exception(error)

    async def _execute_each(self, batch: list[_Item], lane: int | None, run: Callable[[Arrays], Arrays]) -> None:
        try:
            loop = asyncio.get_running_loop()
            for item in batch:
                if item.future.done():
                    continue
                if self._closed:  # unloaded while the merged run failed: its threads take no more runs
                    item.future.set_exception(Overloaded(UNLOADED))
                    continue
                await self._execute_alone(loop, item, run)
        finally:
            self._slot_done(lane)

    async def _execute_alone(
        self, loop: asyncio.AbstractEventLoop, item: _Item, run: Callable[[Arrays], Arrays]
    ) -> None:
        ran: asyncio.Future[_Outcome] = loop.create_future()

        def settle(outcome: _Outcome) -> None:
            if not ran.done():  # not cancelled with the batcher's task
                ran.set_result(outcome)

        self._threads.submit(self._run_batch, ([item], run), self._hand_back(settle))
        outcome = await ran
        if item.future.done():
            return
        if outcome.error is None:
            item.future.set_result(outcome.result[0])
        else:
            item.future.set_exception(outcome.error)  # this request's own error

    def _run_batch(self, batch: list[_Item], run: Callable[[Arrays], Arrays]) -> list[Arrays]:
        started = time.monotonic_ns()
        if len(batch) == 1:
            item = batch[0]
            rows = item.rows if self.batching else 1  # a model that does not batch counts one per run, as in Triton
            if self._on_batch:
                self._on_batch(1, rows)
            outputs = run(item.feeds)
            if self._stats is not None:
                ran = time.monotonic_ns()
                self._stats.batch_done(rows, 1, started - item.enqueued_ns, 0, ran - started, 0)
            return [outputs]
        names = list(batch[0].feeds)
        merged = {name: np.concatenate([item.feeds[name] for item in batch], axis=0) for name in names}
        merged_at = time.monotonic_ns()
        outputs = run(merged)
        ran = time.monotonic_ns()
        rows = sum(item.rows for item in batch)
        if self._on_batch:
            self._on_batch(len(batch), rows)
        results: list[Arrays] = [{} for _ in batch]
        offsets = np.cumsum([0] + [item.rows for item in batch])
        for name, value in outputs.items():
            if value.ndim == 0 or value.shape[0] != offsets[-1]:
                raise RuntimeError(f"output '{name}' has shape {value.shape}; it cannot be split by batch")
            for index in range(len(batch)):
                results[index][name] = value[offsets[index] : offsets[index + 1]]
        if self._stats is not None:
            queued = sum(started - item.enqueued_ns for item in batch)
            self._stats.batch_done(
                rows, len(batch), queued, merged_at - started, ran - merged_at, time.monotonic_ns() - ran
            )
        return results

    def close(self) -> None:
        """Fail what is still queued and stop; safe from any thread (the work happens on the batcher's loop)."""
        loop = self._loop
        if loop is None or loop.is_closed():  # never used, or its server has stopped: nothing runs on the loop
            self._finish()
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._close_now()
            return
        try:
            loop.call_soon_threadsafe(self._close_now)
        except RuntimeError:  # the loop closed meanwhile
            self._finish()

    def _close_now(self) -> None:
        if self._closed:
            return
        if self._runner is not None:
            self._runner.cancel()
        for item in self._queue:
            if not item.future.done():
                item.future.set_exception(Overloaded(UNLOADED))
        self._finish()

    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.clear()
        self._threads.shutdown()
        if self._on_close is not None:
            self._on_close()
