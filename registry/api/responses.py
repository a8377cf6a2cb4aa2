"""Streamed answers that stay streamed under ASGI: audit exports and artifact downloads.

Django's ASGI handler reads a synchronous streaming response into a list before it sends the first
byte, so a 5 GB download would sit in the server's memory whole. These responses hand the body to
the event loop one chunk at a time instead, each read on the request's thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from typing import cast

from asgiref.sync import sync_to_async
from django.http import FileResponse, StreamingHttpResponse


def _next_or_none(parts: Iterator[bytes]) -> bytes | None:
    return next(parts, None)


async def _chunks(content: Iterable[bytes]) -> AsyncIterator[bytes]:
    parts = iter(content)
    # thread_sensitive (the default) keeps every chunk on the request's thread and its database cursor.
    pull = sync_to_async(_next_or_none)
    while (part := await pull(parts)) is not None:
        yield part


class StreamingExportResponse(StreamingHttpResponse):
    """A generated body (the audit export), one chunk at a time under ASGI too."""

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _chunks(cast(Iterable[bytes], self.streaming_content))


class StreamingFileResponse(FileResponse):
    """A stored file (a model's artifacts), read and sent 1 MiB at a time under ASGI too."""

    block_size = 1 << 20

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _chunks(cast(Iterable[bytes], self.streaming_content))
