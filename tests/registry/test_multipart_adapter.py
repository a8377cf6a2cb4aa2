"""The multipart adapter also feeds the upload service from a plain Django request, as the coming UI form will."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import RequestFactory

from registry.errors import InvalidInput, NotAnOnnxModel
from registry.http import PIPE_CHUNK, PIPE_DEPTH, ChunkPipe, MultipartInput, MultipartUpload
from registry.models import ModelVersion, RegisteredModel
from registry.uploads import version_upload
from tests.support.onnx_models import add_model_bytes
from tests.support.uploads import stored_keys

pytestmark = pytest.mark.django_db


def form_request(files: list[tuple[str, bytes]], **fields: str):
    parts = [SimpleUploadedFile(name, data) for name, data in files]
    return RequestFactory().post("/ui/models/demo/upload", {"file": parts, **fields})


def test_a_django_form_request_uploads_through_the_service(owner, registered):
    request = form_request([("model.onnx", add_model_bytes()), ("vocab.txt", b"a\nb\n")], description="from a form")
    with MultipartUpload(request) as body:
        version = version_upload(model=RegisteredModel.objects.get(name=registered), source=body, actor=owner.actor)
    assert (version.version, version.description) == (1, "from a form")
    assert [f.name for f in version.files.all()] == ["model.onnx", "vocab.txt"]


def test_a_refusal_from_a_django_form_request_leaves_nothing(owner, registered):
    request = form_request([("model.onnx", b"plain text"), ("vocab.txt", b"a\nb\n")])
    with pytest.raises(NotAnOnnxModel) as caught, MultipartUpload(request) as body:
        version_upload(model=RegisteredModel.objects.get(name=registered), source=body, actor=owner.actor)
    assert caught.value.message.startswith("'model.onnx': the file is not an ONNX model")
    assert ModelVersion.objects.count() == 0
    assert stored_keys() == []


def test_a_django_request_without_a_boundary_is_invalid_input(owner, registered):
    request = RequestFactory().post("/ui/models/demo/upload", b"--x\r\n", content_type="multipart/form-data")
    with pytest.raises(InvalidInput) as caught, MultipartUpload(request) as body:
        version_upload(model=RegisteredModel.objects.get(name=registered), source=body, actor=owner.actor)
    assert caught.value.message == "Multipart form parse error - Invalid boundary in multipart: None"


# --- A refusal goes out at once ----------------------------------------------------------------------
#
# The parser thread that feeds a pipe polls for an abort every POLL_SECONDS. A request refused while
# that thread waits (for room in the pipe, or for the service to take a finished file) is released at
# once instead: with the poll set to a minute, each refusal below would take a minute otherwise.

SLOW_POLL = 60.0


def _answered_before_the_poll(refuse: Callable[[], None]) -> None:
    """Run ``refuse`` (a request refused with InvalidInput) in a thread: it ends long before a poll would."""
    outcome: list[str] = []

    def run() -> None:
        try:
            refuse()
        except InvalidInput as exc:
            outcome.append(exc.message)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=SLOW_POLL / 2)
    assert not thread.is_alive(), "the refusal waited for the parser's poll"
    assert outcome == ["refused"]
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("upload-")]


def test_a_refused_job_input_releases_the_parser_at_once(monkeypatch):
    monkeypatch.setattr("registry.http.POLL_SECONDS", SLOW_POLL)
    request = RequestFactory().post("/api/v1/inference-jobs", {"input": SimpleUploadedFile("in.jsonl", b"{}\n")})

    def refuse() -> None:
        with MultipartInput(request, job_fields=("model",)) as body:
            fields, name, _stream = body.start()
            assert (dict(fields), name) == ({}, "in.jsonl")
            raise InvalidInput("refused")  # as the view refuses a missing model, the input unread

    _answered_before_the_poll(refuse)


def test_a_refused_upload_releases_a_parser_waiting_for_room(monkeypatch):
    monkeypatch.setattr("registry.http.POLL_SECONDS", SLOW_POLL)
    big = bytes(PIPE_CHUNK * (PIPE_DEPTH + 4))  # more than the pipe holds: the parser waits for room
    request = form_request([("model.onnx", big)])

    def refuse() -> None:
        with MultipartUpload(request) as body:
            for _name, stream in body.files():
                stream.read(PIPE_CHUNK)
                raise InvalidInput("refused")

    _answered_before_the_poll(refuse)


def test_a_released_pipe_wakes_its_blocked_writer_with_an_abort(monkeypatch):
    monkeypatch.setattr("registry.http.POLL_SECONDS", SLOW_POLL)
    pipe = ChunkPipe()
    outcome: list[str] = []

    def write() -> None:
        try:
            for _ in range(PIPE_DEPTH + 2):
                pipe.put(b"x")
            outcome.append("wrote all")
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion
            outcome.append(type(exc).__name__)

    writer = threading.Thread(target=write)
    writer.start()
    while pipe._queue.qsize() < PIPE_DEPTH:  # the queue is full: the writer waits for room
        time.sleep(0.01)
    pipe.abort()
    pipe.release()
    writer.join(timeout=SLOW_POLL / 2)
    assert outcome == ["_Aborted"]


# --- The memory an upload freed goes back to the system ------------------------------------------------


@pytest.fixture
def releases(monkeypatch) -> list[list[str]]:
    """Each call of ``malloc_arenas.release_free_memory`` from registry.http: the upload threads alive at it."""
    calls: list[list[str]] = []

    def record() -> bool:
        calls.append([thread.name for thread in threading.enumerate() if thread.name.startswith("upload-")])
        return True

    monkeypatch.setattr("registry.http.malloc_arenas.release_free_memory", record)
    return calls


def test_an_upload_gives_its_freed_memory_back_once_its_parser_has_ended(owner, registered, releases):
    request = form_request([("model.onnx", add_model_bytes())])
    with MultipartUpload(request) as body:
        version_upload(model=RegisteredModel.objects.get(name=registered), source=body, actor=owner.actor)
        assert releases == []
    assert releases == [[]]


def test_a_refused_upload_gives_its_freed_memory_back_too(owner, registered, releases):
    request = form_request([("model.onnx", b"plain text")])
    with pytest.raises(NotAnOnnxModel), MultipartUpload(request) as body:
        version_upload(model=RegisteredModel.objects.get(name=registered), source=body, actor=owner.actor)
    assert releases == [[]]


def test_a_job_input_gives_its_freed_memory_back(releases):
    request = RequestFactory().post("/api/v1/inference-jobs", {"input": SimpleUploadedFile("in.jsonl", b"{}\n")})
    with MultipartInput(request) as body:
        _fields, _name, stream = body.start()
        assert stream is not None and stream.read() == b"{}\n"
    assert releases == [[]]
