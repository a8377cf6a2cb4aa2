"""gRPC messages to and from the data plane: the ``ModelInferRequest`` codec and the extensions' messages.

Inputs come as ``raw_input_contents`` (one entry per input, the binary form of the REST extension;
what tritonclient sends) or as typed ``contents``, and go through the same checks as a REST body
(``inference.protocol``), so the two transports refuse the same request with the same words.
Outputs go back raw when the inputs came raw, as Triton does (tritonclient reads only those), and
typed otherwise, unless an output is FP16, which has no typed field: then every output goes raw.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from inference.errors import InvalidInput
from inference.grpc import grpc_service_pb2 as pb
from inference.protocol import (
    InferRequest,
    InferResult,
    RegionsOf,
    binary_output,
    binary_tensor,
    binary_view,
    check_all_inputs,
    check_input,
    check_outputs,
    check_scheduling,
    expected_inputs,
    output_datatype,
    shared_input,
    shared_outputs,
    string_array,
)
from inference.shared_memory import BYTE_SIZE, REGION, write_output
from onnxkit.datatypes import NUMPY_OF

# The typed contents field of each datatype (FP16 has none: it travels raw only).
CONTENTS = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


class Malformed:
    """A request message that does not parse: its RPC answers ``INVALID_ARGUMENT`` with ``message``.

    gRPC itself would answer ``UNKNOWN`` with the exception and log its traceback, for every such
    message and before the servicer could check the token.
    """

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def parser(message_class: Any) -> Callable[[bytes], Any]:
    """A request deserializer that never raises: the message, or :class:`Malformed` saying why not."""

    def parse(raw: bytes) -> Any:
        try:
            return message_class.FromString(raw)
        except DecodeError as exc:
            return Malformed(f"the {message_class.DESCRIPTOR.name} message is malformed: {exc}")

    return parse


def parameter(value: pb.InferParameter) -> Any:
    """The one value an ``InferParameter`` holds, or None."""
    which = value.WhichOneof("parameter_choice")
    return getattr(value, which) if which else None


def _typed(tensor: pb.ModelInferRequest.InferInputTensor, shape: list[int], count: int) -> np.ndarray:
    name, datatype = tensor.name, tensor.datatype
    field = CONTENTS.get(datatype)
    if field is None:
        raise InvalidInput(f"input '{name}': {datatype} has no typed contents field; send it in raw_input_contents")
    if not tensor.HasField("contents"):
        raise InvalidInput(f"input '{name}' has neither contents nor raw_input_contents")
    values = getattr(tensor.contents, field)
    if len(values) != count:
        raise InvalidInput(f"input '{name}': shape {shape} needs {count} values, got {len(values)} in contents.{field}")
    if datatype == "BYTES":
        return string_array(name, list(values)).reshape(shape)
    try:
        # From a list of Python numbers, so that a value out of the dtype's range raises: numpy reads
        # protobuf 7's repeated containers through the buffer protocol and would wrap 300 to 44 in INT8.
        return np.array(list(values), dtype=NUMPY_OF[datatype]).reshape(shape)
    except OverflowError as exc:
        raise InvalidInput(f"input '{name}': contents.{field} do not fit {datatype}: {exc}") from None


def decode_infer_request(
    message: pb.ModelInferRequest, signature: dict[str, Any], *, regions: RegionsOf | None = None
) -> InferRequest:
    """A ``ModelInferRequest`` checked against the version's signature, as ``decode_request`` checks a REST body.

    ``regions`` gives the caller's shared memory regions. An input read from one has no entry in
    ``raw_input_contents`` (tritonclient sends none), so the entries belong to the other inputs, in order.
    """
    if not message.inputs:
        raise InvalidInput("the request needs a non-empty 'inputs' list")
    raw = message.raw_input_contents
    from_shared = False  # whether any input was read from shared memory
    if raw and len(raw) != len(message.inputs):  # inputs read from shared memory have no raw entry
        sent = len(message.inputs) - sum(REGION in tensor.parameters for tensor in message.inputs)
        if len(raw) != sent:
            raise InvalidInput(
                f"raw_input_contents has {len(raw)} entries for {sent} inputs: give one per input not in shared "
                "memory, in the order of the inputs, or none"
            )
    expected = expected_inputs(signature)
    inputs: dict[str, np.ndarray] = {}
    next_raw = 0
    for tensor in message.inputs:
        name = tensor.name
        shape, count = check_input(name, tensor.datatype, list(tensor.shape), expected, inputs)
        if REGION in tensor.parameters:
            if tensor.HasField("contents"):
                raise InvalidInput(f"input '{name}' has contents as well as {REGION}; send one or the other")
            parameters = {k: parameter(v) for k, v in tensor.parameters.items()}
            inputs[name] = shared_input(name, tensor.datatype, parameters, shape, count, regions)
            from_shared = True
        elif raw:
            if tensor.HasField("contents"):
                raise InvalidInput(f"input '{name}' has contents as well as raw_input_contents; send one or the other")
            inputs[name] = binary_tensor(
                name, tensor.datatype, raw[next_raw], shape, count, size_name="raw_input_contents of"
            )
            next_raw += 1
        else:
            inputs[name] = _typed(tensor, shape, count)
    if next_raw != len(raw):  # as many entries as inputs, some of them read from shared memory
        raise InvalidInput(
            f"raw_input_contents has {len(raw)} entries for {next_raw} inputs: give one per input not in shared "
            "memory, in the order of the inputs, or none"
        )
    check_all_inputs(expected, inputs)
    placed = None
    if message.outputs:
        requested = [(o.name, {k: parameter(v) for k, v in o.parameters.items()}) for o in message.outputs]
        outputs, classification = check_outputs(requested, signature)
        placed = shared_outputs(requested, classification, regions)
    else:
        outputs, classification = [spec["name"] for spec in signature.get("outputs", [])], {}
    parameters = message.parameters
    priority = parameter(parameters["priority"]) if "priority" in parameters else 0
    timeout = parameter(parameters["timeout"]) if "timeout" in parameters else None
    priority, timeout_us = check_scheduling(priority, timeout)
    return InferRequest(
        id=message.id or None,
        inputs=inputs,
        outputs=outputs,
        # Raw outputs when the inputs came raw or from shared memory (tritonclient's; it reads nothing else).
        binary_outputs=set(outputs) if raw or from_shared else set(),
        signature=signature,
        priority=priority,
        timeout_us=timeout_us,
        classification=classification,
        shared_outputs=placed,
    )


def encode_infer_response(result: InferResult, request: InferRequest) -> pb.ModelInferResponse:
    """The outputs the request asked for, in its order: raw when its inputs were raw (or an output is FP16)."""
    response = pb.ModelInferResponse(model_name=result.model, model_version=result.version, id=request.id or "")
    if result.cached is not None:
        response.parameters["cached"].bool_param = result.cached
    arrays = [(name, result.outputs[name]) for name in request.outputs]
    datatypes = [output_datatype(array) for _, array in arrays]
    raw = bool(request.binary_outputs) or "FP16" in datatypes
    shared = request.shared_outputs
    for (name, array), datatype in zip(arrays, datatypes, strict=True):
        tensor = response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        if shared is not None and name in shared:  # written into the client's region: no data in the answer
            written = write_output(name, shared[name], binary_view(array, datatype))
            tensor.parameters[REGION].string_param = written[REGION]
            tensor.parameters[BYTE_SIZE].int64_param = written[BYTE_SIZE]
            if raw:
                response.raw_output_contents.append(b"")  # keeps one entry per output, in order
        elif raw:
            response.raw_output_contents.append(binary_output(array, datatype))
        elif datatype == "BYTES":
            tensor.contents.bytes_contents.extend(
                v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1)
            )
        else:
            getattr(tensor.contents, CONTENTS[datatype]).extend(array.reshape(-1).tolist())
    return response


def message_from_json(data: dict[str, Any], message: Any) -> Any:
    """A message filled from the data plane's JSON answer (model config, statistics): the same fields, by name."""
    return json_format.ParseDict(data, message)
