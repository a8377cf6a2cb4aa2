"""Validation of an uploaded ONNX bundle, from protobuf checks to one real ONNX Runtime run.

Everything here works on files in a local folder (the version's files, under their upload
names) and returns findings a person can read; nothing touches the database. The test run feeds
the model its ``sample_inputs.json`` when the upload carries one (the /v2 JSON request format), and
otherwise synthetic inputs: ones, and ``"a"`` for strings, which a model that parses its string
inputs cannot read, so a synthetic run that fails on such a model is a warning. Then it checks
whether concurrent requests may be merged along the first dimension, as the /v2 batcher does: it
runs two different samples together and each alone, and compares (:func:`check_batching`). A model
whose first dimension is not a batch (a softmax over it, a sequence) answers differently run
together, and is then served without merging. ``validate_bundle``
runs in the bounded child of ``onnxkit.sandbox`` (:func:`validate_in_child`), under its time and
memory limits: a hostile model can make the checker, shape inference or ONNX Runtime allocate or
loop without bound, and only a separate process can be stopped safely.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxkit.datatypes import NUMPY_OF, ONNX_TO_PROTOCOL, numpy_of_ort_type, printable, synthetic_inputs
from onnxkit.sandbox import ChildFailure, ChildLimits, mentions_allocation_failure, run_in_child
from onnxkit.signatures import batch_dimension_problem
from onnxkit.tokenizer import TOKENIZER_FILE, TokenizerError, load_tokenizer, pad_encodings, text_signature

# An extra of the upload: inputs for the test run, as a /v2 JSON inference request.
SAMPLE_INPUTS = "sample_inputs.json"
# What the test run of a version with a tokenizer.json feeds it (through the tokenizer), when it has no samples.
SAMPLE_TEXTS = ["Modelyard runs this version once on two sentences before it serves.", "A shorter one."]


@dataclass(frozen=True)
class RuntimeLimits:
    """What the installed ONNX Runtime accepts, found by probing it once per process."""

    ort_version: str
    max_ir_version: int
    max_opset: int


def _probe_model(ir_version: int, opset: int) -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, ir_version=ir_version, opset_imports=[helper.make_opsetid("", opset)])
    return model.SerializeToString()


def _loads(data: bytes) -> bool:
    import onnxruntime as ort

    try:
        ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - any refusal means "not supported"
        return False
    return True


@cache
def runtime_limits() -> RuntimeLimits:
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    max_ir = next(ir for ir in range(onnx.IR_VERSION + 3, 2, -1) if _loads(_probe_model(ir, 13)))
    max_opset = next(op for op in range(onnx.defs.onnx_opset_version() + 3, 6, -1) if _loads(_probe_model(7, op)))
    return RuntimeLimits(ort_version=ort.__version__, max_ir_version=max_ir, max_opset=max_opset)


def runtime_limit_errors(ir_version: int | None, opsets: dict[str, int]) -> list[str]:
    """Readable errors for an IR version or default-domain opset the runtime cannot load."""
    limits = runtime_limits()
    errors = []
    if ir_version is not None and ir_version > limits.max_ir_version:
        errors.append(
            f"IR version {ir_version} is newer than ONNX Runtime {limits.ort_version} supports "
            f"(IR version {limits.max_ir_version} at most). Save the model with ir_version={limits.max_ir_version} "
            f"or lower, for example onnx.helper.make_model(graph, ir_version={limits.max_ir_version})."
        )
    for domain in ("", "ai.onnx"):
        opset = opsets.get(domain)
        if opset is not None and opset > limits.max_opset:
            errors.append(
                f"opset {opset} of the default ONNX domain is newer than ONNX Runtime {limits.ort_version} "
                f"supports (opset {limits.max_opset} at most). Export with opset_version={limits.max_opset} or lower."
            )
    return errors


# What the batching check found (the values of ``registry.models.BatchCheck``; this module loads no Django).
BATCH_SAFE = "safe"
BATCH_UNSAFE = "unsafe"
NO_BATCH_DIMENSION = "no-batch-dimension"
BATCH_UNCHECKED = "unchecked"
# How far an output of two samples run together may be from the same sample's run alone: ONNX Runtime
# may pick other kernels for another batch size, which round differently. Half precision rounds more.
BATCH_TOLERANCE = 1e-4
BATCH_TOLERANCE_HALF = 1e-2
# A model that quantizes its activations dynamically (ONNX Runtime's int8-dynamic, the derive recipe) scales
# them by the whole tensor's range, so a merged run rounds each row a little differently: allowed up to this
# share of the output's largest value. A first dimension that is not a batch moves outputs far more.
BATCH_TOLERANCE_QUANTIZED = 0.05
DYNAMIC_QUANTIZATION_OPS = frozenset({"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM"})
# The check runs three more times what the test run took at most; it is skipped when that would take
# validation past this share of its time limit (MODELYARD_VALIDATION_TIMEOUT_SECONDS).
BATCH_CHECK_TIME_SHARE = 0.8


@dataclass
class ValidationResult:
    """The outcome of validating one version's files."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    signature: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"inputs": [], "outputs": []})
    ir_version: int | None = None
    opset: list[dict[str, Any]] = field(default_factory=list)
    producer: dict[str, str] = field(default_factory=dict)
    external_data_files: set[str] = field(default_factory=set)
    batch_check: str = BATCH_UNCHECKED  # may concurrent requests be merged (:func:`check_batching`)
    batch_note: str = ""  # why, in a sentence

    def batching(self, check: str, note: str) -> None:
        self.batch_check, self.batch_note = check, note

    @property
    def ok(self) -> bool:
        return not self.errors


def readable(text: str) -> str:
    """``text`` as lines a person reads: line breaks kept (blank lines and trailing spaces dropped), other
    control characters escaped as :func:`printable` does.

    Library messages (onnx.checker's "==> Context: ..." part, a child's traceback) span lines; their
    first line is the reason, and the pages and the command line show the rest below it.
    """
    lines = (line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
    return "\n".join(printable(line) for line in lines if line)


def _message(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    # ORT prefixes messages with a C++ source location; keep what a person can act on.
    if "] : " in text and text.startswith("[ONNXRuntimeError]"):
        text = text.split("] : ", 1)[1]
    return readable(text)


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is an allocation failure, however the library words it."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, MemoryError) or mentions_allocation_failure(str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _reraise_if_out_of_memory(exc: BaseException) -> None:
    if out_of_memory(exc):
        raise MemoryError(_message(exc)) from exc


def _run_on(session: Any, feeds: dict[str, Any], failure: str) -> tuple[list[str], list[Any]]:
    """One ``run()`` of the test run: no errors and the outputs, or ``failure`` with ONNX Runtime's first line."""
    try:
        return [], session.run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
        _reraise_if_out_of_memory(exc)
        return [f"{failure}: {_message(exc)}"], []


def _tensor_spec(value_info: onnx.ValueInfoProto) -> dict[str, Any] | None:
    kind = value_info.type.WhichOneof("value")
    if kind != "tensor_type":
        return None
    tensor = value_info.type.tensor_type
    datatype = ONNX_TO_PROTOCOL.get(tensor.elem_type, TensorProto.DataType.Name(tensor.elem_type))
    shape: list[int] | None = None
    if tensor.HasField("shape"):
        shape = [dim.dim_value if dim.HasField("dim_value") else -1 for dim in tensor.shape.dim]
    return {"name": value_info.name, "datatype": datatype, "shape": shape}


def extract_signature(model: onnx.ModelProto) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    initializers = {init.name for init in model.graph.initializer}
    warnings: list[str] = []
    signature: dict[str, list[dict[str, Any]]] = {"inputs": [], "outputs": []}
    for key, values in (("inputs", model.graph.input), ("outputs", model.graph.output)):
        for value in values:
            if key == "inputs" and value.name in initializers:
                continue
            spec = _tensor_spec(value)
            if spec is None:
                warnings.append(f"{key[:-1]} '{printable(value.name)}' is not a tensor; it cannot be served over /v2")
                continue
            signature[key].append(spec)
    return signature, warnings


def check_external_data(model: onnx.ModelProto, bundle_dir: Path, file_names: set[str]) -> tuple[list[str], set[str]]:
    """Every external-data location must name one of the version's own files."""
    from onnx.external_data_helper import _get_all_tensors

    errors: list[str] = []
    used: set[str] = set()
    root = bundle_dir.resolve()
    for tensor in _get_all_tensors(model):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        entries = {entry.key: entry.value for entry in tensor.external_data}
        location = entries.get("location", "")
        where = f"tensor '{printable(tensor.name)}' stores its data in '{printable(location)}'"
        pure = PurePosixPath(location.replace("\\", "/"))
        if not location:
            errors.append(f"tensor '{printable(tensor.name)}' is marked as external data but names no location")
        elif not location.isprintable():
            # A NUL byte makes every path function raise; no uploaded file name has control characters.
            errors.append(f"{where}, a name with control characters; no uploaded file can have that name")
        elif pure.is_absolute() or location.startswith(("\\", "/")) or (len(location) > 1 and location[1] == ":"):
            errors.append(f"{where}, an absolute path; external data must be a file uploaded with the model")
        elif ".." in pure.parts or not (root / pure).resolve().is_relative_to(root):
            errors.append(f"{where}, which is outside the version's files; '..' may not appear in a location")
        elif pure.as_posix() not in file_names:
            errors.append(f"{where}, but no file of that name was uploaded with this version")
        else:
            used.add(pure.as_posix())
    return errors, used


def synthetic_input_bytes(session: Any) -> tuple[int, str]:
    """How many bytes ``synthetic_inputs`` would allocate, and the largest input, before allocating any."""
    total, largest, largest_bytes = 0, "", -1
    for arg in session.get_inputs():
        dtype = numpy_of_ort_type(arg.type)
        if dtype is None:
            continue
        shape = [dim if isinstance(dim, int) and dim >= 0 else 1 for dim in arg.shape]
        size = math.prod(shape) * np.dtype(dtype).itemsize  # Python integers: [2**40, 2**40] does not overflow
        total += size
        if size > largest_bytes:
            largest, largest_bytes = f"input '{printable(arg.name)}' has the shape {shape}", size
    return total, largest


class SampleInputsError(ValueError):
    """``sample_inputs.json`` is not a request the model can take; the message says what is wrong."""


def _sample_array(item: Any, expected: dict[str, dict[str, Any]]) -> tuple[str, np.ndarray]:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise SampleInputsError("each input needs a 'name'")
    raw_name = item["name"]
    name = printable(raw_name)
    spec = expected.get(raw_name)
    if spec is None:
        raise SampleInputsError(f"unknown input '{name}'; the model takes {', '.join(sorted(expected))}")
    datatype = item.get("datatype")
    if datatype != spec["datatype"]:
        given = printable(datatype) if isinstance(datatype, str) else f"a {type(datatype).__name__}"
        raise SampleInputsError(f"input '{name}': expected datatype {spec['datatype']}, got {given}")
    shape = item.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise SampleInputsError(f"input '{name}': shape must be a list of non-negative integers")
    want = spec.get("shape")
    if want is not None and (
        len(want) != len(shape) or any(w not in (-1, d) for w, d in zip(want, shape, strict=True))
    ):
        raise SampleInputsError(f"input '{name}': expected shape {want}, got {shape}")
    dtype = NUMPY_OF[spec["datatype"]]
    try:
        flat = np.asarray(item.get("data"), dtype=dtype).reshape(-1)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SampleInputsError(f"input '{name}': data does not fit {spec['datatype']}: {exc}") from None
    if dtype is np.object_ and not all(isinstance(value, str) for value in flat):
        raise SampleInputsError(f"input '{name}': BYTES data must be strings")
    if flat.size != math.prod(shape):
        raise SampleInputsError(f"input '{name}': shape {shape} needs {math.prod(shape)} values, got {flat.size}")
    return raw_name, flat.reshape(shape)


def sample_inputs(data: bytes, signature: dict[str, list[dict[str, Any]]]) -> dict[str, np.ndarray]:
    """The feeds of ``sample_inputs.json``: ``{"inputs": [{"name", "datatype", "shape", "data"}, ...]}``, JSON data."""
    try:
        request = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise SampleInputsError(f"not valid JSON: {exc}") from None
    items = request.get("inputs") if isinstance(request, dict) else None
    if not isinstance(items, list) or not items:
        raise SampleInputsError("it needs a non-empty 'inputs' list, as a /v2 inference request has")
    expected = {spec["name"]: spec for spec in signature["inputs"]}
    feeds: dict[str, np.ndarray] = {}
    for item in items:
        name, array = _sample_array(item, expected)
        if name in feeds:
            raise SampleInputsError(f"input '{printable(name)}' appears twice")
        feeds[name] = array
    missing = sorted(expected.keys() - feeds.keys())
    if missing:
        raise SampleInputsError(f"missing input(s): {', '.join(missing)}")
    return feeds


def _no_step(step: str) -> None:
    pass


def validate_bundle(
    model_path: Path,
    file_names: set[str],
    *,
    memory_limit_bytes: int | None = None,
    tokenizer_max_bytes: int = 64 * 2**20,
    time_limit_seconds: float | None = None,
    on_step: Callable[[str], None] = _no_step,
) -> ValidationResult:
    """Validate ``model_path`` whose sibling files are the version's other files.

    ``on_step`` hears the name of each step as it starts, so whoever stops a validation can say
    where it stopped. Allocation failures are raised as ``MemoryError``, whatever library hit them.
    ``time_limit_seconds`` is the time validation has in all: the batching check is skipped when it
    would not fit (:data:`BATCH_CHECK_TIME_SHARE`).
    """
    started = time.monotonic()
    deadline = started + time_limit_seconds * BATCH_CHECK_TIME_SHARE if time_limit_seconds else None
    result = ValidationResult()
    bundle_dir = model_path.parent
    on_step("loading the model")
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several types
        _reraise_if_out_of_memory(exc)
        result.errors.append(f"the file is not a readable ONNX model: {_message(exc)}")
        return result

    result.ir_version = model.ir_version
    # Any string of the model may hold a NUL byte, which PostgreSQL cannot store in JSON: escape them.
    result.opset = [{"domain": printable(op.domain) or "ai.onnx", "version": op.version} for op in model.opset_import]
    result.producer = {"name": printable(model.producer_name), "version": printable(model.producer_version)}

    # Locations are checked before anything opens them, so a hostile path is never read.
    errors, result.external_data_files = check_external_data(model, bundle_dir, file_names)
    errors += runtime_limit_errors(model.ir_version, {op.domain: op.version for op in model.opset_import})
    if errors:
        result.errors += errors
        return result

    on_step("running onnx.checker")
    try:
        onnx.checker.check_model(str(model_path), full_check=True)
    except Exception as exc:  # noqa: BLE001 - checker and inference errors share no base
        _reraise_if_out_of_memory(exc)
        result.errors.append(f"onnx.checker rejected the model: {_message(exc)}")
        return result

    on_step("inferring shapes")
    inferred_path = bundle_dir / f".inferred-{os.getpid()}.onnx"
    try:
        onnx.shape_inference.infer_shapes_path(str(model_path), str(inferred_path), strict_mode=True)
        inferred = onnx.load(str(inferred_path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001
        _reraise_if_out_of_memory(exc)
        result.errors.append(f"shape inference failed: {_message(exc)}")
        return result
    finally:
        inferred_path.unlink(missing_ok=True)

    result.signature, warnings = extract_signature(inferred)
    result.warnings += warnings
    for key in ("inputs", "outputs"):
        for spec in result.signature[key]:
            if "\x00" in spec["name"]:
                result.errors.append(f"{key[:-1]} '{printable(spec['name'])}' has a NUL byte in its name")
                spec["name"] = printable(spec["name"])
    if result.errors:
        return result
    text_feeds: dict[str, np.ndarray] | None = None
    if TOKENIZER_FILE in file_names:
        on_step(f"reading {TOKENIZER_FILE}")
        try:
            text_feeds = _text_signature(bundle_dir / TOKENIZER_FILE, result.signature, tokenizer_max_bytes)
        except TokenizerError as exc:
            result.errors.append(str(exc))
            return result
    samples = bundle_dir / SAMPLE_INPUTS if SAMPLE_INPUTS in file_names else None
    result.errors += _run_once(
        model_path,
        result,
        memory_limit_bytes=memory_limit_bytes,
        on_step=on_step,
        samples=samples,
        text_feeds=text_feeds,
        deadline=deadline,
        quantized=quantizes_dynamically(model),
    )
    return result


def _text_signature(path: Path, signature: dict[str, Any], max_bytes: int) -> dict[str, np.ndarray]:
    """Add the ``text`` entry to ``signature``; return the token inputs of ``SAMPLE_TEXTS`` for the test run."""
    tokenizer, pad_id, own_length = load_tokenizer(path, max_bytes=max_bytes)
    spec = text_signature(signature["inputs"], own_length)
    batch = spec["shape"][0]
    texts = SAMPLE_TEXTS[:batch] if batch > 0 else SAMPLE_TEXTS
    try:
        if spec["max_tokens"]:
            tokenizer.enable_truncation(spec["max_tokens"])
        encodings = tokenizer.encode_batch(texts)
    except Exception as exc:  # noqa: BLE001 - the Rust library raises plain Exception
        raise TokenizerError(f"{TOKENIZER_FILE} could not tokenise a test sentence: {_message(exc)}") from None
    signature["text"] = spec
    length = spec["fixed_length"] or max(len(encoding.ids) for encoding in encodings)
    return pad_encodings(encodings, spec, pad_id=pad_id, length=length)


def _run_once(
    model_path: Path,
    result: ValidationResult,
    *,
    memory_limit_bytes: int | None,
    on_step: Callable[[str], None],
    samples: Path | None = None,
    text_feeds: dict[str, np.ndarray] | None = None,
    deadline: float | None = None,
    quantized: bool = False,
) -> list[str]:
    import onnxruntime as ort

    on_step("loading the model into ONNX Runtime")
    options = ort.SessionOptions()
    # One thread: the test run needs no speed, and every extra thread reserves address space that
    # counts against the memory limit.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
        _reraise_if_out_of_memory(exc)
        return [f"ONNX Runtime could not load the model: {_message(exc)}"]
    unbatched = batch_dimension_problem(result.signature)
    if unbatched:
        result.batching(NO_BATCH_DIMENSION, unbatched)
    if samples is not None:
        try:
            feeds = sample_inputs(samples.read_bytes(), result.signature)
        except SampleInputsError as exc:
            return [f"{SAMPLE_INPUTS}: {exc}"]
        on_step(f"running the model once in ONNX Runtime on {SAMPLE_INPUTS}")
        begun = time.monotonic()
        errors, outputs = _run_on(session, feeds, f"ONNX Runtime could not run the model on {SAMPLE_INPUTS}")
        if not errors and not unbatched:
            ran = time.monotonic() - begun
            _check_sample(session, result, feeds, outputs, ran, deadline, on_step, SAMPLE_INPUTS, quantized)
        return errors
    if text_feeds is not None:
        on_step(f"running the model once in ONNX Runtime on text through {TOKENIZER_FILE}")
        begun = time.monotonic()
        errors, outputs = _run_on(
            session, text_feeds, f"ONNX Runtime could not run the model on text tokenised by {TOKENIZER_FILE}"
        )
        if not errors and not unbatched:
            what = f"the sample texts tokenised by {TOKENIZER_FILE}"
            ran = time.monotonic() - begun
            _check_sample(session, result, text_feeds, outputs, ran, deadline, on_step, what, quantized)
        return errors
    needed, largest = synthetic_input_bytes(session)
    if memory_limit_bytes is not None and needed > memory_limit_bytes:
        # Refused before numpy tries: a fixed shape such as [2**40, 2**40] would need exabytes.
        return [
            f"the test run needs {_size(needed)} for its synthetic inputs ({largest}), more than the "
            f"{memory_limit_bytes // 2**20} MB validation may use (MODELYARD_VALIDATION_MEMORY_MB)"
        ]
    try:
        feeds = synthetic_inputs(session)
    except TypeError as exc:
        result.warnings.append(f"skipped the test run: {exc}")
        if not unbatched:
            result.batching(BATCH_UNCHECKED, f"the batching check could not run: {exc}")
        return []
    except ValueError as exc:  # numpy refuses shapes it cannot address at all
        return [f"the test run cannot build its synthetic inputs ({largest}): {_message(exc)}"]
    on_step("running the model once in ONNX Runtime")
    begun = time.monotonic()
    try:
        outputs = session.run(None, feeds)
    except Exception as exc:  # noqa: BLE001
        _reraise_if_out_of_memory(exc)
        strings = [spec["name"] for spec in result.signature["inputs"] if spec["datatype"] == "BYTES"]
        if strings:
            # "a" in every string means nothing to a model that parses its strings: not the model's fault.
            result.warnings.append(
                f"the test run on synthetic inputs failed: {_message(exc)}. The model takes string input(s) "
                f'{", ".join(printable(name) for name in strings)}, which validation fills with "a"; upload '
                f"{SAMPLE_INPUTS} (a /v2 JSON inference request) with the version to test it on real inputs"
            )
            if not unbatched:
                result.batching(
                    BATCH_UNCHECKED,
                    f"the batching check could not run on synthetic strings; upload {SAMPLE_INPUTS} with two rows "
                    "or more to check it",
                )
            return []
        return [f"ONNX Runtime could not run the model on synthetic inputs: {_message(exc)}"]
    if not unbatched:
        ran = time.monotonic() - begun
        if _check_fits(result, ran, deadline):
            on_step("checking whether requests may be merged")
            second = _variant(feeds, synthetic=True)
            result.batching(*check_batching(session, feeds, second, "two synthetic samples", quantized=quantized))
    return []


def _check_fits(result: ValidationResult, ran: float, deadline: float | None) -> bool:
    """Whether the check's runs (about three times the test run) fit in validation's time; if not, say so."""
    if deadline is None or time.monotonic() + 3 * ran <= deadline:
        return True
    result.batching(
        BATCH_UNCHECKED,
        f"the batching check was skipped: the test run took {ran:.1f} s, and the check needs about three times "
        "that more, past the time validation has (MODELYARD_VALIDATION_TIMEOUT_SECONDS)",
    )
    return False


def _check_sample(
    session: Any,
    result: ValidationResult,
    feeds: dict[str, np.ndarray],
    outputs: list[Any],
    ran: float,
    deadline: float | None,
    on_step: Callable[[str], None],
    source: str,
    quantized: bool,
) -> None:
    """The batching check on given inputs: their two halves when they have two rows or more, else them and a variant."""
    rows = {name: array.shape[0] for name, array in feeds.items()}
    if len(set(rows.values())) > 1:
        listed = ", ".join(f"'{printable(name)}' {count}" for name, count in rows.items())
        result.batching(
            BATCH_UNSAFE,
            f"the inputs of {source} have different first dimensions ({listed}): the first dimension is not a batch",
        )
        return
    count = next(iter(rows.values()), 0)
    if count == 0:
        result.batching(BATCH_UNCHECKED, f"the batching check could not run: {source} has no rows")
        return
    if not _check_fits(result, ran, deadline):
        return
    on_step("checking whether requests may be merged")
    if count >= 2:
        half = count // 2
        first = {name: array[:half] for name, array in feeds.items()}
        second = {name: array[half:] for name, array in feeds.items()}
        what = f"two halves of {source}"
        result.batching(*check_batching(session, first, second, what, together=outputs, quantized=quantized))
    else:
        what = f"{source} and a variant of it"
        second = _variant(feeds, synthetic=False)
        result.batching(*check_batching(session, feeds, second, what, first_alone=outputs, quantized=quantized))


def _variant(feeds: dict[str, np.ndarray], *, synthetic: bool) -> dict[str, np.ndarray]:
    """Other inputs of the same shapes: halved (floats), 0 or 1 (integers: an index that is always valid), negated.

    A sample's strings are kept (nothing else is known to parse); synthetic ones become "b".
    """
    other: dict[str, np.ndarray] = {}
    for name, array in feeds.items():
        kind = array.dtype.kind
        if kind in "fc":
            other[name] = (array * 0.5 + 0.25).astype(array.dtype)
        elif kind == "b":
            other[name] = ~array
        elif kind in "iu":
            other[name] = np.zeros_like(array) if array.any() else np.ones_like(array)
        elif synthetic:
            other[name] = np.full(array.shape, "b", dtype=object)
        else:
            other[name] = array
    return other


def quantizes_dynamically(model: onnx.ModelProto) -> bool:
    """Whether the graph quantizes activations at run time (their scale then depends on the whole batch)."""
    return any(node.op_type in DYNAMIC_QUANTIZATION_OPS for node in model.graph.node)


def _gap(together: np.ndarray, alone: np.ndarray, *, quantized: bool = False) -> tuple[bool, float, float]:
    """Whether ``together`` matches ``alone`` within tolerance, the largest difference, and the tolerance."""
    if together.dtype.kind not in "fc" or alone.dtype.kind not in "fc":
        same = bool(np.array_equal(together, alone))
        return same, 0.0 if same else math.inf, 0.0
    tolerance = BATCH_TOLERANCE_HALF if together.dtype.itemsize <= 2 else BATCH_TOLERANCE
    wide = np.complex128 if "c" in (together.dtype.kind, alone.dtype.kind) else np.float64
    x, y = together.astype(wide), alone.astype(wide)
    finite = np.isfinite(x) & np.isfinite(y)
    if quantized and finite.any():
        tolerance = max(tolerance, BATCH_TOLERANCE_QUANTIZED * float(np.max(np.abs(y[finite]))))
    close = np.isclose(x, y, rtol=0 if quantized else tolerance, atol=tolerance, equal_nan=True)
    largest = float(np.max(np.abs(x - y)[finite])) if finite.any() else 0.0
    if not close.all() and largest <= tolerance:
        largest = math.inf  # an infinity or NaN in one and not the other
    return bool(close.all()), largest, tolerance


def check_batching(
    session: Any,
    first: dict[str, np.ndarray],
    second: dict[str, np.ndarray],
    what: str,
    *,
    first_alone: list[Any] | None = None,
    together: list[Any] | None = None,
    quantized: bool = False,
) -> tuple[str, str]:
    """Run ``first`` and ``second`` stacked along the first dimension, as the /v2 batcher merges two requests, and
    each alone; (a ``BATCH_*`` value, why in a sentence).

    ``first_alone`` and ``together`` are outputs the test run already has. Running together must give
    each sample exactly its own outputs (floats within :data:`BATCH_TOLERANCE`, or
    :data:`BATCH_TOLERANCE_QUANTIZED` of the output's largest value when the model is ``quantized``
    dynamically); a run together that fails, or outputs that cannot be split back by rows, are unsafe
    too. A sample that cannot run alone, or memory running out, leaves the question open.
    """
    allowing = f", {BATCH_TOLERANCE_QUANTIZED:.0%} of the largest value for dynamic quantization" if quantized else ""
    names = [output.name for output in session.get_outputs()]
    rows_first = next(iter(first.values())).shape[0]
    rows_second = next(iter(second.values())).shape[0]
    try:
        if together is None:
            merged = {name: np.concatenate([first[name], second[name]], axis=0) for name in first}
            try:
                together = session.run(None, merged)
            except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
                _reraise_if_out_of_memory(exc)
                return BATCH_UNSAFE, f"{what} fail when run together: {_message(exc)}"
        alone: list[list[Any]] = []
        for label, feeds, known in (("first", first, first_alone), ("second", second, None)):
            if known is not None:
                alone.append(known)
                continue
            try:
                alone.append(session.run(None, feeds))
            except Exception as exc:  # noqa: BLE001
                _reraise_if_out_of_memory(exc)
                return BATCH_UNCHECKED, f"the batching check could not run: the {label} of {what} failed alone: " + (
                    _message(exc)
                )
    except MemoryError:
        return BATCH_UNCHECKED, (
            f"the batching check could not run: running {what} needed more memory than validation may use "
            "(MODELYARD_VALIDATION_MEMORY_MB)"
        )
    largest, tolerance = 0.0, 0.0
    for index, name in enumerate(names):
        value = np.asarray(together[index])
        shown = f"output '{printable(name)}'"
        if value.ndim == 0 or value.shape[0] != rows_first + rows_second:
            return BATCH_UNSAFE, (
                f"{shown} has shape {list(value.shape)} for {what} of {rows_first} and {rows_second} row(s) run "
                f"together, not {rows_first + rows_second} rows: its first dimension is not a batch"
            )
        for part, own in ((value[:rows_first], alone[0][index]), (value[rows_first:], alone[1][index])):
            own = np.asarray(own)
            if part.shape != own.shape:
                return BATCH_UNSAFE, (
                    f"{shown} has shape {list(part.shape)} run together with another sample and {list(own.shape)} "
                    "alone: its first dimension is not a batch"
                )
            close, gap, limit = _gap(part, own, quantized=quantized)
            if not close:
                by = f" by up to {gap:.3g} (tolerance {limit:.3g}{allowing})" if math.isfinite(gap) and limit else ""
                return BATCH_UNSAFE, (
                    f"{shown} of {what} run together differs from each run alone{by}: "
                    "the first dimension is not a batch"
                )
            largest, tolerance = max(largest, gap), max(tolerance, limit)
    within = f" (largest difference {largest:.2g}, tolerance {tolerance:.3g}{allowing})" if tolerance else ""
    return BATCH_SAFE, f"{what} run together gave the outputs each gave alone{within}: the first dimension is a batch"


def _size(size: int) -> str:
    if size < 1024:
        return f"{size} bytes"
    units = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]
    value = size / 1024
    while value >= 1024 and len(units) > 1:
        value /= 1024
        units.pop(0)
    return f"{value:,.1f} {units[0]}"


# --- In the sandbox ---------------------------------------------------------------------------------

TIMEOUT_SETTING = "MODELYARD_VALIDATION_TIMEOUT_SECONDS"
MEMORY_SETTING = "MODELYARD_VALIDATION_MEMORY_MB"


def validate_in_child(
    model_path: Path,
    file_names: set[str],
    *,
    timeout_seconds: float,
    memory_mb: int,
    tokenizer_max_bytes: int = 64 * 2**20,
) -> ValidationResult:
    """Run ``validate_bundle`` on ``model_path`` in the sandbox under the two limits; never raises for the model.

    Whatever happens to the child, the result's errors name what stopped it and the setting to change.
    """
    limits = ChildLimits(
        timeout_seconds=timeout_seconds,
        memory_mb=memory_mb,
        timeout_setting=TIMEOUT_SETTING,
        memory_setting=MEMORY_SETTING,
        what="validation",
    )
    request = {
        "model_path": str(model_path),
        "file_names": sorted(file_names),
        "memory_mb": memory_mb,
        "timeout_seconds": timeout_seconds,
        "tokenizer_max_bytes": tokenizer_max_bytes,
    }
    outcome = run_in_child("onnxkit.validation:validate_child", request, limits)
    if outcome.reply is not None:
        return _result_from_json(outcome.reply)
    assert outcome.failure is not None
    return ValidationResult(errors=[_stopped(outcome.failure, limits)])


def _stopped(failure: ChildFailure, limits: ChildLimits) -> str:
    """Validation's own words for what stopped its child."""
    where, memory_mb, timeout_seconds = failure.where, limits.memory_mb, limits.timeout_seconds
    if failure.kind == "timeout":
        return f"validation stopped after {timeout_seconds:g} s ({TIMEOUT_SETTING}){where}"
    if failure.kind == "memory":
        return f"validation stopped: it needed more than {memory_mb} MB of memory ({MEMORY_SETTING}){where}"
    if failure.kind == "error":
        return f"validation could not finish{where}: {failure.detail}"
    if failure.returncode == -signal.SIGKILL:
        # Not the sandbox's kill (that is the timeout above): the kernel's OOM killer, when the machine
        # has less memory to spare than the limit allows.
        return (
            f"validation stopped{where}: its process was killed (SIGKILL), most likely because the machine ran "
            f"out of memory before the limit of {memory_mb} MB ({MEMORY_SETTING}) was reached; lower that limit"
        )
    last = f": {failure.last_line}" if failure.last_line else ""
    return (
        f"validation stopped{where}: its process {failure.how}{last} "
        f"(limits: {memory_mb} MB, {MEMORY_SETTING}; {timeout_seconds:g} s, {TIMEOUT_SETTING})"
    )


def _result_from_json(data: dict[str, Any]) -> ValidationResult:
    return ValidationResult(
        errors=[str(item) for item in data["errors"]],
        warnings=[str(item) for item in data["warnings"]],
        signature=data["signature"],
        ir_version=data["ir_version"],
        opset=data["opset"],
        producer=data["producer"],
        external_data_files=set(data["external_data_files"]),
        batch_check=str(data.get("batch_check", "unchecked")),
        batch_note=str(data.get("batch_note", "")),
    )


def validate_child(request: dict[str, Any], on_step: Callable[[str], None]) -> dict[str, Any]:
    """In the child: validate the bundle, and reply with the result as JSON."""
    import onnxruntime  # noqa: F401 - before the first step, so a limit too small for it fails "while starting"

    result = validate_bundle(
        Path(request["model_path"]),
        set(request["file_names"]),
        memory_limit_bytes=int(request["memory_mb"]) * 2**20,
        tokenizer_max_bytes=int(request["tokenizer_max_bytes"]),
        time_limit_seconds=float(request["timeout_seconds"]),
        on_step=on_step,
    )
    return {
        "errors": result.errors,
        "warnings": result.warnings,
        "signature": result.signature,
        "ir_version": result.ir_version,
        "opset": result.opset,
        "producer": result.producer,
        "external_data_files": sorted(result.external_data_files),
        "batch_check": result.batch_check,
        "batch_note": result.batch_note,
    }
