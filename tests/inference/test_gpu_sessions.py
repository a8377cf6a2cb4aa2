"""The GPU path without a GPU: one ONNX Runtime wheel, why CUDA did not load, and the provider options.

This machine (and CI) has the CPU wheel and no device, which is exactly the case a GPU host gets
wrong silently: these tests build real ONNX Runtime sessions and check that the note, the fleet and
``MODELYARD_REQUIRE_GPU`` say why CUDA is not used. The GPU wheel's half (libraries that do not load)
runs in ``make check-gpu-wheel`` (``scripts/check_gpu_wheel.py``), in a venv of its own.
"""

from __future__ import annotations

import ctypes
import sys
from importlib.metadata import version as dist_version
from pathlib import Path

import pytest

from inference import sessions
from inference.cache import ArtifactCache
from inference.sessions import (
    GpuUnavailable,
    OnnxRuntimeInstallError,
    build_session,
    check_ort_install,
    cuda_device_count,
    device_description,
    explain_provider_error,
    host_notice,
    ort_distributions,
    provider_options,
)
from registry.models import InferenceWorker
from tests.support.onnx_models import add_model_bytes
from tests.support.polling import reconcile_until
from tests.support.registry import create_model, promote, upload_versions
from tests.support.settings_probe import settings_outcomes

CPU_WHEEL = f"onnxruntime {dist_version('onnxruntime')}"
NO_CUDA = (
    f"this ONNX Runtime build has no CUDA provider ({CPU_WHEEL}, the CPU wheel, is installed; install modelyard[gpu])"
)
REQUIRED = " (MODELYARD_REQUIRE_GPU is set: no CPU fallback)"


@pytest.fixture(autouse=True)
def _fresh_checks():
    """What a process learns once (the install, CUDA's state) is learnt again in each test."""
    sessions.ort_install.cache_clear()
    sessions.gpu_status.cache_clear()
    yield
    sessions.ort_install.cache_clear()
    sessions.gpu_status.cache_clear()


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    path.write_bytes(add_model_bytes(bias=1.0))
    return path


# --- One ONNX Runtime ----------------------------------------------------------------------------------


def fake_dist(site: Path, name: str, version: str, top_level: str | None = "onnxruntime") -> None:
    """A distribution as pip leaves it: ``<name>-<version>.dist-info`` with METADATA, RECORD and top_level.txt."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{top_level or name}/__init__.py,,\n{info.name}/METADATA,,\n")
    if top_level is not None:
        (info / "top_level.txt").write_text(f"{top_level}\n")


def test_this_environment_has_exactly_one_onnxruntime():
    assert check_ort_install() == CPU_WHEEL


def test_cpu_and_gpu_wheels_in_one_package_are_refused_naming_the_fix(tmp_path):
    site = tmp_path / "site-packages"
    fake_dist(site, "onnxruntime", "1.32.0")
    fake_dist(site, "onnxruntime-gpu", "1.31.1")
    fake_dist(site, "onnxruntime-genai", "0.9.0", top_level="onnxruntime_genai")  # another package: not counted
    fake_dist(site, "numpy", "2.3.0", top_level=None)  # no top_level.txt: RECORD decides
    assert ort_distributions(site) == ["onnxruntime 1.32.0", "onnxruntime-gpu 1.31.1"]
    with pytest.raises(OnnxRuntimeInstallError) as refused:
        check_ort_install(site)
    assert str(refused.value) == (
        f"2 ONNX Runtime distributions are installed into the same onnxruntime package in {site}: "
        "onnxruntime 1.32.0, onnxruntime-gpu 1.31.1. They overwrite each other's files, so the build that runs is "
        "an accident (the CPU wheel over the GPU one silently drops CUDA). Keep exactly one: pip uninstall -y "
        "onnxruntime onnxruntime-gpu, then pip install 'modelyard[gpu]' on a CUDA host or 'modelyard[cpu]' "
        "elsewhere (make install-gpu / make install do both steps)."
    )


def test_one_gpu_wheel_passes_and_no_wheel_is_refused(tmp_path):
    site = tmp_path / "site-packages"
    fake_dist(site, "onnxruntime-gpu", "1.31.1")
    assert check_ort_install(site) == "onnxruntime-gpu 1.31.1"
    with pytest.raises(OnnxRuntimeInstallError, match=r"^No ONNX Runtime is installed: pip install 'modelyard\[cpu\]'"):
        check_ort_install(tmp_path / "empty")


def test_a_process_with_two_wheels_does_not_start(monkeypatch, tmp_path):
    site = tmp_path / "site-packages"
    fake_dist(site, "onnxruntime", "1.32.0")
    fake_dist(site, "onnxruntime-gpu", "1.31.1")
    monkeypatch.setattr(sessions, "_ort_site", lambda: site)
    with pytest.raises(OnnxRuntimeInstallError, match=r"^2 ONNX Runtime distributions are installed"):
        device_description()  # what InferenceRuntime() calls first


# --- Why CUDA is not used ------------------------------------------------------------------------------


def test_cpu_wheel_note_says_cuda_is_missing_from_the_build(settings, model_path):
    settings.PROVIDERS = ["cuda", "cpu"]
    built = build_session(model_path)
    assert (built.provider, built.note) == ("CPUExecutionProvider", NO_CUDA)
    assert device_description() == ("cpu (no CUDA in this ONNX Runtime build)", "CPUExecutionProvider")


def test_require_gpu_makes_the_missing_cuda_provider_a_load_failure(settings, model_path):
    settings.PROVIDERS = ["cuda", "cpu"]
    settings.REQUIRE_GPU = True
    with pytest.raises(GpuUnavailable) as failed:
        build_session(model_path)
    assert str(failed.value) == NO_CUDA + REQUIRED


def test_a_requested_provider_missing_from_the_build_is_noted(settings, model_path):
    settings.PROVIDERS = ["openvino", "cpu"]
    built = build_session(model_path)
    assert (built.provider, built.note) == (
        "CPUExecutionProvider",
        f"OpenVINOExecutionProvider is not in this ONNX Runtime build ({CPU_WHEEL})",
    )


def test_cpu_only_says_nothing(settings, model_path):
    settings.PROVIDERS = ["cpu"]
    built = build_session(model_path)
    assert (built.provider, built.note) == ("CPUExecutionProvider", "")
    assert device_description() == ("cpu", "CPUExecutionProvider")


@pytest.mark.django_db(transaction=True)
def test_fleet_shows_the_version_failed_with_the_reason_when_the_gpu_is_required(
    owner, approver, make_runtime, settings
):
    settings.PROVIDERS = ["cuda", "cpu"]
    settings.REQUIRE_GPU = True
    create_model(owner)
    upload_versions(owner, [1.0])
    promote(owner, approver, 1)
    runtime = make_runtime("inproc-gpu-required")
    reconcile_until(runtime, lambda: runtime.status.failures, what="the load never failed")
    runtime.heartbeat()
    worker = InferenceWorker.objects.get(worker_id=runtime.worker_id)
    assert (worker.device, worker.provider) == ("cpu (no CUDA in this ONNX Runtime build)", "CPUExecutionProvider")
    [row] = worker.loaded
    assert (row["model"], row["version"], row["state"], row["error"]) == (
        "demo",
        1,
        "failed",
        f"GpuUnavailable: {NO_CUDA}{REQUIRED}",
    )
    assert runtime.router.resolve("demo") is None  # nothing serves it on the CPU


@pytest.mark.django_db(transaction=True)
def test_a_cpu_host_reports_why_it_has_no_cuda_once_as_its_notice(owner, approver, make_runtime, settings):
    settings.PROVIDERS = ["cuda", "cpu"]
    create_model(owner)
    upload_versions(owner, [1.0])
    promote(owner, approver, 1)
    runtime = make_runtime("inproc-cpu-host")
    reconcile_until(runtime, lambda: runtime.router.resolve("demo"), what="demo never served")
    runtime.heartbeat()
    worker = InferenceWorker.objects.get(worker_id=runtime.worker_id)
    assert worker.notice == NO_CUDA  # said once for the process; the fleet page says it once per host
    [row] = worker.loaded
    assert row["note"] == NO_CUDA  # each session's own note still says it, for the API and the version page
    settings.PROVIDERS = ["cpu"]
    assert host_notice() == ""  # no GPU asked for: nothing to explain


@pytest.mark.parametrize(
    ("provider", "error", "reason"),
    [
        (
            "CUDAExecutionProvider",
            "/onnxruntime_src/onnxruntime/core/providers/cuda/cuda_call.cc:129 std::conditional_t<THRW, void, "
            "onnxruntime::common::Status> onnxruntime::CudaCall(ERRTYPE, const char*, const char*, SUCCTYPE, const "
            "char*, const char*, int) CUDA failure 100: no CUDA-capable device is detected ; GPU=32767 ; "
            "hostname=h ; file=/onnxruntime_src/onnxruntime/core/providers/cuda/cuda_execution_provider.cc ; "
            "line=282 ; expr=cudaSetDevice(info_.device_id);",
            "no CUDA device: CUDA failure 100: no CUDA-capable device is detected",
        ),
        (
            "TensorrtExecutionProvider",
            "/onnxruntime_src/onnxruntime/python/onnxruntime_pybind_state.cc:729 void onnxruntime::python::"
            "RegisterTensorRTPluginsAsCustomOps(PySessionOptions&, const onnxruntime::ProviderOptions&) Please "
            "install TensorRT libraries as mentioned in the GPU requirements page, make sure they're in the PATH "
            "or LD_LIBRARY_PATH, and that your GPU is supported.",
            "TensorRT libraries could not be loaded: Please install TensorRT libraries as mentioned in the GPU "
            "requirements page, make sure they're in the PATH or LD_LIBRARY_PATH, and that your GPU is supported.",
        ),
        (
            "CUDAExecutionProvider",
            "Failed to load library libonnxruntime_providers_cuda.so with error: libcublasLt.so.13: cannot open "
            "shared object file: No such file or directory",
            "CUDA/cuDNN libraries could not be loaded: Failed to load library libonnxruntime_providers_cuda.so "
            "with error: libcublasLt.so.13: cannot open shared object file: No such file or directory",
        ),
        ("CUDAExecutionProvider", "out of memory", "CUDAExecutionProvider failed: out of memory"),
    ],
)
def test_provider_errors_are_sorted_into_the_reasons_the_fleet_shows(provider, error, reason):
    assert explain_provider_error(provider, error) == reason


def _loads(name: str) -> bool:
    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux") or _loads("libcuda.so.1"), reason="an NVIDIA driver is here")
def test_no_driver_means_no_cuda_device():
    assert cuda_device_count("13") == (
        0,
        "the NVIDIA driver is not installed (libcuda.so.1: cannot open shared object file: No such file or directory)",
    )


# --- Provider options ----------------------------------------------------------------------------------


def test_cuda_options_default_to_onnxruntime_defaults(settings):
    settings.CUDA_DEVICE_ID = 0
    assert provider_options(["CUDAExecutionProvider", "CPUExecutionProvider"]) == [
        (
            "CUDAExecutionProvider",
            {
                "device_id": "0",
                "arena_extend_strategy": "kNextPowerOfTwo",
                "cudnn_conv_algo_search": "EXHAUSTIVE",
                "do_copy_in_default_stream": "True",
                "enable_cuda_graph": "False",
            },
        ),
        ("CPUExecutionProvider", {}),
    ]


def test_cuda_and_tensorrt_options_follow_the_settings(settings, tmp_path):
    settings.CUDA_DEVICE_ID = 1
    settings.CUDA_MEM_LIMIT_MB = 2048
    settings.CUDA_ARENA_STRATEGY = "kSameAsRequested"
    settings.CUDA_CONV_ALGO_SEARCH = "HEURISTIC"
    settings.CUDA_COPY_IN_DEFAULT_STREAM = False
    settings.TRT_FP16 = True
    settings.CACHE_DIR = tmp_path / "cache"
    engines = str(tmp_path / "cache" / "tensorrt")
    assert provider_options(["TensorrtExecutionProvider", "CUDAExecutionProvider"], cuda_graphs=True) == [
        (
            "TensorrtExecutionProvider",
            {
                "device_id": "1",
                "trt_engine_cache_enable": "True",
                "trt_engine_cache_path": engines,
                "trt_timing_cache_enable": "True",
                "trt_timing_cache_path": engines,
                "trt_fp16_enable": "True",
                "trt_cuda_graph_enable": "True",
            },
        ),
        (
            "CUDAExecutionProvider",
            {
                "device_id": "1",
                "arena_extend_strategy": "kSameAsRequested",
                "cudnn_conv_algo_search": "HEURISTIC",
                "do_copy_in_default_stream": "False",
                "enable_cuda_graph": "True",
                "gpu_mem_limit": str(2048 * 1024 * 1024),
            },
        ),
    ]


def test_tensorrt_engine_cache_is_never_evicted_with_the_bundles(tmp_path):
    cache = ArtifactCache(tmp_path / "cache", max_bytes=0)
    engines = tmp_path / "cache" / "tensorrt"
    engines.mkdir()
    (engines / "model_sm90.engine").write_bytes(b"x" * 1000)
    bundle = tmp_path / "cache" / ("ab" * 32)
    bundle.mkdir()
    (bundle / "model.onnx").write_bytes(b"y" * 1000)
    assert cache.evict(keep=set()) == ["ab" * 32]
    assert (engines / "model_sm90.engine").exists()


def test_bad_gpu_settings_stop_startup_naming_the_variable(tmp_path):
    cases = {
        "MODELYARD_CUDA_MEM_LIMIT_MB=lots": "MODELYARD_CUDA_MEM_LIMIT_MB: expected an integer, got 'lots'",
        "MODELYARD_CUDA_MEM_LIMIT_MB=-1": "MODELYARD_CUDA_MEM_LIMIT_MB: must be at least 0, got -1",
        "MODELYARD_CUDA_ARENA_STRATEGY=doubling": (
            "MODELYARD_CUDA_ARENA_STRATEGY: expected one of kNextPowerOfTwo, kSameAsRequested, got 'doubling'"
        ),
        "MODELYARD_CUDA_ARENA_STRATEGY=ksameasrequested": "ok kSameAsRequested",
        "MODELYARD_CUDA_CONV_ALGO_SEARCH=fastest": (
            "MODELYARD_CUDA_CONV_ALGO_SEARCH: expected one of EXHAUSTIVE, HEURISTIC, DEFAULT, got 'fastest'"
        ),
        "MODELYARD_CUDA_COPY_IN_DEFAULT_STREAM=sometimes": (
            "MODELYARD_CUDA_COPY_IN_DEFAULT_STREAM: expected true or false, got 'sometimes'"
        ),
        "MODELYARD_CUDA_GRAPHS=2": "MODELYARD_CUDA_GRAPHS: expected true or false, got '2'",
        "MODELYARD_TRT_FP16=half": "MODELYARD_TRT_FP16: expected true or false, got 'half'",
        "MODELYARD_PROVIDERS=cdua,cpu": (
            "MODELYARD_PROVIDERS: unknown execution provider 'cdua'; expected cuda, tensorrt, rocm, openvino, "
            "coreml, cpu or a full name such as CUDAExecutionProvider"
        ),
        "MODELYARD_REQUIRE_GPU=true MODELYARD_PROVIDERS=openvino,cpu": (
            "MODELYARD_REQUIRE_GPU: MODELYARD_PROVIDERS=openvino,cpu names no GPU provider (cuda or tensorrt)"
        ),
        "MODELYARD_REQUIRE_GPU=true MODELYARD_PROVIDERS=TensorrtExecutionProvider,cpu": "ok kNextPowerOfTwo",
    }
    assert settings_outcomes(tmp_path, cases, ["CUDA_ARENA_STRATEGY"]) == list(cases.values())
