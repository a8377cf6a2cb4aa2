"""What the REST API (``registry/api/``) and the web UI (``registry/ui/``) share about HTTP.

- **Statuses.** Domain errors (``registry.errors``) carry no HTTP: :data:`STATUS` is the one table
  that gives each its status, for both; :func:`body_refusal` answers the limits hit while a body is
  read (size, an idle client, too many parts), worded alike for both; :func:`json_404` and
  :func:`json_500` answer outside the UI's pages. Every body is built by ``modelyard.error_body``.
- **The multipart upload.** :class:`MultipartUpload` is a streamed multipart upload request as an
  :class:`~registry.uploads.UploadSource` for ``version_upload``; :class:`MultipartInput` is an inference
  job's one ``input`` file part, streamed the same way, with the text fields sent before it.

Django parses a multipart body by pushing it, chunk by chunk, into upload handlers; the upload
service pulls each file as a readable stream. The adapter joins the two without holding a file
anywhere: Django's parser runs in a helper thread, and its handler pushes each file part through a
bounded :class:`ChunkPipe` that the service reads on the request's own thread (where its database
work belongs). Receiving from the client and writing to storage overlap, and memory stays bounded
by the pipe and boto3's part buffers; one file is in flight at a time.

A failure on either side stops the other. If the body cannot be parsed (too large, too many
files or fields, a client that stalls or leaves, a body that ends inside a file part), that error
is the answer. If the service refuses a file, the parser stops and the rest of the body is never
read (the connection closes).
"""

from __future__ import annotations

import io
import queue
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Any, BinaryIO, Protocol, cast

from django.conf import settings
from django.core.exceptions import RequestAborted, RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.core.files.uploadhandler import FileUploadHandler
from django.http import HttpRequest, JsonResponse, QueryDict
from django.http.multipartparser import MultiPartParser, MultiPartParserError
from rest_framework.response import Response

from modelyard import malloc_arenas
from modelyard.error_body import error_body
from modelyard.streaming import BodyIdleTimeout, BodyTooLarge
from registry import errors
from registry.errors import InvalidInput
from registry.lifecycle.lineage import LINEAGE_FIELDS
from registry.uploads import UploadFields
from storage import StorageError

# --- Statuses ---------------------------------------------------------------------------------

# Looked up along the exception's class hierarchy, so a subclass answers as its nearest listed base.
STATUS: dict[type[Exception], int] = {
    errors.InvalidInput: 400,
    errors.PermissionDenied: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.Gone: 410,
    errors.PayloadTooLarge: 413,
    errors.QueueFull: 429,  # a Conflict by nature, but "try later" is what the client must hear
    errors.StorageDown: 503,
    StorageError: 503,  # a storage failure outside an upload (a download, say)
}


def status_for(exc: Exception) -> int | None:
    """The status :data:`STATUS` gives ``exc``, or None if it is not a domain or storage error."""
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return None


def domain_error_response(exc: Exception) -> Response | None:
    """The answer to a domain or storage error; None for any other exception."""
    status = status_for(exc)
    if status is None:
        return None
    if isinstance(exc, errors.RegistryError):
        return Response(error_body(exc.message, exc.detail), status=status)
    return Response(error_body(f"artifact storage is unavailable: {exc}"), status=status)


def _closing(exc: errors.RegistryError) -> Response:
    """A domain error's answer that closes the connection, for a refusal that leaves the body unread."""
    response = domain_error_response(exc)
    assert response is not None  # every domain error has a status (tests/test_architecture.py)
    response["Connection"] = "close"
    return response


def body_refusal(exc: Exception) -> Response | None:
    """Limits hit while the request body was read; the connection closes after an unread body."""
    close = {"Connection": "close"}
    if isinstance(exc, BodyTooLarge):
        return Response(error_body(str(exc), {"limit": exc.limit, "setting": exc.setting}), 413, headers=close)
    if isinstance(exc, BodyIdleTimeout):
        return Response(error_body(str(exc), {"seconds": exc.seconds}), 408, headers=close)
    if isinstance(exc, TooManyFilesSent):  # Django counted the parts; worded as the upload service words it
        return _closing(errors.TooManyFiles(settings.DATA_UPLOAD_MAX_NUMBER_FILES))
    if isinstance(exc, TooManyFieldsSent):
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        message = f"too many form fields: a request may have at most {limit}"
        return Response(error_body(message, {"limit": limit}), 400, headers=close)
    if isinstance(exc, RequestDataTooBig):
        return _closing(errors.FormTooLarge(settings.DATA_UPLOAD_MAX_MEMORY_SIZE))
    if isinstance(exc, RequestAborted):
        # Nobody is left to answer, and streaming.py already logged the disconnect in one line.
        response = Response(error_body("the client disconnected"), 400)
        response._has_been_logged = True  # type: ignore[attr-defined]  # Django's flag: no "Bad Request" warning
        return response
    return None


def json_404(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(error_body("not found", request.path), status=404)


def json_500(request: HttpRequest) -> JsonResponse:
    return JsonResponse(error_body("internal server error"), status=500)


# --- The multipart upload -------------------------------------------------------------------------

PIPE_CHUNK = 1024 * 1024
PIPE_DEPTH = 2  # chunks waiting between the parser and the storage write
PREALLOCATE_MAX = 16 * 1024 * 1024  # the most a read sets aside before its bytes arrive (an S3 part is 8 MiB)
POLL_SECONDS = 0.5  # how often a blocked side checks whether the other gave up
UNTERMINATED = "the multipart body ended inside a file part"


class _Aborted(Exception):
    """The other side of the pipe gave up; its own error is the one reported."""


class ChunkPipe:
    """A bounded, blocking byte pipe: the parser thread writes chunks, the storage write reads them."""

    def __init__(self, aborted: threading.Event | None = None) -> None:
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=PIPE_DEPTH)
        self._pending = b""
        self._eof = False
        self._aborted = aborted or threading.Event()
        self.done = threading.Event()  # the reader has all of it, or has moved on

    def put(self, data: bytes | None) -> None:
        """Queue a chunk (None marks the end), blocking while the reader is behind."""
        while not self._aborted.is_set():
            try:
                self._queue.put(data, timeout=POLL_SECONDS)
                return
            except queue.Full:
                continue
        raise _Aborted("upload aborted")

    def close(self) -> None:
        self.put(None)

    def abort(self) -> None:
        self._aborted.set()

    def release(self) -> None:
        """The reader stopped for good (its request was refused): wake a writer blocked on the full queue
        or in :meth:`wait_done` now, instead of at its next poll, so that the refusal goes out at once.
        With the abort set, the writer's next step raises :class:`_Aborted`."""
        self.done.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

    def wait_done(self) -> None:
        while not self.done.wait(POLL_SECONDS):
            if self._aborted.is_set():
                raise _Aborted("upload aborted")
        if self._aborted.is_set():  # released: the reader stopped without reading to the end
            raise _Aborted("upload aborted")

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all, if negative), fewer only at the end.

        The chunks are written into one ``BytesIO`` as they arrive and each is let go, and ``getvalue()``
        hands over that buffer without copying it: a whole S3 part is held once, not as its chunks and
        their join side by side. The buffer is made at its full size first (up to
        :data:`PREALLOCATE_MAX`), so it is not moved while it fills.
        """
        out = io.BytesIO()
        if n > 0:
            out.seek(min(n, PREALLOCATE_MAX) - 1)
            out.write(b"\0")
            out.seek(0)
        have = 0

        def take(item: bytes) -> None:
            nonlocal have
            if 0 <= n < have + len(item):  # only the last piece is split; the rest waits for the next read
                cut = n - have
                out.write(memoryview(item)[:cut])
                self._pending = item[cut:]
                have = n
            else:
                out.write(item)
                have += len(item)

        if self._pending:
            pending, self._pending = self._pending, b""
            take(pending)
        while not self._eof and (n < 0 or have < n):
            if self._aborted.is_set():
                raise _Aborted("upload aborted")
            try:
                item = self._queue.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            if item is None:
                self._eof = True
                self.done.set()
                break
            take(item)
            del item
        out.truncate(have)  # short only at the end of the file
        return out.getvalue()

    def readable(self) -> bool:
        return True


class _PipeSource(Protocol):
    """What a part handler offers each file part to as it starts (:class:`MultipartUpload`, :class:`MultipartInput`)."""

    def _offer(self, name: str) -> ChunkPipe: ...


class _PartHandler(FileUploadHandler):
    """Django's side: every ``file`` part becomes a pipe, offered to the service as it starts."""

    chunk_size = PIPE_CHUNK

    def __init__(self, request: Any, upload: _PipeSource) -> None:
        super().__init__(request)
        self._upload = upload
        self._pipe: ChunkPipe | None = None

    def new_file(self, field_name: str, file_name: str, content_type: str, *args: Any, **kwargs: Any) -> None:
        super().new_file(field_name, file_name, content_type, *args, **kwargs)
        if field_name != "file":
            raise InvalidInput(f"unexpected file field '{field_name}'; send every file as a 'file' part")
        self._pipe = self._upload._offer(file_name)

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        assert self._pipe is not None
        self._pipe.put(raw_data)

    def file_complete(self, file_size: int) -> None:
        assert self._pipe is not None
        pipe, self._pipe = self._pipe, None
        pipe.close()
        pipe.wait_done()  # one file in flight: the next part is not read until this one is stored

    def upload_interrupted(self) -> None:
        """The body ended (its Content-Length reached, or its last chunk) before the file part's closing boundary.

        No more bytes come for the pipe the storage write is reading, and no end either: refusing the
        upload aborts the pipe, so the write stops instead of waiting for good. The service deletes
        what it wrote.
        """
        if self._pipe is not None:
            self._pipe = None
            raise InvalidInput(UNTERMINATED)


class MultipartUpload:
    """The upload in one request's multipart body; use as a context manager around ``version_upload``.

    ``request`` is a DRF or a Django request whose body has not been read yet; every ``file`` part
    is a file of the upload, in order, and the ``description``, ``metadata`` and lineage fields its text.
    """

    def __init__(self, request: Any) -> None:
        self._request = request
        self._aborted = threading.Event()
        self._parts: queue.SimpleQueue[tuple[str, ChunkPipe] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._pipe: ChunkPipe | None = None  # the file part in flight
        # Named upload-*, as the storage writers it replaces were: tests check that none outlives its request.
        self._thread = threading.Thread(target=self._parse, name=f"upload-{request.path}", daemon=True)
        django_request = getattr(request, "_request", request)
        django_request.upload_handlers = [_PartHandler(django_request, self)]

    def __enter__(self) -> MultipartUpload:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if exc is not None:
            self._aborted.set()  # the parser stops at its next chunk
            if self._pipe is not None:
                self._pipe.release()  # at once, if it waits for room in the pipe
        self._join()
        malloc_arenas.release_free_memory()  # the upload's parts and chunks are free now
        if exc is not None and self._error is not None and self._error is not exc:
            # The body could not be read (too large, a client that stalled or left): that is the answer,
            # not what the storage write made of the pipe it was reading from.
            raise self._error from None

    def files(self) -> Iterator[tuple[str, BinaryIO]]:
        self._thread.start()
        while (part := self._parts.get()) is not None:
            name, pipe = part
            try:
                yield name, cast(BinaryIO, pipe)
            finally:
                pipe.done.set()  # the service moved on (or stopped): the parser may go on
        self._join()
        if self._error is not None:
            raise self._error

    def fields(self) -> UploadFields:
        self._join()
        if self._error is not None:
            raise self._error
        post = self._request.POST  # parsed already, by the thread
        lineage = {name: post[name] for name in LINEAGE_FIELDS if name in post}
        return UploadFields(description=post.get("description", ""), metadata=post.get("metadata"), lineage=lineage)

    def _offer(self, name: str) -> ChunkPipe:
        pipe = self._pipe = ChunkPipe(self._aborted)
        self._parts.put((name, pipe))
        return pipe

    def _parse(self) -> None:
        try:
            self._request.POST  # noqa: B018 - reading it parses the body through _PartHandler
        except _Aborted:
            pass  # the service stopped reading; its own error is the answer
        except MultiPartParserError as exc:  # DRF's wording, for a Django request
            self._fail(InvalidInput(f"Multipart form parse error - {exc}"))
        except BaseException as exc:  # noqa: BLE001 - handed to the request thread
            self._fail(exc)
        finally:
            self._parts.put(None)

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._aborted.set()  # a storage write reading a pipe stops

    def _join(self) -> None:
        if self._thread.ident is not None:
            self._thread.join()


# --- An inference job's input -----------------------------------------------------------------------------


class _InputHandler(_PartHandler):
    """Django's side for :class:`MultipartInput`: the one ``input`` part becomes a pipe, offered as it starts."""

    def __init__(self, request: Any, upload: MultipartInput) -> None:
        super().__init__(request, upload)
        self._seen = False

    def new_file(self, field_name: str, file_name: str, content_type: str, *args: Any, **kwargs: Any) -> None:
        if field_name != MultipartInput.FIELD:
            raise InvalidInput(f"unexpected file field '{field_name}'; send the job's input as one 'input' part")
        if self._seen:
            raise InvalidInput("send one 'input' file part: a job reads one input file")
        self._seen = True
        FileUploadHandler.new_file(self, field_name, file_name, content_type, *args, **kwargs)
        self._pipe = self._upload._offer(file_name)


class _InputStream:
    """The input part as the job service reads it; at its end, the fields sent after it must be empty.

    The service needs the model and the version before the first byte is stored, so those fields come
    before the ``input`` part (as ``modelyard job submit`` and the page's form send them). One sent
    after it would be read too late to count: refused rather than ignored, before the job is recorded.
    """

    def __init__(self, upload: MultipartInput, pipe: ChunkPipe) -> None:
        self._upload = upload
        self._pipe = pipe

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self._pipe.read(n)
        if not data or n < 0:
            self._upload._check_late_fields()
        return data


class MultipartInput:
    """An inference job's multipart request: its text fields, then its one ``input`` file, streamed.

    Use as a context manager; :meth:`start` waits until the ``input`` part begins (or the body ends
    without one) and gives the fields sent before it, the file's name and a readable stream of it that
    the service reads on the request's thread while Django's parser, in a helper thread, feeds it
    through a bounded :class:`ChunkPipe`, as :class:`MultipartUpload` does for a version's files.
    """

    FIELD = "input"

    def __init__(self, request: Any, *, job_fields: tuple[str, ...] = ()) -> None:
        self._request = getattr(request, "_request", request)  # the Django request: its body, unread
        self._job_fields = job_fields
        self._aborted = threading.Event()
        self._started: queue.SimpleQueue[tuple[str, ChunkPipe] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._parser: MultiPartParser | None = None
        self._pipe: ChunkPipe | None = None
        self._before: QueryDict = QueryDict(mutable=True)
        self._post: QueryDict | None = None
        self._thread = threading.Thread(target=self._parse, name=f"upload-{self._request.path}", daemon=True)
        self._request.upload_handlers = [_InputHandler(self._request, self)]

    def __enter__(self) -> MultipartInput:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        # Whatever the answer, the parser stops: a refusal before the input's end leaves the rest unread.
        self._aborted.set()
        if self._pipe is not None:
            self._pipe.release()  # at once, though the service never read the input (a missing field, say)
        self._join()
        malloc_arenas.release_free_memory()  # the input's chunks are free now
        if exc is not None and self._error is not None and self._error is not exc:
            raise self._error from None

    def start(self) -> tuple[QueryDict, str | None, BinaryIO | None]:
        """(the fields sent before the input, its file name, its stream); the last two None without an input part."""
        self._thread.start()
        part = self._started.get()
        if part is None:  # the body ended (or failed) with no input part: every field is in
            self._join()
            if self._error is not None:
                raise self._error
            assert self._post is not None
            return self._post, None, None
        name, pipe = part
        return self._before, name, cast(BinaryIO, _InputStream(self, pipe))

    def _offer(self, name: str) -> ChunkPipe:
        pipe = self._pipe = ChunkPipe(self._aborted)
        assert self._parser is not None
        # The fields parsed so far: Django's parser keeps them on itself until it returns them all.
        self._before = self._parser._post.copy()  # type: ignore[attr-defined]
        self._started.put((name, pipe))
        return pipe

    def _check_late_fields(self) -> None:
        self._join()
        if self._error is not None:
            raise self._error
        assert self._post is not None
        late = [name for name in self._job_fields if any(self._post.getlist(name)) and name not in self._before]
        if late:
            raise InvalidInput(
                f"send {', '.join(repr(name) for name in late)} before the 'input' file part: "
                "the job's fields are read before its input is stored",
                {"fields": late},
            )

    def _parse(self) -> None:
        request = self._request
        try:
            self._parser = MultiPartParser(request.META, request, request.upload_handlers, request.encoding)
            post, files = self._parser.parse()
            self._post = post
            request._post, request._files = post, files
        except _Aborted:
            pass
        except MultiPartParserError as exc:
            self._fail(InvalidInput(f"Multipart form parse error - {exc}"))
        except BaseException as exc:  # noqa: BLE001 - handed to the request thread
            self._fail(exc)
        finally:
            self._started.put(None)

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._aborted.set()

    def _join(self) -> None:
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join()
