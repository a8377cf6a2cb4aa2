"""GPU readings through NVML (``nvidia-ml-py``): utilisation, memory, temperature and power per device.

Read by the ``/metrics`` scrape (``inference.metrics.GpuCollector``) and by the fleet heartbeat
(each worker reports its devices' memory in use). NVML is started once per process, on first use.
A host without NVML (no ``pynvml``, no driver, no GPU) reads as no devices: nothing is exported,
nothing fails, and the reason is logged once. A reading one device does not support (power on
some boards) is left out for that device only.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceReading:
    """One GPU as NVML sees it now; ``None`` where the device does not report the value."""

    index: int
    name: str
    utilization: float | None  # 0 to 1: share of the last sample period with a kernel running
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    temperature_celsius: float | None
    power_watts: float | None


_lock = threading.Lock()
_nvml: Any = None
_unavailable = ""  # why NVML cannot be used in this process, once that is known


def _start() -> Any:
    """The ``pynvml`` module, initialised, or None when this process has no NVML to read."""
    global _nvml, _unavailable
    with _lock:
        if _nvml is not None or _unavailable:
            return _nvml
        try:
            import pynvml
        except ImportError as exc:
            _unavailable = f"nvidia-ml-py is not installed ({exc})"
        else:
            try:
                pynvml.nvmlInit()
                _nvml = pynvml
            except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
                _unavailable = f"NVML could not start: {exc}"
        if _unavailable:
            logger.info("no GPU telemetry: %s", _unavailable)
        return _nvml


def reset() -> None:
    """Forget what was found, so the next read starts NVML again (tests, after replacing ``pynvml``)."""
    global _nvml, _unavailable
    with _lock:
        _nvml, _unavailable = None, ""


def _reading(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and the like: this value is absent
        return None


def read_devices() -> list[DeviceReading]:
    """Every device NVML sees, read now; an empty list where there is no NVML or no GPU."""
    nvml = _start()
    if nvml is None:
        return []
    try:
        count = nvml.nvmlDeviceGetCount()
    except Exception as exc:  # noqa: BLE001 - the driver went away: report no devices, say why once
        logger.warning("NVML stopped answering: %s", exc)
        return []
    devices = []
    for index in range(count):
        handle = _reading(nvml.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            continue
        name = _reading(nvml.nvmlDeviceGetName, handle) or f"gpu{index}"
        if isinstance(name, bytes):  # older bindings answer bytes
            name = name.decode(errors="replace")
        rates = _reading(nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = _reading(nvml.nvmlDeviceGetMemoryInfo, handle)
        temperature = _reading(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        milliwatts = _reading(nvml.nvmlDeviceGetPowerUsage, handle)
        devices.append(
            DeviceReading(
                index=index,
                name=str(name),
                utilization=rates.gpu / 100 if rates is not None else None,
                memory_used_bytes=int(memory.used) if memory is not None else None,
                memory_total_bytes=int(memory.total) if memory is not None else None,
                temperature_celsius=float(temperature) if temperature is not None else None,
                power_watts=milliwatts / 1000 if milliwatts is not None else None,
            )
        )
    return devices
