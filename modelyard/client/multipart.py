"""A multipart/form-data body that streams files from disk, with its length known up front.

``requests`` would read a file part whole into memory to build a form; a model can be gigabytes.
This body is a readable object whose length is computed from the files' sizes, so it goes out
with a ``Content-Length`` (the server refuses an over-large upload from that header alone) and
is read one block at a time as the socket takes it, each file opened only when its turn comes.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

Progress = Callable[[int, int], None]  # (file bytes sent, file bytes in all): the form around them is not counted


def _quoted(text: str) -> str:
    """A header parameter value: no line breaks, quotes escaped."""
    return text.replace("\r", " ").replace("\n", " ").replace("\\", "\\\\").replace('"', '\\"')


class MultipartBody:
    """``fields`` first (text), then ``files`` (each as one part named ``file_field``), in order.

    A file is a path, read when its turn comes, or bytes already in memory (a signature bundle, which
    ``progress`` does not count: it is made here, not what is being uploaded).

    ``progress`` counts the files' own bytes, as a person reads "290 B of 290 B": the part headers,
    boundaries and text fields go out too, but are not what they are uploading.
    """

    def __init__(
        self,
        fields: Sequence[tuple[str, str]],
        files: Sequence[tuple[str, Path | bytes]],
        *,
        file_field: str = "file",
        progress: Progress | None = None,
    ) -> None:
        self.boundary = f"modelyard-{secrets.token_hex(16)}"
        self.content_type = f"multipart/form-data; boundary={self.boundary}"
        self._progress = progress
        # Each segment is bytes, or a path whose bytes are read when its turn comes.
        self._segments: list[bytes | Path] = []
        for name, value in fields:
            head = f'--{self.boundary}\r\nContent-Disposition: form-data; name="{_quoted(name)}"\r\n\r\n'
            self._segments.append(head.encode() + value.encode() + b"\r\n")
        for file_name, path in files:
            head = (
                f"--{self.boundary}\r\n"
                f'Content-Disposition: form-data; name="{_quoted(file_field)}"; filename="{_quoted(file_name)}"\r\n'
                "Content-Type: application/octet-stream\r\n\r\n"
            )
            self._segments += [head.encode(), path, b"\r\n"]
        self._segments.append(f"--{self.boundary}--\r\n".encode())
        self._sizes = [len(s) if isinstance(s, bytes) else s.stat().st_size for s in self._segments]
        self._length = sum(self._sizes)
        self.file_bytes = sum(
            size for segment, size in zip(self._segments, self._sizes, strict=True) if isinstance(segment, Path)
        )
        self._chunks = self._iterate()
        self._chunk = b""
        self._chunk_is_file = False
        self._offset = 0
        self.sent = 0  # of the whole body
        self.file_sent = 0

    def __len__(self) -> int:
        return self._length

    def _iterate(self) -> Iterator[tuple[bytes, bool]]:
        """Each block of the body, and whether it is a file's bytes."""
        for segment, size in zip(self._segments, self._sizes, strict=True):
            if isinstance(segment, bytes):
                yield segment, False
                continue
            read = 0
            with segment.open("rb") as stream:
                while read < size and (block := stream.read(min(1 << 20, size - read))):
                    read += len(block)
                    yield block, True
            if read != size:  # the Content-Length already sent would be wrong
                raise OSError(f"{segment} changed while it was being uploaded ({size} bytes, then {read})")

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (the socket's block size): the rest of the current block at most; b"" at the end."""
        if self._offset >= len(self._chunk):
            (self._chunk, self._chunk_is_file), self._offset = next(self._chunks, (b"", False)), 0
            if not self._chunk:
                return b""
        end = len(self._chunk) if size is None or size < 0 else self._offset + size
        data = self._chunk[self._offset : end]
        self._offset += len(data)
        self.sent += len(data)
        if self._chunk_is_file:
            self.file_sent += len(data)
            if self._progress is not None:
                self._progress(self.file_sent, self.file_bytes)
        return data
