"""The one table from domain errors to /v2 answers: every error has a status, and the headers the old endpoints sent."""

from __future__ import annotations

import inspect
import json

from inference import errors
from inference.app import error_response
from inference.errors import HTTP_STATUS as STATUS


def test_every_domain_error_has_a_status():
    defined = {
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.InferenceError) and cls is not errors.InferenceError
    }
    assert defined == set(STATUS)
    assert all(400 <= status < 600 for status, _ in STATUS.values())


def test_answers_carry_the_message_retry_after_and_connection_close():
    limited = error_response(errors.RateLimited("rate limit passed", retry_after=30), close=True)
    assert (limited.status_code, json.loads(bytes(limited.body))) == (429, {"error": "rate limit passed"})
    assert (limited.headers["retry-after"], limited.headers["connection"]) == ("30", "close")

    not_ready = error_response(errors.ModelNotReady("model 'm' is not loaded yet"))
    assert (not_ready.status_code, not_ready.headers["retry-after"]) == (503, "1")
    assert "connection" not in not_ready.headers

    too_large = error_response(errors.BodyTooLarge("the request body is larger than the limit"), close=True)
    assert (too_large.status_code, too_large.headers["connection"]) == (413, "close")
    assert "retry-after" not in too_large.headers

    assert error_response(errors.RequestTimeout("late")).status_code == 504
    gone = error_response(errors.ClientGone("gone"), close=True)
    assert (gone.status_code, gone.body, "connection" in gone.headers) == (499, b"", False)


def test_every_domain_error_has_a_grpc_status_code():
    import grpc

    from inference.grpc.server import STATUS as GRPC_STATUS

    defined = {
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.InferenceError) and cls is not errors.InferenceError
    }
    assert defined == set(GRPC_STATUS)
    assert all(code != grpc.StatusCode.OK for code, _ in GRPC_STATUS.values())
    # What REST answers with Retry-After, gRPC answers with retry-after metadata.
    assert {cls for cls, (_, retry) in GRPC_STATUS.items() if retry} == {
        cls for cls, (_, retry) in STATUS.items() if retry
    }


def test_device_failures_are_the_servers_and_out_of_memory_is_retried():
    assert STATUS[errors.DeviceFailed] == (500, False)
    assert STATUS[errors.RepositoryReadOnly] == (400, False)
    cuda = errors.run_failure(RuntimeError("CUDA failure 700: an illegal memory access was encountered"), "no memory")
    assert isinstance(cuda, errors.DeviceFailed)
    assert isinstance(errors.run_failure(MemoryError(), "no memory"), errors.OutOfMemory)
    assert isinstance(
        errors.run_failure(RuntimeError("Got invalid dimensions for input: x"), "m"), errors.InferenceFailed
    )
