"""Django's ASGI handler, except that artifact uploads stream and every body is bounded while it arrives.

Django's own handler reads the whole request body into a temporary file before the view runs,
so a 1 GB upload would land on local disk first. For ``POST /api/v1/models/{name}/versions`` and the
web UI's ``POST /ui/models/{name}/upload`` (and an inference job's input: ``POST /api/v1/inference-jobs``,
the web UI's ``POST /ui/jobs/new``) this handler hands the view a file-like object that pulls
body chunks from the ASGI channel as the multipart parser asks for them, so bytes flow from the
client to storage while they arrive.

Every body, chunked or not, is counted as it arrives: other requests are refused with 413 as soon
as they pass ``MAX_REQUEST_BODY_BYTES``, before Django (and so authentication) runs, and uploads
as soon as they pass ``MAX_UPLOAD_BYTES``. A client that sends nothing for
``BODY_IDLE_TIMEOUT_SECONDS`` gets 408 and frees the thread it held, and one that disconnects
mid-body is one INFO line.
"""

from __future__ import annotations

import asyncio
import io
import logging
import re
import tempfile
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, ASGIRequest
from django.http.response import HttpResponseBase

from modelyard.error_body import error_body_bytes

logger = logging.getLogger(__name__)

# The API's upload and the web UI's upload page, both fed to registry.uploads.version_upload as they arrive,
# and an inference job's input (the API's and the web UI's submission), fed to the job service likewise.
STREAMED_PATH = re.compile(
    r"^(/api/v1/models/[^/]+/versions|/ui/models/[^/]+/upload|/api/v1/inference-jobs|/ui/jobs/new)/?$"
)


class BodyTooLarge(Exception):
    """The body passed its size limit while it arrived."""

    def __init__(self, message: str, *, limit: int, setting: str) -> None:
        super().__init__(message)
        self.limit = limit
        self.setting = setting


class BodyIdleTimeout(Exception):
    """The client sent no body bytes for ``BODY_IDLE_TIMEOUT_SECONDS``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no request body bytes arrived for {seconds:g} s (MODELYARD_BODY_IDLE_TIMEOUT_SECONDS)")
        self.seconds = seconds


class _Channel:
    """Wraps the ASGI ``receive`` callable so the body reader and Django's disconnect listener share it."""

    def __init__(self, receive: Any, *, streaming: bool, path: str) -> None:
        self._receive = receive
        self.streaming = streaming
        self.path = path
        self.body_finished = asyncio.Event()
        self.body_complete = not streaming  # the last body message was read (not merely given up on)
        if not streaming:
            self.body_finished.set()

    async def __call__(self) -> dict[str, Any]:
        message: dict[str, Any] = await self._receive()
        return message

    async def receive_body(self) -> dict[str, Any]:
        """The next body message, or :class:`BodyIdleTimeout` when the client stays silent too long.

        A timer, not ``wait_for``, which made a task for each of uvicorn's messages (64 KiB or so): 17-21 us
        of CPU a message on a 2-core EPYC, against 7 us.
        """
        idle = settings.BODY_IDLE_TIMEOUT_SECONDS
        try:
            async with asyncio.timeout(idle):
                message: dict[str, Any] = await self._receive()
                return message
        except TimeoutError:
            logger.info("%s: the client sent no body bytes for %g s; request ended", self.path, idle)
            raise BodyIdleTimeout(idle) from None

    def disconnected(self, received: int) -> RequestAborted:
        logger.info("%s: the client disconnected after %d body bytes", self.path, received)
        return RequestAborted("the client disconnected during the request body")


def _upload_too_large() -> BodyTooLarge:
    limit = settings.MAX_UPLOAD_BYTES
    return BodyTooLarge(
        f"the upload is larger than the limit of {limit} bytes", limit=limit, setting="MODELYARD_MAX_UPLOAD_BYTES"
    )


class StreamingBody(io.RawIOBase):
    """A blocking, forward-only reader over the ASGI body; used from the view's worker thread.

    A read hands over to the event loop once: :meth:`_fill` receives there as many body messages as
    the read wants (uvicorn's carry about 64 KiB each), so a 1 MiB read of Django's multipart parser
    costs one hand-over between the threads, not sixteen.
    """

    def __init__(self, channel: _Channel, loop: asyncio.AbstractEventLoop) -> None:
        self._channel = channel
        self._loop = loop
        self._buffer = bytearray()
        self._done = False
        self.received = 0

    def readable(self) -> bool:
        return True

    async def _fill(self, want: int) -> None:
        """On the event loop: receive until the buffer holds ``want`` bytes (all of the body if negative).

        The reading thread waits for this to return, so the buffer and the count have one user at a time.
        """
        channel, limit = self._channel, settings.MAX_UPLOAD_BYTES
        try:
            while not self._done and (want < 0 or len(self._buffer) < want):
                message = await channel.receive_body()  # BodyIdleTimeout when the client stays silent
                if message["type"] == "http.disconnect":
                    raise channel.disconnected(self.received)
                chunk = message.get("body", b"")
                self.received += len(chunk)
                if self.received > limit:
                    raise _upload_too_large()
                self._buffer += chunk
                if not message.get("more_body", False):
                    channel.body_complete = True
                    self._done = True
                    channel.body_finished.set()
        except BaseException:  # a silent or departed client, a body too large: nothing more is read
            self._done = True
            self._channel.body_finished.set()
            raise

    def _pull(self, want: int) -> None:
        if not self._done and (want < 0 or len(self._buffer) < want):
            asyncio.run_coroutine_threadsafe(self._fill(want), self._loop).result()

    def _take(self, size: int) -> bytes:
        """The buffer's first ``size`` bytes, copied once."""
        if size >= len(self._buffer):
            data = bytes(self._buffer)
            self._buffer.clear()
            return data
        with memoryview(self._buffer) as view:
            data = view[:size].tobytes()
        del self._buffer[:size]
        return data

    def read(self, size: int | None = -1) -> bytes:
        size = -1 if size is None else size
        self._pull(size)
        return self._take(len(self._buffer) if size < 0 else size)

    def readline(self, size: int | None = -1) -> bytes:
        while not self._done and b"\n" not in self._buffer:
            self._pull(len(self._buffer) + 1)
        end = self._buffer.find(b"\n") + 1 or len(self._buffer)
        if size is not None and 0 <= size < end:
            end = size
        return self._take(end)

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
        try:
            await super().__call__(scope, _Channel(receive, streaming=streaming, path=scope.get("path", "")), send)
        except BodyTooLarge as exc:  # raised by read_body, before Django made a request of it
            await _reply(send, 413, str(exc))
        except BodyIdleTimeout as exc:
            await _reply(send, 408, str(exc))

    async def read_body(self, receive: Any) -> Any:
        if isinstance(receive, _Channel) and receive.streaming:
            return StreamingBody(receive, asyncio.get_running_loop())
        limit = settings.MAX_REQUEST_BODY_BYTES
        # Django's own read_body, with a running total: nothing past the limit is received or spooled.
        body = tempfile.SpooledTemporaryFile(max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE, mode="w+b")  # noqa: SIM115 - Django closes it
        received = 0
        try:
            while True:
                message = await receive.receive_body() if isinstance(receive, _Channel) else await receive()
                if message["type"] == "http.disconnect":
                    raise receive.disconnected(received) if isinstance(receive, _Channel) else RequestAborted()
                chunk = message.get("body", b"")
                received += len(chunk)
                if received > limit:
                    raise BodyTooLarge(
                        f"the request body is larger than the limit of {limit} bytes",
                        limit=limit,
                        setting="MODELYARD_MAX_REQUEST_BODY_BYTES",
                    )
                body.write(chunk)
                if not message.get("more_body", False):
                    break
        except BaseException:
            body.close()
            raise
        body.seek(0)
        return body

    def create_request(
        self, scope: Mapping[str, Any], body_file: Any
    ) -> tuple[ASGIRequest, None] | tuple[None, HttpResponseBase]:
        created = super().create_request(scope, body_file)
        request = created[0]
        if request is not None and "CONTENT_LENGTH" not in request.META:
            # A chunked body has no Content-Length, and Django's and DRF's parsers read a missing one as
            # "no body". A read body knows its size. A streamed upload does not: the multipart parser
            # stops at the closing boundary anyway, so give it the most the upload may be, which
            # StreamingBody enforces on what really arrives.
            if isinstance(body_file, StreamingBody):
                request.META["CONTENT_LENGTH"] = str(settings.MAX_UPLOAD_BYTES)
            else:
                size = body_file.seek(0, io.SEEK_END)
                body_file.seek(0)
                if size:
                    request.META["CONTENT_LENGTH"] = str(size)
        return created

    async def listen_for_disconnect(self, receive: Any) -> None:
        if isinstance(receive, _Channel):
            # While the view streams the body, the body's messages are its own.
            await receive.body_finished.wait()
            if not receive.body_complete:
                # The view stopped reading mid-body (a refusal, a timeout, a disconnect it already saw):
                # what is left of the body is not for us, and the response ends the request.
                await asyncio.Event().wait()
        await super().listen_for_disconnect(receive)


async def _reply(send: Any, status: int, message: str) -> None:
    """A JSON error sent before Django runs; the connection closes, so an unread body is never read."""
    body = error_body_bytes(message)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
