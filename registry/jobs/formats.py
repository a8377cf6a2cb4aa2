"""A job's input and result files: checking an input against the version's signature, splitting it into
chunk files, and assembling the chunks' outputs into the result.

Inputs (``InferenceJobFormat``):

- ``npz``: one array per model input, named after it, the first dimension the rows (``np.savez``). Only
  the headers are read to check it (names, dtypes, shapes, rows), and a chunk's rows are read straight
  from each member, so no more than one chunk is ever in memory.
- ``jsonl``: one v2 request body per line (``{"inputs": [{"name", "datatype", "shape", "data"}]}``, JSON
  tensors only); each line is one row, answered by one line of the result.
- ``text``: one text per line (UTF-8), for a version with a tokenizer; a chunk is an ``.npz`` with one
  array ``text`` of numpy unicode strings.

A result is JSON Lines (the chunks' lines in order; for text, one line per text with that row's v2
``outputs``) or ``.npz``: each output's rows of every chunk in order, written as one ``.npy`` member of a
zip whose header names the whole shape before the first chunk's bytes follow, so it too is written one
chunk at a time. Every refusal is an :class:`~registry.errors.InvalidInput` whose message says what to fix.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import numpy as np

from onnxkit.datatypes import NUMPY_OF
from registry.errors import InvalidInput
from registry.models import InferenceJobFormat, ModelVersion

NPZ, JSONL, TEXT, V2 = (
    InferenceJobFormat.NPZ.value,
    InferenceJobFormat.JSONL.value,
    InferenceJobFormat.TEXT.value,
    InferenceJobFormat.V2.value,
)
# The formats a batch job's input may have, by the input file's suffix.
SUFFIX_FORMATS = {".npz": NPZ, ".jsonl": JSONL, ".txt": TEXT}
INPUT_SUFFIX = {NPZ: "npz", JSONL: "jsonl", TEXT: "txt", V2: "json"}
CHUNK_INPUT_SUFFIX = {NPZ: "npz", JSONL: "jsonl", TEXT: "npz", V2: "json"}
CHUNK_OUTPUT_SUFFIX = {NPZ: "npz", JSONL: "jsonl", TEXT: "npz", V2: "json"}
# The result formats each input format offers; the first is the default.
RESULT_FORMATS = {NPZ: ("npz",), JSONL: ("jsonl",), TEXT: ("jsonl", "npz")}
RESULT_SUFFIX = {"npz": "npz", "jsonl": "jsonl", "json": "json"}
CONTENT_TYPES = {"npz": "application/zip", "jsonl": "application/jsonl", "json": "application/json"}
TEXT_ARRAY = "text"
# An .npy header this long is no array a model takes (numpy itself refuses past 10,000 by default).
MAX_HEADER = 10_000
READ_BLOCK = 1024 * 1024

_PROTOCOL_OF: dict[np.dtype[Any], str] = {np.dtype(kind): name for name, kind in NUMPY_OF.items() if name != "BYTES"}


# --- The job's options -------------------------------------------------------------------------------


def format_of(fmt: str | None, name: str) -> str:
    """The input's format: ``fmt`` when given, else from the suffix of ``name`` (a file name or a key)."""
    if fmt:
        if fmt not in RESULT_FORMATS:
            raise InvalidInput(f"unknown input format '{fmt}': use npz, jsonl or text")
        return fmt
    suffix = PurePosixPath(name).suffix.lower()
    if suffix not in SUFFIX_FORMATS:
        raise InvalidInput(
            f"unknown input suffix '{suffix or '(none)'}' of '{name}': send .npz (one array per model input), "
            ".jsonl (one v2 request body per line) or .txt (one text per line)"
        )
    return SUFFIX_FORMATS[suffix]


def check_model_takes(fmt: str, version: ModelVersion) -> None:
    """Text needs a version with a tokenizer (its signature then has a ``text`` entry)."""
    if fmt == TEXT and not version.signature.get("text"):
        raise InvalidInput(
            f"text input needs a model with a tokenizer: version {version.version} of '{version.model.name}' "
            "has no tokenizer.json; send .npz or .jsonl"
        )


def checked_outputs(outputs: Sequence[str] | None, signature: dict[str, Any]) -> list[str]:
    """The outputs asked for, each one of the model's, in order without repeats; none means all."""
    known = [spec["name"] for spec in signature.get("outputs", [])]
    chosen: list[str] = []
    for name in outputs or ():
        if name not in known:
            raise InvalidInput(f"the model has no output '{name}'; its outputs are {', '.join(known) or 'none'}")
        if name not in chosen:
            chosen.append(name)
    return chosen


def result_format_of(fmt: str, result_format: str | None) -> str:
    """The result's format: ``result_format`` if this input offers it, else the input's default."""
    offered = RESULT_FORMATS.get(fmt, ("json",))
    if not result_format:
        return offered[0]
    if result_format not in offered:
        raise InvalidInput(
            f"result_format '{result_format}' is not offered for {fmt} input; use {' or '.join(offered)}"
        )
    return result_format


# --- v2 request bodies --------------------------------------------------------------------------------


def check_v2_text(body: bytes, signature: dict[str, Any], *, where: str) -> dict[str, Any]:
    """Parse one v2 request body and check it against ``signature``; ``where`` names it in a refusal."""
    try:
        request = json.loads(body)
    except UnicodeDecodeError:
        raise InvalidInput(f"{where} is not a v2 request body: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{where} is not a v2 request body: not JSON ({exc.msg} at column {exc.colno})") from None
    check_v2(request, signature, where=where)
    return request


def check_v2(request: Any, signature: dict[str, Any], *, where: str) -> None:
    """The request is a v2 body of JSON tensors for this model: known inputs, their datatypes, and all of them."""

    def refuse(problem: str) -> InvalidInput:
        return InvalidInput(f"{where} is not a v2 request body: {problem}")

    if not isinstance(request, dict):
        raise refuse('expected a JSON object with "inputs"')
    tensors = request.get("inputs")
    if not isinstance(tensors, list) or not tensors:
        raise refuse('"inputs" must be a list of tensors')
    specs = {spec["name"]: spec for spec in signature.get("inputs", [])}
    text = signature.get("text")
    if text:
        specs[text["name"]] = {"name": text["name"], "datatype": text["datatype"], "shape": text["shape"]}
    given = set()
    for number, tensor in enumerate(tensors, 1):
        if not isinstance(tensor, dict) or not all(key in tensor for key in ("name", "datatype", "shape", "data")):
            raise refuse(f"input {number} needs name, datatype, shape and data")
        name, datatype, shape = tensor["name"], tensor["datatype"], tensor["shape"]
        if not isinstance(name, str) or not isinstance(datatype, str):
            raise refuse(f"input {number}: name and datatype must be strings")
        params = tensor.get("parameters")
        if isinstance(params, dict) and "binary_data_size" in params:
            raise refuse(f"input '{name}' is binary; a job's requests carry JSON tensors only")
        if not isinstance(shape, list) or not all(isinstance(dim, int) and dim >= 0 for dim in shape):
            raise refuse(f"input '{name}': shape must be a list of non-negative integers")
        if not isinstance(tensor["data"], list):
            raise refuse(f"input '{name}': data must be a JSON list")
        spec = specs.get(name)
        if spec is None:
            raise refuse(f"the model has no input '{name}'; its inputs are {', '.join(specs) or 'none'}")
        if datatype != spec["datatype"]:
            raise refuse(f"input '{name}' is {datatype}; the model takes {spec['datatype']}")
        given.add(name)
    if text and text["name"] in given:
        return  # the token inputs are made from the text
    missing = [name for name in specs if name not in given and not (text and name == text["name"])]
    if missing:
        raise refuse(f"input '{missing[0]}' is missing")


# --- Reading an input -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrayHeader:
    """One ``.npy`` member of an ``.npz``: its name, shape and dtype, and the zip member it is."""

    name: str
    member: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    fortran: bool


def _read_header(stream: BinaryIO) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream, max_header_size=MAX_HEADER)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream, max_header_size=MAX_HEADER)
    else:
        raise ValueError(f".npy format version {version[0]}.{version[1]}; save it with np.savez")
    return tuple(shape), bool(fortran), np.dtype(dtype)


def npz_headers(path: Path, what: str = "the .npz input") -> list[ArrayHeader]:
    """The arrays of an ``.npz`` file, from their headers alone."""
    headers = []
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    raise InvalidInput(
                        f"{what} holds '{info.filename}', which is not an .npy array; save it with np.savez"
                    )
                with archive.open(info) as member:
                    try:
                        shape, fortran, dtype = _read_header(member)  # type: ignore[arg-type]
                    except ValueError as exc:
                        raise InvalidInput(f"{what}: '{info.filename}' is not a readable .npy array: {exc}") from None
                headers.append(ArrayHeader(info.filename[: -len(".npy")], info.filename, shape, dtype, fortran))
    except (zipfile.BadZipFile, EOFError, OSError):
        raise InvalidInput(
            f"{what} is not a zip of .npy arrays; save it with np.savez or np.savez_compressed"
        ) from None
    return headers


def _dtype_fits(dtype: np.dtype[Any], datatype: str) -> bool:
    if datatype == "BYTES":
        return dtype.kind in "US"
    expected = NUMPY_OF.get(datatype)
    if expected is None:
        return False
    expected = np.dtype(expected)
    return dtype.kind == expected.kind and dtype.itemsize == expected.itemsize


def check_npz(headers: list[ArrayHeader], signature: dict[str, Any]) -> int:
    """The ``.npz`` arrays against the model's inputs: one each, its dtype and shape, the same rows; the rows."""
    specs = {spec["name"]: spec for spec in signature.get("inputs", [])}
    names = [header.name for header in headers]
    for name in specs:
        if name not in names:
            raise InvalidInput(
                f"the .npz input has no array for the model's input '{name}' (it has {', '.join(names) or 'none'})"
            )
    rows: dict[str, int] = {}
    for header in headers:
        spec = specs.get(header.name)
        if spec is None:
            raise InvalidInput(
                f"the .npz input's array '{header.name}' is not an input of the model; "
                f"its inputs are {', '.join(specs)}"
            )
        if header.dtype.hasobject:
            raise InvalidInput(f"array '{header.name}' holds Python objects; save it with a numeric or string dtype")
        if not _dtype_fits(header.dtype, spec["datatype"]):
            wanted = (
                "a string dtype" if spec["datatype"] == "BYTES" else str(np.dtype(NUMPY_OF.get(spec["datatype"], "V")))
            )
            raise InvalidInput(
                f"array '{header.name}' has dtype {header.dtype}, but input '{header.name}' is {spec['datatype']} "
                f"({wanted})"
            )
        if header.fortran and len(header.shape) > 1:
            raise InvalidInput(
                f"array '{header.name}' is stored in Fortran order; save it C-contiguous (np.ascontiguousarray)"
            )
        if not header.shape:
            raise InvalidInput(f"array '{header.name}' is a scalar; its first dimension must be the rows")
        expected = spec.get("shape")
        if expected is not None:
            if len(expected) != len(header.shape):
                raise InvalidInput(
                    f"array '{header.name}' has shape {list(header.shape)}, but input '{header.name}' has "
                    f"{len(expected)} dimensions {expected}"
                )
            for axis in range(1, len(expected)):
                if expected[axis] > 0 and expected[axis] != header.shape[axis]:
                    raise InvalidInput(
                        f"array '{header.name}' has shape {list(header.shape)}, but input '{header.name}' needs "
                        f"{expected[axis]} in dimension {axis} {expected}"
                    )
        rows[header.name] = header.shape[0]
    if len(set(rows.values())) > 1:
        listed = ", ".join(f"'{name}' has {count}" for name, count in rows.items())
        raise InvalidInput(f"the .npz input's arrays have different numbers of rows: {listed}")
    return next(iter(rows.values()), 0)


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """The lines of a file, numbered from 1, without their line ends; a last line end starts no line."""
    with path.open("rb") as stream:
        for number, raw in enumerate(stream, 1):
            yield number, raw.rstrip(b"\n").removesuffix(b"\r")


def _text_of(number: int, raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise InvalidInput(f"line {number} is not UTF-8 text") from None


def _checked_line(number: int, raw: bytes, signature: dict[str, Any]) -> None:
    if not raw.strip():
        raise InvalidInput(f"line {number} is empty; each line must be a v2 request body")
    check_v2_text(raw, signature, where=f"line {number}")


def inspect(path: Path, fmt: str, signature: dict[str, Any]) -> int:
    """Check the input file at ``path`` against the version's ``signature``; its rows."""
    if fmt == NPZ:
        rows = check_npz(npz_headers(path), signature)
    elif fmt == JSONL:
        rows = 0
        for number, raw in _lines(path):
            _checked_line(number, raw, signature)
            rows = number
    elif fmt == TEXT:
        rows = 0
        for number, raw in _lines(path):
            _text_of(number, raw)
            rows = number
    else:
        raise InvalidInput(f"unknown input format '{fmt}'")
    if rows == 0:
        raise InvalidInput("the input has no rows")
    return rows


# --- Splitting into chunks ------------------------------------------------------------------------------


def _npz_bytes(arrays: dict[str, np.ndarray]) -> io.BytesIO:
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]
    out.seek(0)
    return out


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    parts, left = [], size
    while left:
        data = stream.read(min(left, READ_BLOCK * 16))
        if not data:
            raise InvalidInput("the .npz input ends inside an array; it is truncated")
        parts.append(data)
        left -= len(data)
    return b"".join(parts)


def split(path: Path, fmt: str, signature: dict[str, Any], chunk_rows: int) -> Iterator[tuple[int, int, BinaryIO]]:
    """The chunks of the input at ``path``: ``(start, stop, chunk file)``, one in memory at a time."""
    if fmt == NPZ:
        yield from _split_npz(path, signature, chunk_rows)
    elif fmt == JSONL:
        yield from _split_lines(path, chunk_rows, signature, text=False)
    elif fmt == TEXT:
        yield from _split_lines(path, chunk_rows, signature, text=True)
    else:
        raise InvalidInput(f"unknown input format '{fmt}'")


def _split_npz(path: Path, signature: dict[str, Any], chunk_rows: int) -> Iterator[tuple[int, int, BinaryIO]]:
    headers = npz_headers(path)
    rows = check_npz(headers, signature)
    with zipfile.ZipFile(path) as archive:
        members = {}
        try:
            for header in headers:
                member = archive.open(header.member)
                members[header.name] = member
                _read_header(member)  # type: ignore[arg-type]  # past the header to the data
            for start in range(0, rows, chunk_rows):
                stop = min(rows, start + chunk_rows)
                arrays = {}
                for header in headers:
                    rest = header.shape[1:]
                    size = (stop - start) * math.prod(rest) * header.dtype.itemsize
                    data = _read_exactly(members[header.name], size)  # type: ignore[arg-type]
                    arrays[header.name] = np.frombuffer(data, dtype=header.dtype).reshape((stop - start, *rest))
                yield start, stop, _npz_bytes(arrays)
        finally:
            for member in members.values():
                member.close()


def _split_lines(
    path: Path, chunk_rows: int, signature: dict[str, Any], *, text: bool
) -> Iterator[tuple[int, int, BinaryIO]]:
    batch: list[bytes] = []
    start = rows = 0
    for number, raw in _lines(path):
        if text:
            _text_of(number, raw)
        else:
            _checked_line(number, raw, signature)
        batch.append(raw)
        rows = number
        if len(batch) == chunk_rows:
            yield start, rows, _chunk_of(batch, text=text)
            batch, start = [], rows
    if batch:
        yield start, rows, _chunk_of(batch, text=text)


def _chunk_of(lines: list[bytes], *, text: bool) -> BinaryIO:
    if text:
        return _npz_bytes({TEXT_ARRAY: np.array([line.decode() for line in lines], dtype=np.str_)})
    return io.BytesIO(b"".join(line + b"\n" for line in lines))


# --- Assembling the result --------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One chunk's output, copied to a local file: rows ``[start, start + rows)`` of the job."""

    path: Path
    rows: int
    start: int

    @property
    def where(self) -> str:
        return f"the output of rows [{self.start}, {self.start + self.rows})"


def assemble(fmt: str, result_format: str, parts: Sequence[Part], out: BinaryIO, *, outputs: Sequence[str]) -> None:
    """Write the result of a job of ``fmt`` input from its chunks' outputs, in order, to ``out``."""
    if fmt == JSONL:
        _concat_lines(parts, out)
    elif result_format == "npz":
        _npz_result(parts, out, outputs)
    else:
        _rows_as_lines(parts, out, outputs)


def _concat_lines(parts: Sequence[Part], out: BinaryIO) -> None:
    for part in parts:
        count = 0
        last = b"\n"
        with part.path.open("rb") as stream:
            for line in stream:
                count += 1
                last = line[-1:]
                out.write(line)
        if last != b"\n":
            out.write(b"\n")
        if count != part.rows:
            raise InvalidInput(f"{part.where} has {count} lines; {part.rows} were expected")


def _wanted(names: Sequence[str], outputs: Sequence[str]) -> list[str]:
    return [name for name in names if not outputs or name in outputs]


def _npz_result(parts: Sequence[Part], out: BinaryIO, outputs: Sequence[str]) -> None:
    """One ``.npy`` member per output: the header with every chunk's rows, then each chunk's bytes in turn.

    Text models' sequence outputs are cut to each chunk's longest text, so their later dimensions may
    differ between chunks: each is padded with zeros to the largest.
    """
    layout: dict[str, tuple[np.dtype[Any], list[int]]] = {}
    order: list[str] = []
    for part in parts:
        headers = {header.name: header for header in npz_headers(part.path, part.where)}
        names = _wanted(list(headers), outputs)
        if not order:
            order = names
        elif sorted(names) != sorted(order):
            raise InvalidInput(f"{part.where} has the outputs {', '.join(names)}, not {', '.join(order)}")
        for name in names:
            header = headers[name]
            if header.dtype.hasobject or not header.shape or header.shape[0] != part.rows:
                raise InvalidInput(
                    f"{part.where}: output '{name}' has shape {list(header.shape)}; {part.rows} rows expected"
                )
            if name not in layout:
                layout[name] = (header.dtype, list(header.shape[1:]))
                continue
            dtype, rest = layout[name]
            if len(rest) != len(header.shape) - 1 or dtype.kind != header.dtype.kind:
                raise InvalidInput(
                    f"{part.where}: output '{name}' is {header.dtype} {list(header.shape)}, unlike before"
                )
            if dtype.kind in "US" and header.dtype.itemsize > dtype.itemsize:
                dtype = header.dtype
            layout[name] = (dtype, [max(a, b) for a, b in zip(rest, header.shape[1:], strict=True)])
    total = sum(part.rows for part in parts)
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name in order:
            dtype, rest = layout[name]
            npy = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (total, *rest)}
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array_header_2_0(member, npy)
                for part in parts:
                    with np.load(part.path, allow_pickle=False) as chunk:
                        array = chunk[name]
                    member.write(_padded(array, dtype, rest).tobytes())


def _padded(array: np.ndarray, dtype: np.dtype[Any], rest: list[int]) -> np.ndarray:
    array = array.astype(dtype, copy=False)
    if list(array.shape[1:]) == rest:
        return np.ascontiguousarray(array)
    padded = np.zeros((array.shape[0], *rest), dtype=dtype)
    padded[tuple(slice(0, size) for size in array.shape)] = array
    return padded


def _protocol_of(dtype: np.dtype[Any]) -> str:
    if dtype.kind in "US":
        return "BYTES"
    return _PROTOCOL_OF.get(np.dtype(dtype).newbyteorder("="), str(dtype))


def _rows_as_lines(parts: Sequence[Part], out: BinaryIO, outputs: Sequence[str]) -> None:
    """One JSON line per row: ``{"outputs": [...]}``, each output as ``/v2`` would answer that row alone."""
    for part in parts:
        with np.load(part.path, allow_pickle=False) as chunk:
            arrays = {name: chunk[name] for name in _wanted(list(chunk.files), outputs)}
        for name, array in arrays.items():
            if not array.shape or array.shape[0] != part.rows:
                raise InvalidInput(
                    f"{part.where}: output '{name}' has shape {list(array.shape)}; {part.rows} rows expected"
                )
        for row in range(part.rows):
            line = {
                "outputs": [
                    {
                        "name": name,
                        "datatype": _protocol_of(array.dtype),
                        "shape": [1, *array.shape[1:]],
                        "data": _json_data(array[row]),
                    }
                    for name, array in arrays.items()
                ]
            }
            out.write(json.dumps(line, separators=(",", ":")).encode() + b"\n")


def _json_data(row: np.ndarray) -> list[Any]:
    flat = row.reshape(-1)
    if flat.dtype.kind == "S":
        return [item.decode(errors="replace") for item in flat.tolist()]
    return list(flat.tolist())
