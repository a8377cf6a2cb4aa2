"""A constant-memory structural check of an ONNX ``ModelProto`` as its bytes stream past.

It walks only the top-level protobuf fields, skipping the (possibly huge) graph payload, and
so tells "not ONNX", "truncated" and "IR version too new" apart without loading the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# ModelProto field numbers and their protobuf wire types (0 = varint, 2 = length-delimited).
_VARINT, _LEN = 0, 2
_MODEL_FIELDS = {
    1: _VARINT,  # ir_version
    2: _LEN,  # producer_name
    3: _LEN,  # producer_version
    4: _LEN,  # domain
    5: _VARINT,  # model_version
    6: _LEN,  # doc_string
    7: _LEN,  # graph
    8: _LEN,  # opset_import
    14: _LEN,  # metadata_props
    20: _LEN,  # training_info
    25: _LEN,  # functions
    26: _LEN,  # configuration
}
_CAPTURED = {2, 3, 8}
_MAX_CAPTURE = 64 * 1024


class NotOnnx(ValueError):
    """The bytes are not a well-formed ONNX model; the message says why."""


@dataclass
class SniffResult:
    ir_version: int | None = None
    producer_name: str = ""
    producer_version: str = ""
    opsets: dict[str, int] = field(default_factory=dict)
    has_graph: bool = False
    size: int = 0


def _read_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int] | None:
    """Decode a varint at ``pos``; None if the buffer ends inside it."""
    result = shift = 0
    while pos < len(buf):
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise NotOnnx("the file is not an ONNX model (malformed protobuf varint)")
    return None


def _parse_opset(payload: bytes) -> tuple[str, int]:
    domain, version, pos = "", 0, 0
    while pos < len(payload):
        head = _read_varint(payload, pos)
        if head is None:
            raise NotOnnx("the file is not an ONNX model (malformed opset_import)")
        tag, pos = head
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            value = _read_varint(payload, pos)
            if value is None:
                raise NotOnnx("the file is not an ONNX model (malformed opset_import)")
            if number == 2:
                version = value[0]
            pos = value[1]
        elif wire == _LEN:
            length = _read_varint(payload, pos)
            if length is None or length[1] + length[0] > len(payload):
                raise NotOnnx("the file is not an ONNX model (malformed opset_import)")
            if number == 1:
                domain = bytes(payload[length[1] : length[1] + length[0]]).decode("utf-8", "replace")
            pos = length[1] + length[0]
        else:
            raise NotOnnx("the file is not an ONNX model (malformed opset_import)")
    return domain or "ai.onnx", version


class OnnxSniffer:
    """Feed chunks with :meth:`feed`, then call :meth:`finish` for the result."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._skip = 0
        self.result = SniffResult()

    def feed(self, data: bytes) -> None:
        self.result.size += len(data)
        view = memoryview(data)
        if self._skip:
            taken = min(self._skip, len(view))
            self._skip -= taken
            view = view[taken:]
        if view:
            self._buf += view
            self._parse()

    def _parse(self) -> None:
        buf, pos = self._buf, 0
        while pos < len(buf):
            head = _read_varint(buf, pos)
            if head is None:
                break
            tag, body = head
            number, wire = tag >> 3, tag & 7
            if _MODEL_FIELDS.get(number) != wire:
                offset = self.result.size - len(buf) + pos
                raise NotOnnx(f"the file is not an ONNX model (unexpected protobuf field {number} at byte {offset})")
            if wire == _VARINT:
                value = _read_varint(buf, body)
                if value is None:
                    break
                if number == 1:
                    self.result.ir_version = value[0]
                pos = value[1]
                continue
            length_head = _read_varint(buf, body)
            if length_head is None:
                break
            length, start = length_head
            if number in _CAPTURED and length <= _MAX_CAPTURE:
                if start + length > len(buf):
                    break  # wait for the whole small field
                self._capture(number, bytes(buf[start : start + length]))
                pos = start + length
                continue
            if number == 7:
                self.result.has_graph = True
            available = len(buf) - start
            if length <= available:
                pos = start + length
            else:
                self._skip = length - available
                pos = len(buf)
        del self._buf[:pos]

    def _capture(self, number: int, payload: bytes) -> None:
        if number == 2:
            self.result.producer_name = payload.decode("utf-8", "replace")
        elif number == 3:
            self.result.producer_version = payload.decode("utf-8", "replace")
        else:
            domain, version = _parse_opset(payload)
            self.result.opsets[domain] = version

    def finish(self) -> SniffResult:
        if self.result.size == 0:
            raise NotOnnx("the file is empty")
        if self._skip or self._buf:
            raise NotOnnx(
                f"the file is truncated: it ends after {self.result.size} bytes, in the middle of a protobuf field"
            )
        if not self.result.has_graph:
            raise NotOnnx("the file is not an ONNX model (it has no graph)")
        if self.result.ir_version is None:
            raise NotOnnx("the file is not an ONNX model (it has no ir_version)")
        return self.result
