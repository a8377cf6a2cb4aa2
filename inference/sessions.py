"""Building ONNX Runtime sessions on the preferred execution provider, falling back to the CPU."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

logger = logging.getLogger(__name__)

PROVIDER_NAMES = {
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "rocm": "ROCMExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "cpu": "CPUExecutionProvider",
}
_GRAPH_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED"}
_dlls_preloaded = False


@dataclass
class BuiltSession:
    """A ready ONNX Runtime session and what it really runs on."""

    session: Any
    provider: str
    note: str = ""


def requested_providers() -> list[str]:
    names = []
    for item in settings.PROVIDERS:
        name = PROVIDER_NAMES.get(item.lower(), item)
        if name not in names:
            names.append(name)
    return names


def _preload_dlls(wanted: list[str]) -> None:
    global _dlls_preloaded
    import onnxruntime as ort

    if _dlls_preloaded or "CUDAExecutionProvider" not in wanted or not hasattr(ort, "preload_dlls"):
        return
    try:
        ort.preload_dlls()
    except Exception as exc:  # noqa: BLE001 - a machine without CUDA libraries falls back to the CPU
        logger.info("onnxruntime.preload_dlls() failed: %s", exc)
    _dlls_preloaded = True


def session_options() -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if settings.ORT_INTRA_OP_THREADS:
        options.intra_op_num_threads = settings.ORT_INTRA_OP_THREADS
    if settings.ORT_INTER_OP_THREADS:
        options.inter_op_num_threads = settings.ORT_INTER_OP_THREADS
    level = _GRAPH_LEVELS.get(settings.ORT_GRAPH_OPTIMIZATION, "ORT_ENABLE_ALL")
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.log_severity_level = 3
    if not settings.ORT_SPINNING:
        # Idle intra-op threads sleep instead of spinning, leaving the cores to the event loop between runs.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options


def build_session(model_path: Path) -> BuiltSession:
    """Create a session on the first requested provider that works; say so when it fell back."""
    import onnxruntime as ort

    wanted = requested_providers()
    _preload_dlls(wanted)
    available = set(ort.get_available_providers())
    chosen = [name for name in wanted if name in available] or ["CPUExecutionProvider"]
    skipped = [name for name in wanted if name not in available]
    provider_args: list[Any] = [
        (name, {"device_id": settings.CUDA_DEVICE_ID}) if name == "CUDAExecutionProvider" else name for name in chosen
    ]
    note = f"{', '.join(skipped)} not available in this ONNX Runtime build" if skipped else ""
    try:
        session = ort.InferenceSession(os.fspath(model_path), session_options(), providers=provider_args)
    except Exception as exc:
        if chosen == ["CPUExecutionProvider"]:
            raise
        logger.warning("session on %s failed (%s); falling back to the CPU", chosen[0], exc)
        session = ort.InferenceSession(os.fspath(model_path), session_options(), providers=["CPUExecutionProvider"])
        note = f"{chosen[0]} failed: {exc}"
    provider = session.get_providers()[0]
    if wanted and provider != wanted[0]:
        note = note or f"{wanted[0]} was requested but {provider} loaded"
        logger.warning("%s: %s", model_path.name, note)
    return BuiltSession(session=session, provider=provider, note=note)


def device_description() -> tuple[str, str]:
    """(device, provider) this process would use, for the fleet page."""
    import onnxruntime as ort

    wanted = requested_providers()
    available = set(ort.get_available_providers())
    provider = next((name for name in wanted if name in available), "CPUExecutionProvider")
    device = f"cuda:{settings.CUDA_DEVICE_ID}" if provider == "CUDAExecutionProvider" else "cpu"
    return device, provider
