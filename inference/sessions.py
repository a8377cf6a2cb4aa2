"""Building ONNX Runtime sessions on the preferred execution provider, and saying why when it is not the GPU.

Three things go wrong on GPU hosts, all of them silently by ONNX Runtime's own behaviour, so each is
made visible here:

- Two ONNX Runtime distributions (``onnxruntime`` and ``onnxruntime-gpu``) write the same
  ``onnxruntime`` package; with both installed, whichever was written last wins file by file and CUDA
  disappears. :func:`check_ort_install` refuses that at start-up, naming the fix.
- CUDA was asked for and cannot run: the CPU wheel is installed, the CUDA or cuDNN libraries do not
  load, or there is no device. :func:`gpu_status` finds out which, once per process, after
  ``onnxruntime.preload_dlls()`` (which loads CUDA and cuDNN from their pip packages). The reason goes
  into each session's ``note`` and the fleet's device column; ``MODELYARD_REQUIRE_GPU`` turns it into a
  load failure instead of a CPU fallback.
- Provider options come from settings through one pure function, :func:`provider_options`, so what
  is passed to ONNX Runtime can be read and tested without a GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import logging
import os
import platform
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import numpy as np
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from inference.errors import runtime_detail
from onnxkit.datatypes import NUMPY_OF

if TYPE_CHECKING:
    from inference.cache import OptimizedModels

logger = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
GPU_PROVIDERS = frozenset({CUDA, TENSORRT})
PROVIDER_NAMES = {
    "cuda": CUDA,
    "tensorrt": TENSORRT,
    "rocm": "ROCMExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "cpu": CPU,
}
_GRAPH_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED"}
_ORT_PACKAGE = "onnxruntime"


class OnnxRuntimeInstallError(ImproperlyConfigured):
    """No ONNX Runtime, or several distributions sharing one ``onnxruntime`` package."""


class GpuUnavailable(RuntimeError):
    """``MODELYARD_REQUIRE_GPU`` is set and this session would not run on the GPU."""


@dataclass
class BuiltSession:
    """A ready ONNX Runtime session and what it really runs on."""

    session: Any
    provider: str
    note: str = ""
    graphs: bool = False  # made with CUDA graphs: it must run through a FixedAddressRunner
    model_path: Path | None = None  # the file the session was made from: the version's, or its saved optimised graph
    preoptimized: bool = False  # made from the saved optimised graph, with ONNX Runtime's optimisation off


@dataclass(frozen=True)
class GpuStatus:
    """Whether this process can run CUDA sessions; if not, why (a sentence with the fix) and a short form."""

    usable: bool
    reason: str = ""
    device: str = ""  # the fleet's device column (64 characters): "cuda:0", or "cpu (why, briefly)"


# --- One ONNX Runtime --------------------------------------------------------------------------------


def _ort_site() -> Path | None:
    """The folder holding the ``onnxruntime`` package that ``import onnxruntime`` would load."""
    spec = importlib.util.find_spec(_ORT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def _top_level_names(dist: importlib.metadata.Distribution) -> set[str]:
    text = dist.read_text("top_level.txt")
    if text is not None:
        return set(text.split())
    return {PurePosixPath(str(path)).parts[0] for path in dist.files or [] if str(path)}


def ort_distributions(site: Path | None = None) -> list[str]:
    """``"name version"`` of every distribution installed into ``site`` that writes the ``onnxruntime`` package.

    Only the folder Python imports ``onnxruntime`` from counts: a CPU wheel in the system's
    site-packages behind a GPU build earlier on ``sys.path`` is shadowed whole, which is harmless.
    """
    site = site or _ort_site()
    if site is None:
        return []
    found = {
        f"{dist.metadata['Name']} {dist.version}"
        for dist in importlib.metadata.distributions(path=[str(site)])
        if _ORT_PACKAGE in _top_level_names(dist)
    }
    return sorted(found)


def check_ort_install(site: Path | None = None) -> str:
    """The one ONNX Runtime distribution installed (``"onnxruntime-gpu 1.31.1"``); refuse none or several."""
    site = site or _ort_site()
    found = ort_distributions(site)
    if not found:
        raise OnnxRuntimeInstallError(
            "No ONNX Runtime is installed: pip install 'modelyard[cpu]', or 'modelyard[gpu]' on a CUDA host "
            "(make install / make install-gpu)"
        )
    if len(found) > 1:
        names = " ".join(sorted({entry.split()[0] for entry in found}))
        raise OnnxRuntimeInstallError(
            f"{len(found)} ONNX Runtime distributions are installed into the same onnxruntime package in {site}: "
            f"{', '.join(found)}. They overwrite each other's files, so the build that runs is an accident (the "
            f"CPU wheel over the GPU one silently drops CUDA). Keep exactly one: pip uninstall -y {names}, then "
            "pip install 'modelyard[gpu]' on a CUDA host or 'modelyard[cpu]' elsewhere "
            "(make install-gpu / make install do both steps)."
        )
    return found[0]


@functools.cache
def ort_install() -> str:
    """:func:`check_ort_install` once per process: the distributions do not change while it runs."""
    return check_ort_install()


# --- Providers and their options -----------------------------------------------------------------------


def requested_providers() -> list[str]:
    names = []
    for item in settings.PROVIDERS:
        name = PROVIDER_NAMES.get(item.lower(), item)
        if name not in names:
            names.append(name)
    return names


def tensorrt_cache_dir() -> Path:
    """TensorRT engines and timing caches: built once per model and GPU, reused across restarts."""
    return Path(settings.CACHE_DIR) / "tensorrt"


def _flag(value: bool) -> str:
    # ONNX Runtime parses provider options from strings; "True"/"False" is the one spelling that both the
    # CUDA provider and the Python binding's TensorRT parser accept.
    return "True" if value else "False"


def provider_options(names: list[str], *, cuda_graphs: bool = False) -> list[tuple[str, dict[str, str]]]:
    """The ``providers`` argument for ``InferenceSession``: each name with the options settings give it.

    ``cuda_graphs`` is decided per session by :func:`build_session` (fixed shapes and a caller that
    binds inputs at fixed addresses), not read from settings here.
    """
    device = str(settings.CUDA_DEVICE_ID)
    out: list[tuple[str, dict[str, str]]] = []
    for name in names:
        if name == CUDA:
            options = {
                "device_id": device,
                "arena_extend_strategy": settings.CUDA_ARENA_STRATEGY,
                "cudnn_conv_algo_search": settings.CUDA_CONV_ALGO_SEARCH,
                "do_copy_in_default_stream": _flag(settings.CUDA_COPY_IN_DEFAULT_STREAM),
                "enable_cuda_graph": _flag(cuda_graphs),
            }
            if settings.CUDA_MEM_LIMIT_MB:
                options["gpu_mem_limit"] = str(settings.CUDA_MEM_LIMIT_MB * 1024 * 1024)
            out.append((name, options))
        elif name == TENSORRT:
            cache = str(tensorrt_cache_dir())
            out.append(
                (
                    name,
                    {
                        "device_id": device,
                        "trt_engine_cache_enable": "True",
                        "trt_engine_cache_path": cache,
                        "trt_timing_cache_enable": "True",
                        "trt_timing_cache_path": cache,
                        "trt_fp16_enable": _flag(settings.TRT_FP16),
                        "trt_cuda_graph_enable": _flag(cuda_graphs),
                    },
                )
            )
        else:
            out.append((name, {}))
    return out


def session_options(intra_op_threads: int = 0, *, spinning: bool | None = None, optimize: bool = True) -> Any:
    """ORT's options from the settings; ``intra_op_threads`` (0: the setting, else ORT's default) overrides, and
    ``spinning`` (None: ``MODELYARD_ORT_SPINNING``) says whether idle threads spin. ``optimize=False``: the
    model is an optimised graph saved before (:func:`prepare_optimized`), loaded with optimisation off."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if intra_op_threads or settings.ORT_INTRA_OP_THREADS:
        options.intra_op_num_threads = intra_op_threads or settings.ORT_INTRA_OP_THREADS
    if settings.ORT_INTER_OP_THREADS:
        options.inter_op_num_threads = settings.ORT_INTER_OP_THREADS
    level = _GRAPH_LEVELS.get(settings.ORT_GRAPH_OPTIMIZATION if optimize else "disable", "ORT_ENABLE_ALL")
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.log_severity_level = 3
    if not (settings.ORT_SPINNING if spinning is None else spinning):
        # Idle intra-op threads sleep instead of spinning, leaving the cores to the event loop between runs.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options


# --- Why CUDA does not run -------------------------------------------------------------------------------


@functools.cache
def preload_cuda_libraries() -> tuple[str, ...]:
    """Run ``onnxruntime.preload_dlls()`` once, before the first CUDA session; return what it could not load.

    It loads CUDA and cuDNN from the ``nvidia-*`` pip packages (or the default library path). It does
    not raise for a missing library: it prints ``Failed to load <name>: <error>``, which is captured
    here and returned as ``(name, error)`` pairs.
    """
    import onnxruntime as ort

    if not hasattr(ort, "preload_dlls"):  # before ONNX Runtime 1.21: the libraries come from the library path
        return ()
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            ort.preload_dlls()
    except Exception as exc:  # noqa: BLE001 - a failed preload is reported, the session decides
        return (f"onnxruntime.preload_dlls() failed: {exc}",)
    failed = []
    for line in printed.getvalue().splitlines():
        if line.startswith("Failed to load "):
            name, _, error = line[len("Failed to load ") :].partition(": ")
            name = os.path.basename(name)
            failed.append(error if error.startswith(f"{name}: ") else f"{name}: {error}")
    if failed:
        logger.info("onnxruntime.preload_dlls() could not load: %s", "; ".join(failed))
    return tuple(failed)


def _summarise_load_errors(errors: list[str]) -> str:
    """``a.so: E; b.so: E`` -> ``a.so, b.so (E)``: the loader's message is usually the same for every library."""
    pairs = [error.partition(": ") for error in errors]
    messages = {message for _, _, message in pairs}
    if len(messages) == 1 and all(name for name, _, _ in pairs):
        return f"{', '.join(name for name, _, _ in pairs)} ({messages.pop()})"
    return "; ".join(errors)


def _load_library(name: str) -> str:
    """'' when the shared library ``name`` loads, else the loader's error."""
    try:
        ctypes.CDLL(name)
    except OSError as exc:
        return str(exc)
    return ""


def cuda_device_count(cuda_major: str) -> tuple[int | None, str]:
    """(devices, why none) from the NVIDIA driver and the CUDA runtime; (None, "") when it cannot be asked."""
    if not sys.platform.startswith("linux"):
        return None, ""
    driver_error = _load_library("libcuda.so.1")
    if driver_error:
        return 0, f"the NVIDIA driver is not installed ({driver_error})"
    try:
        cudart = ctypes.CDLL(f"libcudart.so.{cuda_major}")
    except OSError:
        return None, ""
    count = ctypes.c_int(0)
    code = cudart.cudaGetDeviceCount(ctypes.byref(count))
    if code == 0:
        return count.value, "" if count.value else "the driver reports no devices"
    cudart.cudaGetErrorString.restype = ctypes.c_char_p
    message = cudart.cudaGetErrorString(code).decode(errors="replace")
    return 0, f"{message} (cudaGetDeviceCount error {code}; is the NVIDIA driver new enough for CUDA {cuda_major}?)"


@functools.cache
def gpu_status() -> GpuStatus:
    """Can this process run CUDA sessions? Checked once: the build, the libraries, the device."""
    import onnxruntime as ort

    installed = ort_install()
    if CUDA not in ort.get_available_providers():
        wheel = ", the CPU wheel," if installed.startswith("onnxruntime ") else ""
        return GpuStatus(
            False,
            f"this ONNX Runtime build has no CUDA provider ({installed}{wheel} is installed; install modelyard[gpu])",
            "cpu (no CUDA in this ONNX Runtime build)",
        )
    cuda_major = str(getattr(ort, "cuda_version", "") or "").split(".")[0]
    failed = preload_cuda_libraries()
    cudnn_error = _load_library("libcudnn.so.9") if sys.platform.startswith("linux") else ""
    problems = list(failed) or ([cudnn_error] if cudnn_error else [])
    if problems:
        detail = _summarise_load_errors(problems)
        return GpuStatus(
            False,
            f"CUDA/cuDNN libraries could not be loaded: {detail} (pip install 'onnxruntime-gpu[cuda,cudnn]' "
            f"installs CUDA {cuda_major or '?'} and cuDNN 9 as pip packages)",
            "cpu (CUDA/cuDNN libraries not loaded)",
        )
    count, why = cuda_device_count(cuda_major) if cuda_major else (None, "")
    if count == 0:
        return GpuStatus(False, f"no CUDA device: {why}", "cpu (no CUDA device)")
    device = settings.CUDA_DEVICE_ID
    if count is not None and device >= count:
        return GpuStatus(
            False,
            f"no CUDA device {device}: this host has {count} (MODELYARD_CUDA_DEVICE_ID counts from 0)",
            f"cpu (no CUDA device {device})",
        )
    return GpuStatus(True, "", f"cuda:{device}")


_SOURCE_LOCATION = re.compile(r"^\S+\.(?:cc|cpp|h):\d+\s+(?:[^()]*\([^)]*\)\s+)?")


def explain_provider_error(provider: str, error: str) -> str:
    """One line saying why ``provider`` failed to create a session, sorted into the reasons the fleet shows."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    text = _SOURCE_LOCATION.sub("", lines[0] if lines else "unknown error").split(" ; GPU=")[0][:400]
    lowered = error.lower()
    if any(
        marker in lowered
        for marker in (
            "no cuda-capable device",
            "invalid device ordinal",
            "driver version is insufficient",
            "libcuda.so",
        )
    ):
        return f"no CUDA device: {text}"
    if any(
        marker in lowered for marker in ("cannot open shared object", "failed to load", "please install", "loadlibrary")
    ):
        libraries = "TensorRT libraries" if provider == TENSORRT else "CUDA/cuDNN libraries"
        return f"{libraries} could not be loaded: {text}"
    return f"{provider} failed: {text}"


# --- Building a session ----------------------------------------------------------------------------------


def run_with_iobinding(session: Any, feeds: dict[str, Any], output_names: list[str]) -> list[Any]:
    """One run through IO binding, the outputs bound to CPU memory: what a GPU session serves through.

    ONNX Runtime then writes each output once into host memory it allocates, ready to encode,
    instead of handing back device tensors the binding would copy again. On the CPU it gains
    nothing measurable (MiniLM batch-32: 443-460 ms either way), so CPU sessions keep ``run()``.
    """
    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_cpu_input(name, array)
    for name in output_names:
        binding.bind_output(name, "cpu")
    session.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()


def unfixed_tensors(signature: dict[str, Any]) -> list[str]:
    """The inputs and outputs that keep a version from running at fixed addresses (CUDA graphs need none).

    A buffer allocated once needs a shape that never changes and a numeric type: a dynamic
    dimension (-1, which every batching model has) or a string tensor rules it out.
    """
    return [
        spec["name"]
        for spec in [*signature.get("inputs", []), *signature.get("outputs", [])]
        if spec.get("datatype") == "BYTES"
        or not isinstance(spec.get("shape"), list)
        or any(not isinstance(d, int) or d < 0 for d in spec["shape"])
    ]


class FixedAddressRunner:
    """Runs a session through IO binding on input and output buffers allocated once, at fixed addresses.

    A captured CUDA graph needs this: a replay reads its inputs from, and writes its outputs to,
    the addresses the capture saw, whatever ``run()`` is given. Each run copies the request's
    inputs into the buffers and its outputs out of theirs, so runs take turns (one lock): a version
    served this way runs one batch at a time. Only for versions whose every shape is fixed
    (:func:`unfixed_tensors` is empty). ``run(output_names, feeds)`` is ``InferenceSession.run``'s.
    """

    def __init__(self, session: Any, signature: dict[str, Any], *, device: str, device_id: int = 0) -> None:
        import onnxruntime as ort

        def buffer(spec: dict[str, Any]) -> tuple[Any, np.dtype[Any]]:
            dtype = np.dtype(NUMPY_OF[spec["datatype"]])
            return ort.OrtValue.ortvalue_from_shape_and_type(spec["shape"], dtype, device, device_id), dtype

        self._session = session
        self._binding = session.io_binding()
        self._inputs = {spec["name"]: buffer(spec) for spec in signature.get("inputs", [])}
        self._outputs = {spec["name"]: buffer(spec)[0] for spec in signature.get("outputs", [])}
        for name, (value, _) in self._inputs.items():
            self._binding.bind_ortvalue_input(name, value)
        for name, value in self._outputs.items():
            self._binding.bind_ortvalue_output(name, value)
        self._lock = threading.Lock()

    def run(self, output_names: list[str] | None, feeds: dict[str, Any]) -> list[Any]:
        with self._lock:
            for name, array in feeds.items():
                value, dtype = self._inputs[name]
                value.update_inplace(np.ascontiguousarray(array, dtype=dtype))
            self._session.run_with_iobinding(self._binding)
            # Copied out: the next run overwrites the buffers (on the CPU, numpy() is a view of them).
            return [np.array(self._outputs[name].numpy(), copy=True) for name in output_names or self._outputs]


def _dynamic_inputs(session: Any) -> list[str]:
    return [i.name for i in session.get_inputs() if any(not isinstance(d, int) or d < 0 for d in i.shape)]


def _create(
    model_path: Path,
    chosen: list[str],
    *,
    cuda_graphs: bool,
    intra_op_threads: int = 0,
    spinning: bool | None = None,
    preoptimized: bool = False,
) -> Any:
    import onnxruntime as ort

    # enable_fallback=0: ONNX Runtime would otherwise retry on the CPU by itself and only print why.
    return ort.InferenceSession(
        os.fspath(model_path),
        session_options(intra_op_threads, spinning=spinning, optimize=not preoptimized),
        providers=provider_options(chosen, cuda_graphs=cuda_graphs),
        enable_fallback=0,
    )


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, which containers and ``taskset`` narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def lane_threads(instances: int) -> int:
    """Intra-op threads of each CPU lane: ``MODELYARD_ORT_INTRA_OP_THREADS``, else the cores shared out."""
    return settings.ORT_INTRA_OP_THREADS or max(1, usable_cores() // instances)


def build_cpu_lanes(
    model_path: Path, instances: int, *, spinning: bool | None = None, preoptimized: bool = False
) -> list[Any]:
    """One CPU session per instance, each with its share of the cores (:func:`lane_threads`).

    Two runs on one session would each want every core; on a small CPU their threads then wait on
    each other. Narrow sessions side by side do not (measured in the README, "Measured").
    """
    threads = lane_threads(instances)
    return [
        _create(
            model_path, [CPU], cuda_graphs=False, intra_op_threads=threads, spinning=spinning, preoptimized=preoptimized
        )
        for _ in range(instances)
    ]


def build_session(
    model_path: Path,
    *,
    fixed_address_io: bool = False,
    spinning: bool | None = None,
    optimized: OptimizedModels | None = None,
    digests: Mapping[str, str] | None = None,
) -> BuiltSession:
    """Create a session on the first requested provider that works; say why when that is not the first asked.

    ``fixed_address_io``: the caller runs the session through IO binding at fixed addresses, which a
    captured CUDA graph needs (a replay reads the inputs from where the capture found them and ignores
    what ``run()`` is given). Only then does ``MODELYARD_CUDA_GRAPHS`` apply.

    ``optimized`` and ``digests`` (the sha256 of each file of the version, as read and checked now): on
    the CPU, the session is made from ONNX Runtime's optimised graph saved in ``optimized`` by the
    first load (:func:`prepare_optimized`), with optimisation off; a saved graph that cannot be made
    or loaded leaves the session to be made from ``model_path`` as before.
    """
    installed = ort_install()
    import onnxruntime as ort

    wanted = requested_providers()
    notes: list[str] = []
    if GPU_PROVIDERS & set(wanted):
        status = gpu_status()  # preloads CUDA and cuDNN before the first CUDA session
        if not status.usable:
            if settings.REQUIRE_GPU:
                raise GpuUnavailable(f"{status.reason} (MODELYARD_REQUIRE_GPU is set: no CPU fallback)")
            notes.append(status.reason)
            wanted = [name for name in wanted if name not in GPU_PROVIDERS]
    available = set(ort.get_available_providers())
    for name in wanted:
        if name not in available:
            notes.append(f"{name} is not in this ONNX Runtime build ({installed})")
    chosen = [name for name in wanted if name in available]
    if CPU not in chosen:
        chosen.append(CPU)
    graphs = settings.CUDA_GRAPHS and fixed_address_io and bool(GPU_PROVIDERS & set(chosen))
    if settings.CUDA_GRAPHS and not fixed_address_io and GPU_PROVIDERS & set(chosen):
        notes.append(
            "MODELYARD_CUDA_GRAPHS is not used for this model: CUDA graphs need every input and output shape "
            "fixed and numeric, so that they run at fixed addresses"
        )
    source, preoptimized = model_path, False
    if optimized is not None and digests and chosen == [CPU] and settings.ORT_GRAPH_OPTIMIZATION != "disable":
        saved = prepare_optimized(model_path, digests, optimized)
        if saved is not None:
            source, preoptimized = saved, True
    while True:
        try:
            session = _create(source, chosen, cuda_graphs=graphs, spinning=spinning, preoptimized=preoptimized)
            break
        except Exception as exc:
            if preoptimized:
                logger.warning("%s: its saved optimised graph does not load (%s); loading the model", model_path, exc)
                source, preoptimized = model_path, False
                continue
            if graphs:
                # e.g. a node that only the CPU runs: a graph cannot be captured, the session still can be.
                notes.append(f"CUDA graphs are off for this model: {runtime_detail(exc)}")
                graphs = False
                continue
            if len(chosen) == 1:
                raise
            reason = explain_provider_error(chosen[0], str(exc))
            chosen = chosen[1:]
            if settings.REQUIRE_GPU and not GPU_PROVIDERS & set(chosen):
                raise GpuUnavailable(f"{reason} (MODELYARD_REQUIRE_GPU is set: no CPU fallback)") from exc
            logger.warning("%s: %s; trying %s", model_path.name, reason, chosen[0])
            notes.append(reason)
    provider = session.get_providers()[0]
    if provider != chosen[0]:
        # ONNX Runtime dropped the provider without an error: it could not load the provider's library.
        libraries = "TensorRT libraries" if chosen[0] == TENSORRT else "CUDA/cuDNN libraries"
        reason = f"{libraries} could not be loaded: ONNX Runtime dropped {chosen[0]} (its log on stderr says which)"
        if chosen[0] not in GPU_PROVIDERS:
            reason = f"{chosen[0]} could not be created: ONNX Runtime dropped it (its log on stderr says why)"
        if settings.REQUIRE_GPU and provider not in GPU_PROVIDERS:
            raise GpuUnavailable(f"{reason} (MODELYARD_REQUIRE_GPU is set: no CPU fallback)")
        notes.append(reason)
    if graphs and provider in GPU_PROVIDERS and (dynamic := _dynamic_inputs(session)):
        notes.append(f"CUDA graphs are off for this model: {', '.join(dynamic)} have dynamic dimensions")
        session = _create(
            model_path, [provider, *chosen[chosen.index(provider) + 1 :]], cuda_graphs=False, spinning=spinning
        )
        graphs = False
    requested = requested_providers()
    if requested and provider != requested[0] and not notes:
        notes.append(f"{requested[0]} was requested but {provider} loaded")
    note = "; ".join(notes)
    if note:
        logger.warning("%s runs on %s: %s", model_path.name, provider, note)
    return BuiltSession(
        session=session,
        provider=provider,
        note=note,
        graphs=graphs and provider in GPU_PROVIDERS,
        model_path=source,
        preoptimized=preoptimized,
    )


# --- Loading beside the serving sessions: the optimised graph saved once, lower priority ---------------------


@functools.cache
def _cpu_signature() -> str:
    """The machine and its CPU's instruction set flags: a graph optimised at level ``all`` may use them."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line for line in fh if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"{platform.machine()} {hashlib.sha256(flags.encode()).hexdigest()[:16]}"


def optimized_key(digests: Mapping[str, str], provider: str, level: str) -> str:
    """The name of a version's saved optimised graph: its files' digests, the ONNX Runtime build, the provider,
    the optimisation level and the CPU. Anything that would make another graph makes another key."""
    import onnxruntime as ort

    identity = {
        "format": 1,
        "files": sorted(digests.items()),
        "ort": f"{ort_install()} {ort.__version__}",
        "provider": provider,
        "level": level,
        "cpu": _cpu_signature(),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def prepare_optimized(model_path: Path, digests: Mapping[str, str], store: OptimizedModels) -> Path | None:
    """The version's optimised graph for the CPU from ``store``, saved there first if it is not yet.

    The graph is optimised by a session of one intra-op thread, on a thread of its own at
    ``MODELYARD_LOAD_NICE`` (it ends with it): what serves meanwhile keeps the cores. None when it
    cannot be saved (a model over 2 GB, a full disk): the load then optimises as before.
    """
    key = optimized_key(digests, CPU, settings.ORT_GRAPH_OPTIMIZATION)

    def save(target: Path) -> None:
        def optimise() -> None:
            import onnxruntime as ort

            options = session_options(1, spinning=False)
            options.optimized_model_filepath = os.fspath(target)
            ort.InferenceSession(os.fspath(model_path), options, providers=[CPU])

        run_at_priority(optimise, settings.LOAD_NICE)

    return store.get_or_make(key, save)


def run_at_priority(work: Callable[[], None], nice: int) -> None:
    """Run ``work`` on a thread of its own, ``nice`` lower than this one (Linux: priority is per thread); wait for it.

    The threads it starts (ONNX Runtime's) inherit the priority and end with the work's session.
    """
    failure: list[BaseException] = []

    def target() -> None:
        try:
            _lower_this_thread(nice)
            work()
        except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=target, name="model-optimise", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def _lower_this_thread(nice: int) -> tuple[int, int] | None:
    """(thread id, its nice value before) after adding ``nice`` to this thread's; None where it cannot be."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return None
    tid = threading.get_native_id()
    try:
        base = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, base + nice))
    except OSError:
        return None
    return tid, base


def thread_nice(tid: int | None = None) -> int:
    """The nice value of a thread of this process (this one by default)."""
    return os.getpriority(os.PRIO_PROCESS, tid or threading.get_native_id())


def _task_ids() -> set[int]:
    try:
        return {int(name) for name in os.listdir("/proc/self/task")}
    except OSError:
        return set()


@functools.cache
def priority_restorable() -> bool:
    """Whether a thread of this process may take back the priority it gave up (CAP_SYS_NICE or RLIMIT_NICE).

    Without it a load cannot run lowered as a whole: the threads of the sessions it builds would keep
    the lower priority while they serve. Only the optimisation (:func:`prepare_optimized`) then runs lowered.
    """
    result: list[bool] = []

    def probe() -> None:
        lowered = _lower_this_thread(1)
        if lowered is None:
            result.append(False)
            return
        try:
            os.setpriority(os.PRIO_PROCESS, lowered[0], lowered[1])
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, name="priority-probe", daemon=True)
    thread.start()
    thread.join()
    if not result[0]:
        logger.info(
            "MODELYARD_LOAD_NICE: this process may not raise a thread's priority back (no CAP_SYS_NICE, RLIMIT_NICE "
            "below 20), so loads run at the serving priority; only the graph optimisation runs lowered"
        )
    return result[0]


@contextlib.contextmanager
def load_priority(nice: int, seconds: float = 0.0) -> Iterator[bool]:
    """This thread ``nice`` lower for the block, for at most ``seconds`` (0: the whole block); then it and the
    threads started meanwhile (the new sessions' ONNX Runtime threads, which inherited the lower priority)
    go back to where it was: at the end of the block, to serve, or at the deadline, to finish sooner.

    Yields whether the thread runs lowered (not where :func:`priority_restorable` says it could not go back).
    """
    if nice <= 0 or not priority_restorable():
        yield False
        return
    before = _task_ids()
    lowered = _lower_this_thread(nice)
    if lowered is None:
        yield False
        return
    tid, base = lowered
    lock = threading.Lock()
    restored: list[bool] = []

    def restore() -> None:
        with lock:
            if restored:
                return
            restored.append(True)
            for task in sorted(_task_ids() - before):
                try:
                    if os.getpriority(os.PRIO_PROCESS, task) > base:
                        os.setpriority(os.PRIO_PROCESS, task, base)
                except OSError:  # it ended meanwhile
                    continue
            try:
                os.setpriority(os.PRIO_PROCESS, tid, base)
            except OSError as exc:
                logger.warning("MODELYARD_LOAD_NICE: the loading thread could not go back to nice %d: %s", base, exc)

    deadline = threading.Timer(seconds, restore) if seconds > 0 else None
    if deadline is not None:
        deadline.daemon = True
        deadline.start()
    try:
        yield True
    finally:
        if deadline is not None:
            deadline.cancel()
        restore()


def host_notice() -> str:
    """Why this process serves on the CPU though a GPU provider was asked for ("" if it was not, or it does not).

    The same for every session it builds (each one's note starts with it), so the fleet says it once per host.
    """
    if not GPU_PROVIDERS & set(requested_providers()):
        return ""
    status = gpu_status()
    return "" if status.usable else status.reason


def device_description() -> tuple[str, str]:
    """(device, provider) this process would use, for the fleet page; the device says why it is not the GPU.

    Also the start-up check of the ONNX Runtime installation: a process with two ORT wheels stops here.
    """
    ort_install()
    import onnxruntime as ort

    wanted = requested_providers()
    device = "cpu"
    if GPU_PROVIDERS & set(wanted):
        status = gpu_status()
        device = status.device
        if not status.usable:
            wanted = [name for name in wanted if name not in GPU_PROVIDERS]
    available = set(ort.get_available_providers())
    provider = next((name for name in wanted if name in available), CPU)
    if provider not in GPU_PROVIDERS and device.startswith("cuda"):
        device = "cpu"
    return device, provider
