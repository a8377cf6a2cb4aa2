"""gRPC messages that do not parse: ``INVALID_ARGUMENT`` and one log line each, after the token check, no traceback.

gRPC itself would answer ``UNKNOWN`` with the Python exception and log a seven-line traceback for
each such message, before any token was checked: 500 of them wrote 3,500 lines in two seconds.
"""

from __future__ import annotations

import logging

import grpc
import numpy as np
import pytest

from inference.dataplane import NEEDS_TOKEN
from inference.grpc import grpc_service_pb2 as pb
from tests.support.v2server import V2Server

GARBAGE = b"\x0a\xff"  # field 1, 255 bytes long, then nothing: not a message of any type
SERVICE = "/inference.GRPCInferenceService"
MALFORMED = "the {} message is malformed: Error parsing message with type 'inference.{}': Wire format was corrupt"


def logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """What the gRPC server (ours, and gRPC's own) logged."""
    return [r for r in caplog.records if r.name.startswith(("grpc", "inference.grpc"))]


def adder_request(x: np.ndarray) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="adder", id="valid", raw_input_contents=[x.tobytes()])
    message.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    return message


def test_each_malformed_message_is_invalid_argument_with_one_log_line(v2: V2Server, caplog):
    caplog.set_level(logging.INFO)
    with grpc.insecure_channel(v2.grpc_url) as channel:
        for method, message_type, times in (
            ("ModelInfer", "ModelInferRequest", 50),
            ("ServerLive", "ServerLiveRequest", 1),
        ):
            call = channel.unary_unary(f"{SERVICE}/{method}")  # bytes in, bytes out: sent as they are
            for _ in range(times):
                with pytest.raises(grpc.RpcError) as caught:
                    call(GARBAGE)
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert caught.value.details() == MALFORMED.format(message_type, message_type)
    records = logged(caplog)
    assert len(records) == 51
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in records)
    assert records[0].getMessage().startswith("gRPC ModelInfer from ipv4:127.0.0.1:")
    assert records[0].getMessage().endswith(MALFORMED.format("ModelInferRequest", "ModelInferRequest"))


def test_without_a_token_a_malformed_message_is_unauthenticated_and_logs_nothing(v2: V2Server, settings, caplog):
    settings.INFERENCE_PUBLIC = False
    caplog.set_level(logging.INFO)
    with grpc.insecure_channel(v2.grpc_url) as channel:
        call = channel.unary_unary(f"{SERVICE}/ModelInfer")
        for _ in range(20):
            with pytest.raises(grpc.RpcError) as caught:
                call(GARBAGE)
            assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.UNAUTHENTICATED, NEEDS_TOKEN)
        assert logged(caplog) == []
        with pytest.raises(grpc.RpcError) as caught:
            call(GARBAGE, metadata=(("authorization", f"Bearer {v2.inference_token}"),))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(logged(caplog)) == 1


def test_a_malformed_message_in_a_stream_is_answered_and_the_stream_goes_on(v2: V2Server, caplog):
    caplog.set_level(logging.INFO)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    with grpc.insecure_channel(v2.grpc_url) as channel:
        stream = channel.stream_stream(
            f"{SERVICE}/ModelStreamInfer", response_deserializer=pb.ModelStreamInferResponse.FromString
        )
        first, second = stream(iter([GARBAGE, adder_request(x).SerializeToString()]), timeout=60)
    assert first.error_message == MALFORMED.format("ModelInferRequest", "ModelInferRequest")
    assert second.error_message == ""
    assert second.infer_response.id == "valid"
    y = np.frombuffer(second.infer_response.raw_output_contents[0], dtype=np.float32).reshape(2, 4)
    assert np.array_equal(y, x + 1)
    assert len(logged(caplog)) == 1
