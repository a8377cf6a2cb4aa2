"""The chunks of asynchronous inference jobs an inference process takes, run through the batcher last.

An inference job (``registry/jobs/``) is cut into chunks of rows, each stored as an input object. On
its reconcile loop's beat each inference process takes the oldest chunk of a version it has loaded
(``registry.serving.job_chunk_claim``: a conditional update, so a chunk is taken once across the
fleet), one at a time, on a thread of its own. It reads the chunk from the store, runs it in slices
of at most the model's ``max_batch_size`` rows through the version's batcher in the ``job`` class, on
the server's event loop, and writes the chunk's output back to the store before it reports the chunk
done (``job_chunk_done``). Being last in the batcher's order, a slice runs only when no online request
waits, and an online request waits at most for the one slice running; so slices are kept small.

While it runs, the chunk's lease is renewed (``job_chunk_progress``) at least every second; when that
answers False (the job was cancelled or failed, or the chunk was taken back after a lapsed lease) the
chunk is dropped where it stands. A process that dies loses only its chunk: the lease lapses and
another process takes it again (``attempt`` > 1). The version is held (``LoadedVersion.acquire``) while
a chunk runs on it, so a promotion drains it only afterwards; the registry keeps every version with a
queued or running job in the desired state, so every process keeps it loaded.

Formats (the contract of ``registry/jobs/chunks.py``): ``npz`` and ``text`` chunks are an ``.npz``
(one array per model input, or ``text``) and give an ``.npz`` of the outputs; ``jsonl`` chunks are v2
request bodies, one a line, and give one v2 response a line, the body ``/v2`` answers; ``v2`` (a
single request of ``infer-async``) is one v2 body and gives that response.
"""

from __future__ import annotations

import asyncio
import io
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
from django.conf import settings
from django.db import DatabaseError, connection

from inference import metrics
from inference.batcher import CLASS_JOB, UNLOADED, batch_rows
from inference.classification import classify
from inference.errors import (
    DeviceFailed,
    InferenceError,
    InvalidInput,
    OutOfMemory,
    Overloaded,
    http_status,
    run_failure,
)
from inference.loaded import LoadedVersion, NotLoaded
from inference.protocol import InferRequest, decode_request, encode_response
from inference.text import TEXT_INPUT, Encoded, TextEncoder
from registry import serving
from storage import ObjectExists, ObjectNotFound, StorageError, get_storage

__all__ = ["ChunkFailed", "JobRunner"]

logger = logging.getLogger(__name__)

OUT_OF_MEMORY = "the inference process had not enough memory for this chunk"
RENEW_SECONDS = 1.0  # the most time between lease renewals (less when the lease is shorter): how soon a cancel stops
WAIT_STEP = 0.25  # how often a wait for the loop looks at the stop and the lease
BUSY_PAUSE = 0.1  # a full queue: the slice waits this long before it is offered again


class ChunkFailed(Exception):
    """The chunk cannot be finished here: ``retry`` hands it back to be taken again; else its job fails."""

    def __init__(self, message: str, *, retry: bool, status: int = 500) -> None:
        super().__init__(message)
        self.message = message
        self.retry = retry
        self.status = status


class Dropped(Exception):
    """The chunk is no longer this process's to finish: its job was cancelled or failed, or its lease lapsed."""


class Stopping(Exception):
    """The process is stopping: the chunk is handed back for another process to take."""


class JobRunner:
    """Takes and runs the chunks of jobs for the versions loaded here, one at a time, off the reconcile thread.

    ``versions`` gives the versions loaded now (by version id) and ``loop`` the server's running event
    loop, where every batcher lives; without a loop (a runtime no server started) nothing is taken.
    """

    def __init__(
        self,
        *,
        worker_id: str,
        versions: Callable[[], Mapping[int, LoadedVersion]],
        loop: Callable[[], asyncio.AbstractEventLoop | None],
    ) -> None:
        self._worker_id = worker_id
        self._versions = versions
        self._loop = loop
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def poll(self) -> None:
        """Take the next chunk of a loaded version, on the caller's thread, and run it (and the ones after) on another.

        The reconcile pass calls this: the claim is one query on its own database connection, so an idle
        process opens no connection and starts no thread for it. A busy runner is left alone.
        """
        with self._lock:
            if self.busy or self._stop.is_set():
                return
            version_ids = self._claimable()
            if not version_ids or self._running_loop() is None:
                return
            try:
                chunk = serving.job_chunk_claim(worker_id=self._worker_id, version_ids=version_ids)
            except DatabaseError as exc:
                logger.warning("inference job poll failed: %s", exc)
                return
            if chunk is None:
                return
            self._thread = threading.Thread(target=self._run_all, args=(chunk,), name="modelyard-jobs", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the slice running now; the chunk is handed back to be taken again."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _claimable(self) -> list[int]:
        return [vid for vid, loaded in list(self._versions().items()) if not loaded.closed]

    def _running_loop(self) -> asyncio.AbstractEventLoop | None:
        loop = self._loop()
        return loop if loop is not None and loop.is_running() else None

    def _run_all(self, first: serving.JobChunk) -> None:
        try:
            loop = self._running_loop()
            if loop is None:  # the server stopped meanwhile: the chunk goes back
                self._failed(first, ChunkFailed("the inference process stopped before it ran the chunk", retry=True))
                return
            self._run(first, loop)
            while not self._stop.is_set() and self.run_next():
                pass
        except DatabaseError as exc:
            logger.warning("inference job poll failed: %s", exc)
        except Exception:
            logger.exception("inference job runner failed")
        finally:
            connection.close()

    def run_next(self) -> bool:
        """Take and run one chunk on this thread; False when none was waiting for a version loaded here."""
        version_ids = self._claimable()
        loop = self._running_loop()
        if not version_ids or loop is None:
            return False
        chunk = serving.job_chunk_claim(worker_id=self._worker_id, version_ids=version_ids)
        if chunk is None:
            return False
        self._run(chunk, loop)
        return True

    def _run(self, chunk: serving.JobChunk, loop: asyncio.AbstractEventLoop) -> None:
        if chunk.attempt > 1:
            metrics.job_chunk_retry(chunk.model)
        rows = chunk.stop - chunk.start
        try:
            payload = self._compute(chunk, loop)
            _write(chunk.output_key, payload)
        except Dropped:
            logger.info("chunk %s of job %s dropped: the job no longer wants it", chunk.chunk_id, chunk.job_id)
            return
        except Stopping:
            self._failed(chunk, ChunkFailed("the inference process stopped while it ran the chunk", retry=True))
            return
        except ChunkFailed as failure:
            self._failed(chunk, failure)
            return
        serving.job_chunk_done(chunk.chunk_id, worker_id=self._worker_id, rows=rows)
        metrics.job_rows(chunk.model, rows)
        logger.debug(
            "ran chunk %s of job %s (%d rows of %s v%s)", chunk.chunk_id, chunk.job_id, rows, chunk.model, chunk.version
        )

    def _failed(self, chunk: serving.JobChunk, failure: ChunkFailed) -> None:
        logger.warning(
            "chunk %s of job %s failed (%s): %s",
            chunk.chunk_id,
            chunk.job_id,
            "handed back" if failure.retry else "the job fails",
            failure.message,
        )
        serving.job_chunk_failed(
            chunk.chunk_id, worker_id=self._worker_id, error=failure.message, retry=failure.retry, status=failure.status
        )

    def _compute(self, chunk: serving.JobChunk, loop: asyncio.AbstractEventLoop) -> bytes:
        loaded = self._versions().get(chunk.version_id)
        if loaded is None:
            raise ChunkFailed(f"{chunk.model} v{chunk.version} is not loaded in this process", retry=True)
        try:
            loaded.acquire()  # held until the chunk is done: a promotion drains the version only afterwards
        except NotLoaded as exc:
            raise ChunkFailed(str(exc), retry=True) from None
        try:
            data = _read(chunk.input_key)
            return ChunkRun(chunk, loaded, loop, renew=self._renewer(chunk)).output(data)
        finally:
            loaded.release()

    def _renewer(self, chunk: serving.JobChunk) -> Callable[[], None]:
        """Renew the chunk's lease when it is due; raise when the chunk is to stop (a cancel, this process's stop)."""
        every = min(RENEW_SECONDS, max(chunk.lease_seconds, 0.1) / 4)
        renewed = time.monotonic()

        def renew() -> None:
            nonlocal renewed
            if self._stop.is_set():
                raise Stopping
            if time.monotonic() - renewed < every:
                return
            if not serving.job_chunk_progress(chunk.chunk_id, worker_id=self._worker_id):
                raise Dropped
            renewed = time.monotonic()

        return renew


class ChunkRun:
    """One chunk computed on one loaded version: its input bytes in, its output bytes out."""

    def __init__(
        self,
        chunk: serving.JobChunk,
        loaded: LoadedVersion,
        loop: asyncio.AbstractEventLoop,
        *,
        renew: Callable[[], None],
    ) -> None:
        self.chunk = chunk
        self.loaded = loaded
        self.loop = loop
        self.renew = renew  # between slices and while one waits: raises Dropped or Stopping when the chunk is to stop
        priority = chunk.parameters.get("priority", 0) if chunk.parameters else 0
        self.priority = priority if isinstance(priority, int) and not isinstance(priority, bool) else 0

    @property
    def rows(self) -> int:
        return self.chunk.stop - self.chunk.start

    def step(self) -> int:
        """Rows per slice: the model's largest batch (read each time, as it may change), or fewer when
        ``MODELYARD_INFERENCE_JOB_SLICE_ROWS`` says so; 1 without batching."""
        if not self.loaded.batching:
            return 1
        largest = max(1, self.loaded.batcher.max_batch_size)
        return min(largest, settings.INFERENCE_JOB_SLICE_ROWS or largest)

    def output(self, data: bytes) -> bytes:
        fmt = self.chunk.format
        if fmt == "npz":
            return _npz_bytes(self._tensors(_load_npz(data)))
        if fmt == "text":
            return _npz_bytes(self._texts(_load_npz(data)))
        if fmt == "jsonl":
            return self._lines(data)
        if fmt == "v2":
            return self._request(data)
        raise ChunkFailed(f"unknown chunk format {fmt!r}", retry=False, status=400)

    # --- npz: one array per input -------------------------------------------------------------------

    def _wanted(self) -> list[str]:
        names = self.loaded.output_names
        wanted = list(self.chunk.outputs) or names
        unknown = [name for name in wanted if name not in names]
        if unknown:
            raise ChunkFailed(
                f"unknown output(s) {', '.join(unknown)}; the model gives {', '.join(names)}", retry=False, status=400
            )
        return wanted

    def _check_rows(self, arrays: Mapping[str, np.ndarray]) -> None:
        for name, array in arrays.items():
            if array.ndim == 0 or array.shape[0] != self.rows:
                raise ChunkFailed(
                    f"array '{name}' of the chunk has shape {list(array.shape)}; its first dimension must be the "
                    f"chunk's {self.rows} rows",
                    retry=False,
                    status=400,
                )

    def _tensors(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        expected = [spec["name"] for spec in self.loaded.spec.signature.get("inputs", [])]
        missing = sorted(set(expected) - arrays.keys())
        extra = sorted(arrays.keys() - set(expected))
        if missing or extra:
            what = "; ".join(
                part
                for part in (
                    f"missing input(s) {', '.join(missing)}" if missing else "",
                    f"unknown input(s) {', '.join(extra)}" if extra else "",
                )
                if part
            )
            raise ChunkFailed(f"{what}; the model takes {', '.join(expected)}", retry=False, status=400)
        self._check_rows(arrays)
        wanted = self._wanted()
        parts: dict[str, list[np.ndarray]] = {name: [] for name in wanted}
        start = 0
        while start < self.rows:
            stop = min(self.rows, start + self.step())
            where = f"rows [{self.chunk.start + start}, {self.chunk.start + stop})"
            values = self._run_one({name: array[start:stop] for name, array in arrays.items()}, where)
            for name in wanted:
                parts[name].append(values[name])
            start = stop
        return {name: _concat(pieces) for name, pieces in parts.items()}

    # --- text: one text per row ------------------------------------------------------------------------

    def _texts(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        encoder = self.loaded.text
        if encoder is None:
            raise ChunkFailed(
                f"model '{self.chunk.model}' version {self.chunk.version} takes no text", retry=False, status=400
            )
        texts = arrays.get(TEXT_INPUT)
        if texts is None or len(arrays) != 1:
            raise ChunkFailed(
                f"a text chunk holds one array named '{TEXT_INPUT}', got {', '.join(arrays) or 'none'}",
                retry=False,
                status=400,
            )
        self._check_rows(arrays)
        texts = texts.reshape(self.rows)
        # Slices of texts of like length (by characters, a cheap stand-in for tokens), each padded to its
        # own longest text: a job's slice merges with nothing, so a bucket would only add padding to compute.
        # The outputs are put back in the chunk's order at the end.
        order = np.argsort(np.char.str_len(texts.astype(str)), kind="stable")
        wanted = self._wanted()
        parts: dict[str, list[np.ndarray]] = {name: [] for name in wanted}
        start = 0
        while start < self.rows:
            stop = min(self.rows, start + min(self.step(), encoder.max_texts))
            rows = order[start:stop]
            encoded = self._encode_rows(encoder, texts[rows], rows)
            where = f"{stop - start} rows of [{self.chunk.start}, {self.chunk.stop})"
            values = encoder.unpad(self._run_one(encoded.feeds, where), encoded)
            for name in wanted:
                parts[name].append(values[name])
            start = stop
        back = np.argsort(order, kind="stable")  # sorted position -> the chunk's row
        return {
            name: _concat(pieces, pad_axis=name in encoder.sequence_outputs)[back] for name, pieces in parts.items()
        }

    def _encode_rows(self, encoder: TextEncoder, texts: np.ndarray, rows: np.ndarray) -> Encoded:
        """One slice's texts tokenised tightly; a text that cannot be served fails the job naming its row."""
        try:
            return encoder.encode(texts, tight=True)
        except InvalidInput as exc:
            for text, row in zip(texts, rows, strict=True):
                self._encode(encoder, np.array([text]), f"row {self.chunk.start + int(row)}")
            raise ChunkFailed(
                f"rows [{self.chunk.start}, {self.chunk.stop}): {exc.message}", retry=False, status=400
            ) from None

    @staticmethod
    def _encode(encoder: TextEncoder, texts: np.ndarray, where: str) -> Encoded:
        try:
            return encoder.encode(texts)
        except InvalidInput as exc:
            raise ChunkFailed(f"{where}: {exc.message}", retry=False, status=400) from None

    # --- jsonl and v2: v2 request bodies ----------------------------------------------------------------

    def _lines(self, data: bytes) -> bytes:
        # As the registry split them: on "\n" only, a last line end starting no line, a "\r" before it dropped.
        lines = [line.removesuffix(b"\r") for line in data.split(b"\n")]
        if lines and not lines[-1]:
            lines.pop()
        if len(lines) != self.rows:
            raise ChunkFailed(f"the chunk has {len(lines)} lines; it should have {self.rows}", retry=False, status=400)
        first = self.chunk.start + 1  # the line number in the job's input, for messages
        requests = [self._decode(line, f"line {first + index}") for index, line in enumerate(lines)]
        answers: list[bytes] = []
        group: list[tuple[int, InferRequest]] = []
        rows = 0
        for index, request in enumerate(requests):
            count = batch_rows(request.inputs) or 1
            if group and rows + count > self.step():
                answers += self._run_requests(group, first)
                group, rows = [], 0
            group.append((index, request))
            rows += count
        if group:
            answers += self._run_requests(group, first)
        return b"".join(answer + b"\n" for answer in answers)

    def _request(self, data: bytes) -> bytes:
        request = self._decode(data, "the request", bare=True)
        [answer] = self._run_requests([(0, request)], 0, bare=True)
        return answer

    def _decode(self, body: bytes, where: str, *, bare: bool = False) -> InferRequest:
        spec = self.loaded.spec
        try:
            request = decode_request(body, None, spec.signature, model=spec.model)
        except InferenceError as exc:
            raise self._refused(exc, where, bare=bare) from None
        request.binary_outputs = set()  # a JSON line (and the stored answer) holds JSON only
        return request

    def _refused(self, exc: InferenceError, where: str, *, bare: bool = False) -> ChunkFailed:
        status, retry = http_status(exc)
        retry = retry or isinstance(exc, DeviceFailed)
        return ChunkFailed(exc.message if bare else f"{where}: {exc.message}", retry=retry, status=status)

    def _run_requests(
        self, group: Sequence[tuple[int, InferRequest]], first: int, *, bare: bool = False
    ) -> list[bytes]:
        """Run the requests of ``group`` side by side (the batcher may merge them); their encoded answers."""
        loaded = self.loaded
        encoded: list[Encoded | None] = []
        feeds: list[dict[str, np.ndarray]] = []
        for index, request in group:
            text = request.inputs.get(TEXT_INPUT) if "text" in request.signature else None
            if text is None:
                encoded.append(None)
                feeds.append(request.inputs)
                continue
            if loaded.text is None:
                raise ChunkFailed(
                    f"model '{self.chunk.model}' version {self.chunk.version} takes no text", retry=False, status=400
                )
            try:
                done = loaded.text.encode(text)
            except InvalidInput as exc:
                raise self._refused(exc, f"line {first + index}", bare=bare) from None
            encoded.append(done)
            feeds.append(done.feeds)
        where = "the request" if bare else f"lines {first + group[0][0]}-{first + group[-1][0]}"
        results = self._run_many(feeds, where, bare=bare)
        answers = []
        for (_, request), values, tokens in zip(group, results, encoded, strict=True):
            if tokens is not None and loaded.text is not None:
                values = loaded.text.unpad(values, tokens)
            for name, count in request.classification.items():
                values[name] = classify(values[name], count, loaded.labels, batched=loaded.batching)
            body, _headers = encode_response(
                model=loaded.spec.model, version=loaded.version_label, request=request, values=values
            )
            answers.append(body)
        return answers

    # --- the batcher, on the server's loop ---------------------------------------------------------------

    def _run_one(self, feeds: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
        return self._run_many([feeds], where)[0]

    def _run_many(
        self, feeds: list[dict[str, np.ndarray]], where: str, *, bare: bool = False
    ) -> list[dict[str, np.ndarray]]:
        """Each of ``feeds`` through the version's batcher in the job class; a full queue is waited out."""
        while True:
            self.renew()
            try:
                return self._on_loop(_submit_all(self.loaded, feeds, self.priority))
            except Overloaded as exc:
                if UNLOADED in exc.message:
                    raise ChunkFailed(f"{self.chunk.model} v{self.chunk.version} was unloaded", retry=True) from None
                time.sleep(BUSY_PAUSE)  # the queue is full of online requests: they go first anyway
            except InferenceError as exc:
                raise self._refused(exc, where, bare=bare) from None
            except (Dropped, Stopping):
                raise
            except Exception as exc:  # ONNX Runtime failed: the input, the memory or the device
                failure = run_failure(exc, OUT_OF_MEMORY)
                retry = isinstance(failure, OutOfMemory | DeviceFailed)
                message = failure.message if bare else f"{where}: {failure.message}"
                raise ChunkFailed(message, retry=retry, status=http_status(failure)[0]) from exc

    def _on_loop(self, work: Coroutine[Any, Any, list[dict[str, np.ndarray]]]) -> list[dict[str, np.ndarray]]:
        """Run ``work`` on the server's loop and wait for it, renewing the lease meanwhile (it may wait long)."""
        try:
            future: Future[list[dict[str, np.ndarray]]] = asyncio.run_coroutine_threadsafe(work, self.loop)
        except RuntimeError:  # the loop closed: the server is stopping
            work.close()
            raise Stopping from None
        while True:
            try:
                return future.result(timeout=WAIT_STEP)
            except TimeoutError:
                pass
            try:
                self.renew()
            except (Dropped, Stopping):
                future.cancel()  # the batcher drops what has not run yet
                raise


async def _submit_all(
    loaded: LoadedVersion, feeds: list[dict[str, np.ndarray]], priority: int
) -> list[dict[str, np.ndarray]]:
    futures = [loaded.batcher.submit(one, priority=priority, klass=CLASS_JOB) for one in feeds]
    loaded.metrics.queue_depth(loaded.batcher.queued)
    try:
        return list(await asyncio.gather(*futures))
    except BaseException:
        for future in futures:
            future.cancel()
        raise


# --- The store ------------------------------------------------------------------------------------------


def _read(key: str) -> bytes:
    try:
        stream = get_storage().open(key)
        try:
            return stream.read()
        finally:
            stream.close()
    except ObjectNotFound:
        raise ChunkFailed(f"the chunk's input {key} is missing from the store", retry=False) from None
    except (StorageError, OSError) as exc:
        raise ChunkFailed(f"could not read the chunk's input {key}: {exc}", retry=True) from None


def _write(key: str, payload: bytes) -> None:
    storage = get_storage()
    try:
        try:
            storage.write(key, io.BytesIO(payload))
        except ObjectExists:  # an earlier attempt at this chunk wrote it before it was lost: the same rows, again
            storage.delete(key)
            storage.write(key, io.BytesIO(payload))
    except (StorageError, OSError) as exc:
        raise ChunkFailed(f"could not write the chunk's output {key}: {exc}", retry=True) from None


# --- npz ------------------------------------------------------------------------------------------------


def _load_npz(data: bytes) -> dict[str, np.ndarray]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (ValueError, OSError, EOFError) as exc:
        raise ChunkFailed(f"the chunk's input is not a readable .npz: {exc}", retry=False, status=400) from None


def _npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    out = io.BytesIO()
    savez: Any = np.savez  # numpy's stubs take the keywords for its own options
    savez(out, **{name: _storable(array) for name, array in arrays.items()})
    return out.getvalue()


def _storable(array: np.ndarray) -> np.ndarray:
    """Strings (BYTES outputs, classification) as numpy unicode: an object array cannot be read without pickle."""
    if array.dtype == object:
        return np.array(
            [str(v.decode("utf-8", "replace") if isinstance(v, bytes) else v) for v in array.reshape(-1)], dtype=str
        ).reshape(array.shape)
    return array


def _concat(pieces: list[np.ndarray], *, pad_axis: bool = False) -> np.ndarray:
    """The slices' rows in order; ``pad_axis``: a sequence output, padded with zeros to the chunk's longest text."""
    if pad_axis and len({piece.shape[1:] for piece in pieces}) > 1 and all(piece.ndim >= 2 for piece in pieces):
        longest = max(piece.shape[1] for piece in pieces)
        pieces = [
            np.pad(piece, [(0, 0), (0, longest - piece.shape[1])] + [(0, 0)] * (piece.ndim - 2)) for piece in pieces
        ]
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=0)
