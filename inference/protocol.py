"""The Open Inference Protocol (KServe v2) wire format, with Triton's binary tensor extension.

Decoding turns a request body into numpy arrays checked against the version's signature;
encoding turns outputs into a JSON or JSON-plus-binary response. Every problem a client can
cause raises a domain error of ``inference.errors`` (mostly :class:`InvalidInput`) whose message
names what was wrong.
"""

from __future__ import annotations

import json
import math
import re
import struct
import zlib
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import orjson

from inference.batcher import CLASS_NORMAL
from inference.errors import BodyTooLarge, InvalidInput, UnsupportedEncoding
from inference.shared_memory import BYTE_SIZE, REGION, Region, SharedOutput, placement, write_output
from onnxkit.datatypes import NUMPY_OF
from onnxkit.tokenizer import TEXT_INPUT, TOKENIZER_FILE

HEADER_LENGTH = "inference-header-content-length"
MAX_ELEMENTS = 1 << 31
MAX_UINT64 = (1 << 64) - 1  # Triton's priority and timeout are uint64
MAX_INT64 = (1 << 63) - 1  # Triton's largest element count and byte size
MAX_DATA_DEPTH = 64  # numpy's most dimensions: JSON data nested deeper cannot be an array
# Triton's words where it has them, so that clients which compare error texts read ours as its own.
NESTED_TOO_DEEPLY = "JSON nesting depth exceeds maximum allowed limit: the request JSON is nested too deeply"

# How JSON (which has none) spells the non-finite floats, by Python's repr: the proto3 JSON mapping's names.
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}

PROTOCOL_OF = {np.dtype(v).str: k for k, v in NUMPY_OF.items() if v is not np.object_}


@dataclass
class InferRequest:
    """A decoded request: inputs as arrays, how the client wants its outputs, the signature it was checked against."""

    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: list[str]
    binary_outputs: set[str]
    signature: dict[str, Any]
    priority: int = 0
    timeout_us: int | None = None
    classification: dict[str, int] = field(default_factory=dict)  # output name -> top N (the extension)
    # The caller's priority class (``inference.batcher.CLASS_*``), ahead of ``priority`` in the batcher's
    # order. Not on the wire: the transport sets it from the token's grant (``Admission.klass``).
    klass: int = CLASS_NORMAL
    # Outputs the client asked to have written into its shared memory regions (None: none, the usual case).
    shared_outputs: dict[str, SharedOutput] | None = None


class InferResult(NamedTuple):
    """The outputs of one request, by name, and the version that computed them (what the data plane answers)."""

    model: str
    version: str
    outputs: dict[str, np.ndarray]
    # Through an alias with a response cache: whether the answer came from it (the ``cached`` response
    # parameter); None when the alias caches nothing (no parameter).
    cached: bool | None = None


def can_batch(signature: dict[str, Any]) -> bool:
    """A model's requests can be merged when every input and output has a dynamic first dimension.

    The same rule as ``onnxkit.signatures.batch_dimension_problem``; whether they are merged is the
    registry's decision (``VersionSpec.batching``: validation's check and the model's setting).
    """
    specs = signature.get("inputs", []) + signature.get("outputs", [])
    return bool(specs) and all(s.get("shape") and s["shape"][0] == -1 for s in specs)


@dataclass(frozen=True)
class BodyLimit:
    """The most bytes a /v2 request body may have, raw and decompressed, and where that number comes from."""

    bytes: int
    source: str

    def exceeded(self, what: str) -> BodyTooLarge:
        return BodyTooLarge(f"{what} is larger than the limit of {self.bytes} bytes ({self.source})")


# A JSON number takes at most ~25 characters ("-2.2250738585072014e-308,"); 64 leaves room for
# pretty-printed nesting and is more than the 8 bytes of any binary element.
JSON_BYTES_PER_ELEMENT = 64
HEADER_ALLOWANCE = 64 * 1024  # the JSON around the data: names, shapes, parameters, outputs
INFLATE_STEP = 1 << 20


def body_limit(model: str, signature: dict[str, Any], default: int) -> BodyLimit:
    """``default`` (MODELYARD_V2_MAX_BODY_BYTES), lowered when every input has a fixed shape and size."""
    global_limit = BodyLimit(default, "MODELYARD_V2_MAX_BODY_BYTES")
    inputs = signature.get("inputs") or []
    need = HEADER_ALLOWANCE
    if "text" in signature:
        return global_limit  # one text may be any length: it is truncated to tokens after it has arrived
    for spec in inputs:
        shape = spec.get("shape")
        if spec.get("datatype") == "BYTES" or not isinstance(shape, list) or any(d < 0 for d in shape):
            return global_limit  # a dynamic dimension or strings: the inputs alone say nothing about size
        count = 1
        for d in shape:
            count *= d
        need += count * JSON_BYTES_PER_ELEMENT
        if need >= default:
            return global_limit
    if not inputs:
        return global_limit
    return BodyLimit(need, f"what the fixed-shape inputs of model '{model}' can need")


def _is_zlib_header(head: bytes) -> bool:
    """RFC 1950: deflate method, a window of at most 32 KiB, and a header checksum divisible by 31.

    A raw deflate stream never starts like this unless it opens with a non-final stored block whose
    padding bits are set, which no encoder writes.
    """
    return head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and (head[0] << 8 | head[1]) % 31 == 0


class BodyDecoder:
    """Collects a request body as it arrives and inflates gzip or deflate on the fly.

    The raw bytes received and the bytes after decompression are each checked against ``limit``
    chunk by chunk, so a decompression bomb stops at the limit instead of filling memory.
    ``deflate`` is zlib-wrapped deflate (RFC 1950) or, as some clients send it, raw deflate
    (RFC 1951); the first two bytes tell them apart.
    """

    def __init__(self, encoding: str, limit: BodyLimit) -> None:
        encoding = encoding.strip().lower()
        if encoding == "identity":
            encoding = ""
        if encoding not in ("", "gzip", "deflate"):
            raise UnsupportedEncoding(f"unsupported Content-Encoding '{encoding}'; use gzip or deflate")
        self.encoding = encoding
        self.limit = limit
        self.received = 0
        self.body = bytearray()
        self._head = b""  # deflate: the first bytes, until there are two to recognise the wrapper by
        self._inflater: Any = None
        if encoding == "gzip":
            self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def feed(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self.received > self.limit.bytes:
            raise self.limit.exceeded("the request body")
        if not self.encoding:
            self.body += chunk
            return
        if self._inflater is None:
            self._head += chunk
            if len(self._head) < 2:
                return
            chunk, self._head = self._head, b""
            self._inflater = zlib.decompressobj(zlib.MAX_WBITS if _is_zlib_header(chunk) else -zlib.MAX_WBITS)
        self._inflate(chunk)

    def _inflate(self, data: bytes) -> None:
        inflater = self._inflater
        try:
            while data:
                if inflater.eof:
                    raise InvalidInput(f"the {self.encoding} body has data after its end")
                # Ask for one byte past the room left (getting it means the limit is passed), in steps,
                # so that no inflated piece as large as the limit is held beside the body.
                room = self.limit.bytes - len(self.body)
                self.body += inflater.decompress(data, min(room + 1, INFLATE_STEP))
                if len(self.body) > self.limit.bytes:
                    raise self.limit.exceeded("the decompressed request body")
                data = inflater.unconsumed_tail or inflater.unused_data
        except zlib.error as exc:
            raise InvalidInput(f"the {self.encoding} body is corrupt: {exc}") from None

    def finish(self) -> bytearray:
        """The whole (decompressed) body, once the last chunk has been fed."""
        if not self.encoding:
            return self.body
        if self._inflater is None:  # fewer than two bytes of deflate
            if not self._head:
                raise InvalidInput(f"the {self.encoding} body is empty")
            self._inflater = zlib.decompressobj(-zlib.MAX_WBITS)
            self._inflate(self._head)
        if not self._inflater.eof:
            raise InvalidInput(f"the {self.encoding} body is truncated")
        return self.body


def split_body(body: bytes | bytearray, header_length: str | None) -> tuple[dict[str, Any], memoryview]:
    """Return the JSON header and the binary section that follows it."""
    if header_length is None:
        json_part, binary = body, memoryview(b"")
    else:
        try:
            length = int(header_length)
        except ValueError:
            raise InvalidInput(f"Inference-Header-Content-Length must be an integer, got {header_length!r}") from None
        if length < 0:
            raise InvalidInput(f"Inference-Header-Content-Length must not be negative, got {length}")
        if length > len(body):
            raise InvalidInput(f"Inference-Header-Content-Length is {length} but the body has only {len(body)} bytes")
        json_part, binary = body[:length], memoryview(body)[length:]
    try:
        header = loads(json_part)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"the request is not valid JSON: {exc}") from exc
    except RecursionError:
        raise InvalidInput(NESTED_TOO_DEEPLY) from None
    if not isinstance(header, dict):
        raise InvalidInput("the request must be a JSON object")
    return header, binary


_LONG_NUMBER = re.compile(rb"\d{20}")  # 20 digits may pass 2**64; 19 never do


def loads(data: bytes | bytearray | memoryview) -> Any:
    """Parse JSON with orjson (several times faster on tensor data); what orjson refuses goes to ``json``.

    orjson is stricter than the standard parser (bare NaN and Infinity, lone surrogates, deep
    nesting) and reads integers past 64 bits as floats; the standard parser's answer, or its error,
    is the one clients have always had: so a body orjson refuses, or one with a run of 20 digits,
    goes to ``json``, which decides.
    """
    if _LONG_NUMBER.search(data) is None:  # orjson would read an integer past 64 bits as a float
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(bytes(data) if isinstance(data, memoryview) else data)


def _shape(name: str, shape: Any, itemsize: int) -> list[int]:
    """A valid shape for ``name``; ``itemsize`` is its datatype's bytes per element (0 for BYTES)."""
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise InvalidInput(f"input '{name}': shape must be a list of integers, got {shape!r}")
    if any(d < 0 for d in shape):
        raise InvalidInput(f"input '{name}': shape {shape} has a negative dimension")
    if 0 not in shape:
        count = 1
        for d in shape:
            count *= d
            if count > MAX_INT64:  # stop here: a long list of huge dimensions makes a huge integer
                break
        if count <= MAX_INT64 and count * itemsize > MAX_INT64:  # as Triton words it
            raise InvalidInput(
                f"byte size overflow for input '{name}': element count ({count}) * data type size ({itemsize}) "
                f"exceeds maximum allowed size ({MAX_INT64})"
            )
        if count > MAX_ELEMENTS:
            raise InvalidInput(
                f"invalid shape for input '{name}': shape {shape} causes total element count to exceed maximum size "
                f"of {MAX_ELEMENTS}"
            )
    if any(d > MAX_ELEMENTS for d in shape):  # even beside a 0, numpy cannot shape an array like that
        raise InvalidInput(f"input '{name}': shape {shape} has a dimension larger than {MAX_ELEMENTS}")
    return shape


def _decode_bytes_elements(name: str, raw: memoryview, count: int) -> np.ndarray:
    values: list[bytes] = []
    offset = 0
    while offset < len(raw):
        if len(values) == count:  # stop here: a flood of tiny elements must not be allocated first
            raise InvalidInput(f"input '{name}': shape needs {count} BYTES elements, got more")
        if offset + 4 > len(raw):
            raise InvalidInput(f"input '{name}': BYTES data ends inside an element's 4-byte length")
        (size,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + size > len(raw):
            raise InvalidInput(f"input '{name}': BYTES element {len(values)} runs past the end of its data")
        values.append(bytes(raw[offset : offset + size]))
        offset += size
    if len(values) != count:
        raise InvalidInput(f"input '{name}': shape needs {count} BYTES elements, got {len(values)}")
    return string_array(name, values)


def string_array(name: str, values: list[Any]) -> np.ndarray:
    """An object array of ``str``: ONNX Runtime turns a ``bytes`` element into its repr ("b'...'")."""
    array = np.empty(len(values), dtype=object)
    for index, value in enumerate(values):
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidInput(
                    f"input '{name}': BYTES element {index} is not valid UTF-8, which ONNX Runtime string tensors need"
                ) from None
        elif not isinstance(value, str):
            raise InvalidInput(f"input '{name}': BYTES data must be strings, got {type(value).__name__}")
        array[index] = value
    return array


def _from_json_data(name: str, datatype: str, data: Any, count: int) -> np.ndarray:
    if data is None:
        raise InvalidInput(f"input '{name}' has neither 'data' nor parameters.binary_data_size")
    depth, first = 0, data
    while isinstance(first, list) and first:  # along the first elements: numpy refuses a ragged rest itself
        depth, first = depth + 1, first[0]
    if depth > MAX_DATA_DEPTH:
        raise InvalidInput(
            f"JSON nesting depth exceeds maximum allowed limit ({MAX_DATA_DEPTH}): input '{name}': data is nested "
            f"{depth} deep, and a tensor has at most {MAX_DATA_DEPTH} dimensions"
        )
    if datatype == "BYTES":
        array = string_array(name, list(np.asarray(data, dtype=object).reshape(-1)))
    else:
        try:
            if datatype == "FP16":
                with np.errstate(over="ignore"):  # an overflow (70000 -> inf) is refused below as not finite
                    array = np.asarray(data, dtype=np.float16).reshape(-1)
            else:
                array = np.asarray(data, dtype=NUMPY_OF[datatype]).reshape(-1)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidInput(f"input '{name}': data does not fit {datatype}: {exc}") from None
        if array.dtype.kind == "f":
            _refuse_non_finite(name, datatype, array)
    if array.size != count:
        raise InvalidInput(f"input '{name}': shape needs {count} values, got {array.size}")
    return array


def _refuse_non_finite(name: str, datatype: str, array: np.ndarray) -> None:
    """JSON has no NaN or Infinity (Python's parser accepts them as bare words); 1e400 also arrives as infinity."""
    finite = np.isfinite(array)
    if not finite.all():
        index = int(np.argmin(finite))
        value = _NON_FINITE[repr(float(array[index]))]
        raise InvalidInput(
            f"input '{name}': data[{index}] is {value} as {datatype}; JSON input data must be finite numbers "
            "(send NaN and Infinity as binary tensor data)"
        )


def _parameters(item: dict[str, Any], what: str) -> dict[str, Any]:
    parameters = item.get("parameters")
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise InvalidInput(f"{what}: 'parameters' must be an object, got {parameters!r}")
    return parameters


# --- Checks every transport shares (the REST body here, gRPC messages in inference/grpc/codec.py) ------------


def expected_inputs(signature: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The inputs a request may send, by name: the model's, and ``text`` when the version has a tokenizer."""
    expected = {spec["name"]: spec for spec in signature.get("inputs", [])}
    text = signature.get("text")
    if text is not None:
        expected[text["name"]] = text
    return expected


def check_input(
    name: str, datatype: Any, shape: Any, expected: dict[str, dict[str, Any]], seen: Container[str]
) -> tuple[list[int], int]:
    """An input's datatype and shape against the signature; returns the shape and its element count."""
    spec = expected.get(name)
    if spec is None:
        if name == TEXT_INPUT:
            raise InvalidInput(
                f"input '{name}' needs a version uploaded with a {TOKENIZER_FILE}, and this one has none; "
                f"send its inputs ({', '.join(sorted(expected)) or 'none'})"
            )
        raise InvalidInput(f"unknown input '{name}'; the model takes {', '.join(sorted(expected)) or 'none'}")
    if name in seen:
        raise InvalidInput(f"input '{name}' already exists in request: each input may be sent once")
    if not isinstance(datatype, str) or datatype not in NUMPY_OF:
        raise InvalidInput(f"input '{name}': unknown datatype {datatype!r}")
    if datatype != spec["datatype"]:
        raise InvalidInput(f"input '{name}': expected datatype {spec['datatype']}, got {datatype}")
    shape = _shape(name, shape, 0 if datatype == "BYTES" else np.dtype(NUMPY_OF[datatype]).itemsize)
    want = spec.get("shape")
    if "tokenizer" in spec and want is not None and len(shape) == len(want) + 1 and shape[-1] == 1:
        want = [*want, 1]  # texts as [n, 1] too: the way a batching client shapes one string per row
    if want is not None and (
        len(want) != len(shape) or any(w not in (-1, s) for w, s in zip(want, shape, strict=True))
    ):
        raise InvalidInput(f"input '{name}': expected shape {want}, got {shape}")
    return shape, math.prod(shape)


def check_all_inputs(expected: dict[str, dict[str, Any]], inputs: dict[str, np.ndarray]) -> None:
    """Every input the model needs is there; or ``text`` is, alone, with at least one text."""
    text = next((spec for spec in expected.values() if "tokenizer" in spec), None)
    if text is not None and text["name"] in inputs:
        others = sorted(inputs.keys() - {text["name"]})
        if others:
            raise InvalidInput(
                f"input '{text['name']}' takes the place of the token inputs; send it alone, or the token inputs "
                f"without it (got {', '.join(others)} too)"
            )
        if inputs[text["name"]].size == 0:
            raise InvalidInput(f"input '{text['name']}' has no texts")
        return
    missing = sorted(expected.keys() - inputs.keys() - ({text["name"]} if text else set()))
    if missing:
        raise InvalidInput(f"missing input(s): {', '.join(missing)}")


def binary_tensor(
    name: str, datatype: str, raw: memoryview | bytes | bytearray, shape: list[int], count: int, *, size_name: str
) -> np.ndarray:
    """One input from its binary form: little-endian elements, or BYTES elements each after a 4-byte length."""
    if datatype == "BYTES":
        return _decode_bytes_elements(name, memoryview(raw), count).reshape(shape)
    dtype = np.dtype(NUMPY_OF[datatype]).newbyteorder("<")
    if len(raw) != count * dtype.itemsize:
        raise InvalidInput(
            f"input '{name}': shape {shape} of {datatype} needs {count * dtype.itemsize} bytes, "
            f"got {size_name} {len(raw)}"
        )
    return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="), copy=False).reshape(shape)


def check_outputs(
    requested: Iterable[tuple[Any, dict[str, Any]]], signature: dict[str, Any]
) -> tuple[list[str], dict[str, int]]:
    """The requested outputs (name, parameters) in order: each known and asked once; and their classification counts."""
    datatypes = {spec["name"]: spec["datatype"] for spec in signature.get("outputs", [])}
    outputs: list[str] = []
    classification: dict[str, int] = {}
    for name, parameters in requested:
        if not isinstance(name, str) or name not in datatypes:
            raise InvalidInput(f"unknown output {name!r}; the model gives {', '.join(datatypes)}")
        if name in outputs:
            raise InvalidInput(f"output '{name}' already exists in request: each output may be asked for once")
        outputs.append(name)
        count = parameters.get("classification")
        if count is not None:
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                raise InvalidInput(f"output '{name}': classification must be a positive integer, got {count!r}")
            if datatypes[name] in ("BYTES", "BOOL"):
                raise InvalidInput(f"output '{name}': classification needs a numeric output, not {datatypes[name]}")
            classification[name] = count
    return outputs, classification


def check_scheduling(priority: Any, timeout: Any) -> tuple[int, int | None]:
    """Triton's ``priority`` and ``timeout`` (microseconds) request parameters, both uint64."""
    if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= MAX_UINT64:
        raise InvalidInput(f"parameters.priority must be a non-negative integer, got {priority!r}")
    if timeout is not None and (
        not isinstance(timeout, int) or isinstance(timeout, bool) or not 0 <= timeout <= MAX_UINT64
    ):
        raise InvalidInput(f"parameters.timeout must be a non-negative integer (microseconds), got {timeout!r}")
    return priority, timeout or None


# What a transport hands the decoder: the caller's shared memory regions, asked for only by a request that names one
# (it raises ``Unsupported`` when shared memory is turned off).
RegionsOf = Callable[[], Mapping[str, Region]]


def client_regions(regions: RegionsOf | None, what: str) -> Mapping[str, Region]:
    """The caller's regions, for ``what`` (a tensor) that names one; refused where no transport offers any."""
    if regions is None:
        raise InvalidInput(f"{what}: shared memory regions are for /v2 and gRPC inference requests, not this one")
    return regions()


def shared_input(
    name: str, datatype: str, parameters: Mapping[str, Any], shape: list[int], count: int, regions: RegionsOf | None
) -> np.ndarray:
    """An input read from the shared memory region its parameters name: copied out, in the binary form."""
    what = f"input '{name}'"
    where = placement(what, parameters, client_regions(regions, what))
    if datatype != "BYTES":  # before copying anything: the size is known
        need = count * np.dtype(NUMPY_OF[datatype]).itemsize
        if where.byte_size != need:
            raise InvalidInput(
                f"{what}: shape {shape} of {datatype} needs {need} bytes, got {BYTE_SIZE} {where.byte_size}"
            )
    raw = where.region.read(where.offset, where.byte_size)
    return binary_tensor(name, datatype, raw, shape, count, size_name=BYTE_SIZE)


def shared_outputs(
    requested: Iterable[tuple[Any, Mapping[str, Any]]], classification: Container[str], regions: RegionsOf | None
) -> dict[str, SharedOutput] | None:
    """The requested outputs whose parameters name a shared memory region, and where each goes; None for none."""
    placed: dict[str, SharedOutput] | None = None
    for name, parameters in requested:
        if REGION not in parameters:
            continue
        what = f"output '{name}'"
        if name in classification:
            raise InvalidInput(f"{what}: classification results cannot be written to shared memory")
        if placed is None:
            placed = {}
        placed[name] = placement(what, parameters, client_regions(regions, what))
    return placed


# --- The REST body ---------------------------------------------------------------------------------------------


def decode_request(
    body: bytes | bytearray,
    header_length: str | None,
    signature: dict[str, Any],
    *,
    model: str = "",
    regions: RegionsOf | None = None,
) -> InferRequest:
    """A /v2 request body (JSON, JSON followed by binary tensors, or one raw tensor) checked against ``signature``.

    ``model``, the model's name, is for the messages that Triton words with it. ``regions`` gives the
    caller's shared memory regions, for inputs read from them and outputs written to them.
    """
    if header_length is not None and header_length.strip() == "0":
        return decode_raw_request(body, signature, model=model)
    header, binary = split_body(body, header_length)
    expected = expected_inputs(signature)
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("the request needs a non-empty 'inputs' list")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for item in raw_inputs:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidInput(f"each input needs a 'name', got {item!r}")
        name = item["name"]
        shape, count = check_input(name, item.get("datatype"), item.get("shape"), expected, inputs)
        datatype: str = item["datatype"]  # a known datatype by now
        options = _parameters(item, f"input '{name}'")
        size = options.get("binary_data_size")
        if size is not None:
            if REGION in options:
                raise InvalidInput(f"input '{name}' has binary_data_size as well as {REGION}; send one or the other")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InvalidInput(f"input '{name}': binary_data_size must be a non-negative integer")
            if offset + size > len(binary):
                raise InvalidInput(
                    f"input '{name}': binary_data_size {size} runs past the end of the body "
                    f"({len(binary) - offset} bytes left)"
                )
            raw = binary[offset : offset + size]
            offset += size
            inputs[name] = binary_tensor(name, datatype, raw, shape, count, size_name="binary_data_size")
        elif REGION in options:
            if item.get("data") is not None:
                raise InvalidInput(f"input '{name}' has data as well as {REGION}; send one or the other")
            inputs[name] = shared_input(name, datatype, options, shape, count, regions)
        else:
            inputs[name] = _from_json_data(name, datatype, item.get("data"), count).reshape(shape)
    if offset != len(binary):
        raise InvalidInput(f"the body has {len(binary) - offset} bytes of binary data that no input claims")
    check_all_inputs(expected, inputs)

    parameters = header.get("parameters")
    parameters = {} if parameters is None else parameters
    if not isinstance(parameters, dict):
        raise InvalidInput("'parameters' must be an object")
    names = [spec["name"] for spec in signature.get("outputs", [])]
    requested = header.get("outputs")
    binary_all = bool(parameters.get("binary_data_output", False))
    classification: dict[str, int] = {}
    placed = None
    if requested is None:
        outputs, binary_outputs = names, set(names) if binary_all else set()
    else:
        if not isinstance(requested, list):
            raise InvalidInput("'outputs' must be a list")
        asked = []
        for item in requested:
            if not isinstance(item, dict):
                raise InvalidInput(f"unknown output {item!r}; the model gives {', '.join(names)}")
            name = item.get("name")
            asked.append((name, _parameters(item, f"output '{name}'") if name in names else {}))
        outputs, classification = check_outputs(asked, signature)
        binary_outputs = {name for name, options in asked if options.get("binary_data", binary_all)}
        placed = shared_outputs(asked, classification, regions)
    request_id = header.get("id")
    if request_id is not None and (not isinstance(request_id, str | int | float) or isinstance(request_id, bool)):
        raise InvalidInput(f"'id' must be a string, got {type(request_id).__name__}")
    priority, timeout = check_scheduling(parameters.get("priority", 0), parameters.get("timeout"))
    return InferRequest(
        id=None if request_id is None else str(request_id),
        inputs=inputs,
        outputs=outputs,
        binary_outputs=binary_outputs,
        signature=signature,
        priority=priority,
        timeout_us=timeout,
        classification=classification,
        shared_outputs=placed,
    )


RAW_REQUEST = "a raw binary request (Inference-Header-Content-Length: 0)"


def decode_raw_request(body: bytes | bytearray, signature: dict[str, Any], *, model: str = "") -> InferRequest:
    """Triton's raw binary request: the body is the data of the model's one input, with no JSON header.

    The shape is the input's own (batch-1 for a batching model), its one dynamic dimension, if any,
    deduced from the body's size; a BYTES input must hold one element, which is the whole body.
    Every output comes back as binary data.
    """
    inputs = signature.get("inputs", [])
    if len(inputs) != 1:
        configuration = f"'{model}' model configuration" if model else "the model configuration"
        raise InvalidInput(
            f"Raw request must only have 1 input (found 1) to be deduced but got {len(inputs)} inputs in "
            f"{configuration}: {RAW_REQUEST} needs a model with exactly one input; this one takes {len(inputs)} "
            f"({', '.join(spec['name'] for spec in inputs)}): send a JSON header with the inputs described"
        )
    spec = inputs[0]
    name, datatype, dims = spec["name"], spec["datatype"], list(spec.get("shape") or [])
    shape = [1, *dims[1:]] if can_batch(signature) else dims
    dynamic = [axis for axis, d in enumerate(shape) if d < 0]
    if datatype == "BYTES":
        if dynamic or int(np.prod(shape)) != 1:
            raise InvalidInput(
                f"For BYTE datatype raw input '{name}', the model must have input shape [1]: {RAW_REQUEST} of BYTES "
                f"needs an input of one element; input '{name}' has shape {dims}"
            )
        array = string_array(name, [bytes(body)]).reshape(shape)
    else:
        if len(dynamic) > 1:
            raise InvalidInput(
                f"The shape of the raw input '{name}' can not be deduced because there are more than one "
                f"variable-sized dimension: {RAW_REQUEST}: the shape of input '{name}' {dims} cannot be deduced from "
                "the body's size; send a JSON header with the shape"
            )
        itemsize = np.dtype(NUMPY_OF[datatype]).itemsize
        known = int(np.prod([d for d in shape if d >= 0])) * itemsize
        if dynamic:
            if not known or len(body) % known:
                raise InvalidInput(
                    f"{RAW_REQUEST}: the body's {len(body)} bytes do not fill input '{name}' of {datatype} {dims}: "
                    f"its dynamic dimension takes {known} bytes a step"
                )
            shape[dynamic[0]] = len(body) // known
        count = int(np.prod(shape))
        array = binary_tensor(name, datatype, memoryview(body), shape, count, size_name="a body of")
    names = [output["name"] for output in signature.get("outputs", [])]
    return InferRequest(
        id=None,
        inputs={name: array},
        outputs=names,
        binary_outputs=set(names),
        signature=signature,
    )


def output_datatype(array: np.ndarray) -> str:
    """The protocol's datatype of an output array (numpy's name for a dtype the protocol has no name for)."""
    dtype = array.dtype
    datatype = _DATATYPE_OF_DTYPE.get(dtype)
    if datatype is None:
        if dtype.kind in "OSU":  # strings: not remembered, as every length is a dtype of its own
            return "BYTES"
        datatype = PROTOCOL_OF.get(dtype.str) or PROTOCOL_OF.get(dtype.newbyteorder("<").str) or str(dtype)
        _DATATYPE_OF_DTYPE[dtype] = datatype
    return datatype


_DATATYPE_OF_DTYPE: dict[np.dtype[Any], str] = {}  # output_datatype's answers for the few numeric dtypes


def binary_view(array: np.ndarray, datatype: str) -> bytes | memoryview:
    """An output in the binary form: little-endian elements, or BYTES elements each after a 4-byte length.

    Numbers come as a view of the (little-endian, contiguous) array's own memory, not a copy.
    """
    if datatype == "BYTES":
        return _bytes_payload(array)
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return memoryview(data.data).cast("B") if data.size else b""  # an empty view cannot be cast


def binary_output(array: np.ndarray, datatype: str) -> bytes:
    """:func:`binary_view` as ``bytes`` (what a protobuf field takes): one copy of the elements."""
    return bytes(binary_view(array, datatype))


def _bytes_payload(array: np.ndarray) -> bytes:
    parts = []
    for value in array.reshape(-1):
        data = value if isinstance(value, bytes) else str(value).encode()
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


# Arrays orjson writes itself (OPT_SERIALIZE_NUMPY), with no Python float or int per element.
_ORJSON_NUMPY = frozenset(
    np.dtype(t).str
    for t in (
        *(np.float32, np.float64),
        *(np.int8, np.int16, np.int32, np.int64),
        *(np.uint8, np.uint16, np.uint32, np.uint64),
        np.bool_,
    )
)


def _json_data(array: np.ndarray, datatype: str) -> list[Any] | np.ndarray:
    """An output's ``data`` for JSON, given its :func:`output_datatype`."""
    flat = array.reshape(-1)
    if datatype == "BYTES":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat]
    if flat.dtype.str in _ORJSON_NUMPY and (flat.dtype.kind != "f" or np.isfinite(flat).all()):
        return np.ascontiguousarray(flat)  # orjson writes it; floats in their shortest form for their width
    values = list(flat.tolist())
    if flat.dtype.kind == "f" and not np.isfinite(flat).all():
        # JSON has no NaN or Infinity: send them as strings, as the proto3 JSON mapping does (numpy parses them back).
        values = [v if math.isfinite(v) else _NON_FINITE[repr(v)] for v in values]
    return values


def encode_response(
    *, model: str, version: str, request: InferRequest, values: dict[str, np.ndarray], cached: bool | None = None
) -> tuple[bytes, dict[str, str]]:
    """The response body and headers: plain JSON, or JSON followed by binary outputs."""
    outputs = []
    blobs: list[bytes | memoryview] = []
    shared = request.shared_outputs
    for name in request.outputs:
        array = values[name]
        entry: dict[str, Any] = {"name": name, "datatype": output_datatype(array), "shape": list(array.shape)}
        if shared is not None and name in shared:  # written into the client's region: no data in the answer
            entry["parameters"] = write_output(name, shared[name], binary_view(array, entry["datatype"]))
        elif name in request.binary_outputs:
            blob = binary_view(array, entry["datatype"])
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = _json_data(array, entry["datatype"])
        outputs.append(entry)
    body: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": outputs}
    if request.id is not None:
        body["id"] = request.id
    if cached is not None:
        body["parameters"] = {"cached": cached}
    header = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return header, {"content-type": "application/json"}
    # One copy of each output's bytes, straight from its array into the body.
    return b"".join([header, *blobs]), {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(len(header)),
    }
