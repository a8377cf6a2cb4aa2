"""Streaming multipart uploads straight into artifact storage.

Django hands each multipart chunk to :class:`ArtifactUploadHandler`, which pushes it through a
bounded pipe to a storage write running in a helper thread. Receiving from the client and
writing to S3 overlap, memory stays bounded by the pipe and boto3's part buffers, and no file is
spooled to disk or held whole in memory.
"""

from __future__ import annotations

import queue
import re
import threading
from typing import Any

from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler

from registry.errors import PayloadTooLarge, StorageDown, UploadRejected
from registry.onnx_sniff import NotOnnx, OnnxSniffer, SniffResult
from storage import StorageError, StorageUnavailable, WriteResult, get_storage

FILE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
PIPE_CHUNK = 1024 * 1024
PIPE_DEPTH = 8  # chunks waiting between the request thread and the storage writer


class _Aborted(Exception):
    pass


class ChunkPipe:
    """A bounded, blocking byte pipe: the request thread writes, the storage writer reads."""

    def __init__(self) -> None:
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=PIPE_DEPTH)
        self._pending = b""
        self._eof = False
        self._aborted = threading.Event()

    def put(self, data: bytes | None) -> None:
        """Queue a chunk (None marks the end), blocking while the writer is behind."""
        while not self._aborted.is_set():
            try:
                self._queue.put(data, timeout=0.5)
                return
            except queue.Full:
                continue
        raise _Aborted

    def close(self) -> None:
        try:
            self.put(None)
        except _Aborted:
            pass  # the writer already failed; its error is reported instead

    def abort(self) -> None:
        self._aborted.set()

    def read(self, n: int = -1) -> bytes:
        parts = [self._pending] if self._pending else []
        have = len(self._pending)
        self._pending = b""
        while not self._eof and (n < 0 or have < n):
            if self._aborted.is_set():
                raise _Aborted("upload aborted")
            try:
                item = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if item is None:
                self._eof = True
                break
            parts.append(item)
            have += len(item)
        if 0 <= n < have:
            # Split only the last piece, so reading a whole S3 part makes one copy of it, not two.
            last = parts[-1]
            cut = len(last) - (have - n)
            parts[-1], self._pending = last[:cut], last[cut:]
        return b"".join(parts)


class StoredUpload(UploadedFile):
    """What ``request.FILES`` holds for a part that went straight to storage."""

    def __init__(self, *, name: str, content_type: str, write: WriteResult, sniff: SniffResult | None) -> None:
        super().__init__(file=None, name=name, content_type=content_type, size=write.size)
        self.storage_key = write.key
        self.sha256 = write.sha256
        self.sniff = sniff

    def close(self) -> None:
        """Nothing to close: the bytes are already in storage."""


class _Writer(threading.Thread):
    def __init__(self, key: str, pipe: ChunkPipe) -> None:
        super().__init__(name=f"upload-{key}", daemon=True)
        self.key = key
        self.pipe = pipe
        self.result: WriteResult | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = get_storage().write(self.key, self.pipe)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - handed back to the request thread
            self.error = exc
            self.pipe.abort()


class ArtifactUploadHandler(FileUploadHandler):
    """Streams every ``file`` part to storage under ``key_prefix``; the first part must be the .onnx."""

    chunk_size = PIPE_CHUNK

    def __init__(self, request: Any, *, key_prefix: str, max_bytes: int) -> None:
        super().__init__(request)
        self.key_prefix = key_prefix
        self.max_bytes = max_bytes
        self.received = 0
        self.written_keys: list[str] = []
        self.seen_names: set[str] = set()
        self._writer: _Writer | None = None
        self._sniffer: OnnxSniffer | None = None

    def new_file(self, field_name: str, file_name: str, content_type: str, *args: Any, **kwargs: Any) -> None:
        super().new_file(field_name, file_name, content_type, *args, **kwargs)
        if field_name != "file":
            raise UploadRejected(f"unexpected file field '{field_name}'; send every file as a 'file' part")
        if not FILE_NAME_PATTERN.match(file_name or ""):
            raise UploadRejected(
                f"invalid file name {file_name!r}: use letters, digits, '.', '_' and '-', starting with a "
                "letter or digit"
            )
        if file_name in self.seen_names:
            raise UploadRejected(f"the file '{file_name}' was sent twice")
        first = not self.seen_names
        if first and not file_name.lower().endswith(".onnx"):
            raise UploadRejected(f"the first file must be the .onnx model, got '{file_name}'")
        self.seen_names.add(file_name)
        self._sniffer = OnnxSniffer() if first else None
        key = f"{self.key_prefix}/{file_name}"
        self._writer = _Writer(key, ChunkPipe())
        self._writer.start()

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        self.received += len(raw_data)
        if self.received > self.max_bytes:
            raise PayloadTooLarge(f"the upload is larger than the limit of {self.max_bytes} bytes")
        if self._sniffer is not None:
            try:
                self._sniffer.feed(raw_data)
            except NotOnnx as exc:
                raise UploadRejected(f"'{self.file_name}': {exc}") from exc
        assert self._writer is not None
        try:
            self._writer.pipe.put(raw_data)
        except _Aborted:
            self._raise_writer_error()
        return None

    def file_complete(self, file_size: int) -> StoredUpload:
        assert self._writer is not None
        writer, self._writer = self._writer, None
        writer.pipe.close()
        writer.join()
        if writer.error is not None or writer.result is None:
            self._writer = writer
            self._raise_writer_error()
        assert writer.result is not None
        self.written_keys.append(writer.key)
        sniff = None
        if self._sniffer is not None:
            try:
                sniff = self._sniffer.finish()
            except NotOnnx as exc:
                raise UploadRejected(f"'{self.file_name}': {exc}") from exc
        return StoredUpload(
            name=self.file_name or "", content_type=self.content_type or "", write=writer.result, sniff=sniff
        )

    def _raise_writer_error(self) -> None:
        assert self._writer is not None
        self._writer.join(timeout=30)
        error = self._writer.error
        if isinstance(error, StorageUnavailable):
            # The same wording as any other StorageError that reaches the API (registry/api/errors.py).
            raise StorageDown(f"artifact storage is unavailable: {error}") from error
        if isinstance(error, StorageError):
            raise StorageDown(f"artifact storage refused the write: {error}") from error
        raise StorageDown(f"artifact storage failed: {error}") from error

    def abort(self) -> None:
        """Stop an unfinished write; called when the request fails for any reason."""
        if self._writer is not None:
            self._writer.pipe.abort()
            self._writer.join(timeout=30)
            self._writer = None

    def upload_interrupted(self) -> None:
        self.abort()
