"""Django's ASGI handler, except that artifact uploads stream instead of spooling.

Django's own handler reads the whole request body into a temporary file before the view runs,
so a 1 GB upload would land on local disk first. For ``POST /api/v1/models/{name}/versions`` this
handler hands the view a file-like object that pulls body chunks from the ASGI channel as the
multipart parser asks for them, so bytes flow from the client to storage while they arrive.
Other requests keep Django's behaviour, with their size capped before anything is read.
"""

from __future__ import annotations

import asyncio
import io
import re
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler

STREAMED_PATH = re.compile(r"^/api/v1/models/[^/]+/versions/?$")


class _Channel:
    """Wraps the ASGI ``receive`` callable so the body reader and Django's disconnect listener share it."""

    def __init__(self, receive: Any, *, streaming: bool) -> None:
        self._receive = receive
        self.streaming = streaming
        self.body_finished = asyncio.Event()
        if not streaming:
            self.body_finished.set()

    async def __call__(self) -> dict[str, Any]:
        message: dict[str, Any] = await self._receive()
        return message


class StreamingBody(io.RawIOBase):
    """A blocking, forward-only reader over the ASGI body; used from the view's worker thread."""

    def __init__(self, channel: _Channel, loop: asyncio.AbstractEventLoop) -> None:
        self._channel = channel
        self._loop = loop
        self._buffer = bytearray()
        self._done = False

    def readable(self) -> bool:
        return True

    def _finish(self) -> None:
        self._done = True
        self._loop.call_soon_threadsafe(self._channel.body_finished.set)

    def _pull(self) -> None:
        message = asyncio.run_coroutine_threadsafe(self._channel(), self._loop).result()
        if message["type"] == "http.disconnect":
            self._finish()
            raise RequestAborted("the client disconnected during the upload")
        self._buffer += message.get("body", b"")
        if not message.get("more_body", False):
            self._finish()

    def read(self, size: int | None = -1) -> bytes:
        size = -1 if size is None else size
        while not self._done and (size < 0 or len(self._buffer) < size):
            self._pull()
        if size < 0 or size >= len(self._buffer):
            data = bytes(self._buffer)
            self._buffer.clear()
        else:
            data = bytes(self._buffer[:size])
            del self._buffer[:size]
        return data

    def readline(self, size: int | None = -1) -> bytes:
        while not self._done and b"\n" not in self._buffer:
            self._pull()
        end = self._buffer.find(b"\n") + 1 or len(self._buffer)
        if size is not None and 0 <= size < end:
            end = size
        data = bytes(self._buffer[:end])
        del self._buffer[:end]
        return data

    def close(self) -> None:
        if not self._done:
            self._loop.call_soon_threadsafe(self._channel.body_finished.set)
        super().close()


def _content_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class StreamingASGIHandler(ASGIHandler):
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        streaming = scope.get("method") == "POST" and bool(STREAMED_PATH.match(scope.get("path", "")))
        length = _content_length(scope)
        limit = settings.MAX_UPLOAD_BYTES if streaming else settings.MAX_REQUEST_BODY_BYTES
        if length is not None and length > limit:
            await _reply(send, 413, f"the request body is larger than the limit of {limit} bytes")
            return
        await super().__call__(scope, _Channel(receive, streaming=streaming), send)

    async def read_body(self, receive: Any) -> Any:
        if isinstance(receive, _Channel) and receive.streaming:
            return StreamingBody(receive, asyncio.get_running_loop())
        body = await super().read_body(receive)
        if body.seek(0, io.SEEK_END) > settings.MAX_REQUEST_BODY_BYTES:
            body.close()
            raise RequestAborted("request body over the limit")
        body.seek(0)
        return body

    async def listen_for_disconnect(self, receive: Any) -> None:
        if isinstance(receive, _Channel):
            # While the view streams the body, the body's messages are its own.
            await receive.body_finished.wait()
        await super().listen_for_disconnect(receive)


async def _reply(send: Any, status: int, message: str) -> None:
    import json

    body = json.dumps({"error": message, "detail": None}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
