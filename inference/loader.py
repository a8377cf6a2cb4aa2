"""Loading a version: its bundle, verified, to a session (or CPU lanes), warmed up, as a :class:`LoadedVersion`.

The reconcile loop (``inference/runtime.py``) calls :func:`load_version` on its loading thread,
never on the request path: the artifact cache fetches the version's files and checks every
sha256 (``ArtifactCache.bundle_with_digests``), ``inference.verify`` checks the version's signatures
against the digests of the bytes read, ``inference.sessions`` builds the session (with fixed-address
buffers when it replays a CUDA graph, and one narrow session per instance on the CPU), the
tokenizer and the labels are read when the version has them, and every session runs once before
the version takes traffic.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from pathlib import Path
from typing import Any

from django.conf import settings

from inference.cache import ArtifactCache
from inference.errors import InferenceError
from inference.loaded import LoadedVersion, instances_for
from inference.protocol import decode_request
from inference.sessions import (
    CPU,
    GPU_PROVIDERS,
    FixedAddressRunner,
    build_cpu_lanes,
    build_session,
    lane_threads,
    load_priority,
    unfixed_tensors,
)
from inference.text import TOKENIZER_FILE, TextEncoder
from inference.verify import verify_version
from onnxkit.datatypes import synthetic_inputs
from registry.serving import VersionSpec

__all__ = ["LABELS_FILE", "SAMPLE_INPUTS_FILE", "load_version"]

logger = logging.getLogger(__name__)

# Extras a version may carry: the classification labels, one per line (the output's class index is
# the line number from 0), and sample inputs in the /v2 JSON request format (validation and warm-up run them).
LABELS_FILE = "labels.txt"
SAMPLE_INPUTS_FILE = "sample_inputs.json"


def load_version(spec: VersionSpec, cache: ArtifactCache) -> LoadedVersion:
    """The version ``spec`` loaded from ``cache`` and warmed up, ready to take traffic; raises whatever failed.

    Blocking (downloads, session building, warm-up runs): the reconcile loop calls it on its loading thread.
    """
    started = time.perf_counter()
    rss_before = _rss_bytes()
    # Lower than serving while it hashes, builds and warms up (for at most MODELYARD_LOAD_NICE_SECONDS);
    # the new sessions' threads go back up after.
    with load_priority(settings.LOAD_NICE, settings.LOAD_NICE_SECONDS):
        folder, digests = cache.bundle_with_digests(spec.sha256, spec.files)
        verify_version(spec, digests)  # the bytes just read, against bundles read from storage: before any session
        built = build_session(
            folder / spec.model_file,
            fixed_address_io=not unfixed_tensors(spec.signature),
            spinning=spinning(spec),
            optimized=cache.optimized,
            digests=digests,
        )
        runner = None
        if built.graphs:  # the session replays a captured CUDA graph: its inputs must stay where it found them
            device = "cuda" if built.provider in GPU_PROVIDERS else "cpu"
            runner = FixedAddressRunner(built.session, spec.signature, device=device, device_id=settings.CUDA_DEVICE_ID)
        extras = {item.name for item in spec.files}
        text = None
        if "text" in spec.signature and TOKENIZER_FILE in extras:
            text = TextEncoder.load(
                folder,
                spec.signature["text"],
                built.session,
                max_bytes=settings.TOKENIZER_MAX_BYTES,
                max_tokens=settings.TEXT_MAX_TOKENS,
                truncate=settings.TEXT_TRUNCATE,
                max_texts=settings.TEXT_MAX_TEXTS,
            )
        samples = folder / SAMPLE_INPUTS_FILE if SAMPLE_INPUTS_FILE in extras else None
        _warm_up(built.session, spec, samples, runner)
        make_lanes = None
        lanes: list[Any] = []
        if built.provider == CPU:
            make_lanes = functools.partial(
                _cpu_lanes,
                folder / spec.model_file,
                spec,
                samples,
                optimized=built.model_path if built.preoptimized else None,
            )
            instances = instances_for(spec, built.provider)
            lanes = make_lanes(instances) if instances > 1 else []
    loaded = LoadedVersion(
        spec,
        built.session,
        built.provider,
        load_seconds=time.perf_counter() - started,
        memory_bytes=max(0, _rss_bytes() - rss_before),
        note=built.note,
        labels=_read_labels(folder / LABELS_FILE) if LABELS_FILE in extras else (),
        text=text,
        runner=runner,
        lanes=lanes,
        make_lanes=make_lanes,
    )
    logger.info("loaded %s v%s on %s in %.2fs", spec.model, spec.version, built.provider, loaded.load_seconds)
    return loaded


def spinning(spec: VersionSpec) -> bool:
    """Whether the version's idle ONNX Runtime threads spin: as ``MODELYARD_ORT_SPINNING`` says, except for a
    shadow's candidate that serves nothing itself (``spec.mirror_only``), whose threads always sleep.

    Spinning threads keep a core busy between runs to start the next one sooner. The primary's can
    afford it; a candidate's would take the primary's cores for the mirrored requests it rarely runs,
    which costs the primary more than the mirror's own run time (``bench/progressive.py``). When the
    candidate starts serving (promoted, or a rollout's share), the runtime loads it again with the
    setting's threads and switches to that session (``inference/runtime.py``).
    """
    return settings.ORT_SPINNING and not spec.mirror_only


def _cpu_lanes(
    model_path: Path, spec: VersionSpec, samples: Path | None, instances: int, *, optimized: Path | None = None
) -> list[Any]:
    """The CPU lanes of a version with ``instances`` > 1, each warmed up like the version's session.

    From the saved optimised graph the version's session was made from (``optimized``), while it is
    still there (lanes are built again when the instances change, and the graph may be evicted by then).
    """
    preoptimized = optimized is not None and optimized.exists()
    source = optimized if optimized is not None and preoptimized else model_path
    lanes = build_cpu_lanes(source, instances, spinning=spinning(spec), preoptimized=preoptimized)
    for lane in lanes:
        _warm_up(lane, spec, samples)
    logger.info(
        "%s v%s: %d CPU lanes of %d intra-op threads", spec.model, spec.version, instances, lane_threads(instances)
    )
    return lanes


def _warm_up(session: Any, spec: VersionSpec, samples: Path | None, runner: FixedAddressRunner | None = None) -> None:
    """One run before the version takes traffic: on its sample inputs when it has them, else on synthetic ones.

    Synthetic strings ("a") mean nothing to a model that parses its string inputs. Validation lets such
    a version through with a warning when it has no sample inputs, and so does the warm-up: it logs.
    """
    if samples is not None:
        try:
            request = decode_request(samples.read_bytes(), None, spec.signature)
        except InferenceError as exc:
            raise ValueError(f"{SAMPLE_INPUTS_FILE}: {exc.message}") from None
        (runner or session).run(None, request.inputs)
        return
    try:
        (runner or session).run(None, synthetic_inputs(session))
    except Exception as exc:
        if not any(item["datatype"] == "BYTES" for item in spec.signature.get("inputs", [])):
            raise
        logger.warning(
            "%s v%s: the warm-up on synthetic string inputs failed (%s); it serves without one. Upload %s "
            "with the version to warm it up on real inputs",
            spec.model,
            spec.version,
            exc,
            SAMPLE_INPUTS_FILE,
        )


def _read_labels(path: Path) -> tuple[str, ...]:
    """One label per line; the line number (from 0) is the class index."""
    return tuple(line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines())


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0
