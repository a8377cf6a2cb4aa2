"""A stand-in for ``pynvml`` (nvidia-ml-py) with the calls ``inference/telemetry.py`` makes, for hosts without a GPU.

Only the collector's unit tests use it, put in ``sys.modules`` in place of the real module; the
real module is what every other test (and the absent-GPU test) runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType, SimpleNamespace


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # the real binding's name
    pass


@dataclass
class FakeGpu:
    name: str
    utilisation_percent: int
    used: int
    total: int
    temperature: int
    milliwatts: int | None  # None: the board does not report power


def fake_pynvml(gpus: list[FakeGpu]) -> ModuleType:
    module = ModuleType("pynvml")
    module.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    module.NVMLError = NVMLError  # type: ignore[attr-defined]
    module.inits = 0  # type: ignore[attr-defined]

    def init() -> None:
        module.inits += 1  # type: ignore[attr-defined]

    def power(handle: FakeGpu) -> int:
        if handle.milliwatts is None:
            raise NVMLError_NotSupported("Not Supported")
        return handle.milliwatts

    module.nvmlInit = init  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(gpus)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda index: gpus[index]  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda handle: handle.name  # type: ignore[attr-defined]
    module.nvmlDeviceGetUtilizationRates = lambda handle: SimpleNamespace(  # type: ignore[attr-defined]
        gpu=handle.utilisation_percent, memory=0
    )
    module.nvmlDeviceGetMemoryInfo = lambda handle: SimpleNamespace(  # type: ignore[attr-defined]
        used=handle.used, total=handle.total, free=handle.total - handle.used
    )
    module.nvmlDeviceGetTemperature = lambda handle, sensor: handle.temperature  # type: ignore[attr-defined]
    module.nvmlDeviceGetPowerUsage = power  # type: ignore[attr-defined]
    return module
