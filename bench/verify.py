"""Verification at load: what checking a version's signature costs over only reading and hashing its bytes.

    .venv/bin/python bench/verify.py [--rounds 5] [--large-mib 1024]

For all-MiniLM-L6-v2 (``../shared/models/minilm-l6``, 90 MB with its tokenizer) and a generated bundle
of ``--large-mib`` MiB (a model file of random bytes: nothing here parses ONNX), both in a local
artifact folder with the registry's signature beside them, it times, in the same run:

- **cold**: the artifact cache fetching the bundle from storage, hashing as it streams
  (``ArtifactCache.bundle_with_digests``), then ``inference.verify.verify_version`` (the bundle read
  from storage, its ECDSA signature checked, its digests compared); against a plain copy of the
  same files from storage that hashes them as it copies;
- **warm**: the same on a cache that already holds the files (every file hashed again, as every load
  does); against hashing the cached files.

It reports the medians, their ratio (goal: at most 1.1x) and the bytes this process read during
the checked load (``rchar`` of ``/proc/self/io``) over the bundle's size: 1.0 means no second read.
Everything runs in this process on 127.0.0.1's disk; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MINILM = ROOT.parent / "shared" / "models" / "minilm-l6"
CHUNK = 1024 * 1024


def setup_django(storage: Path, key: bytes) -> None:
    import django
    from django.conf import settings

    from modelyard.env import StorageConfig

    settings.configure(
        SIGNING_KEY=key,
        VERIFY_KEYS=[],
        TRUSTED_SIGNERS=[],
        STORAGE=StorageConfig(kind="file", path=str(storage)),
        INSTALLED_APPS=[],
    )
    django.setup()


def rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


def median_seconds(run: Callable[[], Any], rounds: int, before: Callable[[], None] = lambda: None) -> float:
    times = []
    for _ in range(rounds):
        before()
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def stage(storage: Path, name: str, files: dict[str, Path], signer: Any) -> SimpleNamespace:
    """Copy ``files`` into the artifact folder under one prefix, sign them there; the spec a load gets."""
    prefix = f"artifacts/{name}/bench"
    (storage / prefix).mkdir(parents=True, exist_ok=True)
    served = []
    digests = {}
    for file_name, source in files.items():
        target = storage / prefix / file_name
        shutil.copyfile(source, target)
        digest = hashlib.sha256()
        with target.open("rb") as fh:
            while chunk := fh.read(CHUNK):
                digest.update(chunk)
        digests[file_name] = digest.hexdigest()
        served.append(SimpleNamespace(name=file_name, storage_key=f"{prefix}/{file_name}", sha256=digests[file_name]))
        served[-1].size_bytes = target.stat().st_size
    (storage / prefix / ".registry.sig").write_bytes(signer.sign(digests, name=name))
    signature = SimpleNamespace(kind="registry", signer="modelyard", storage_key=f"{prefix}/.registry.sig")
    return SimpleNamespace(
        model=name, version=1, sha256=digests[next(iter(files))], files=tuple(served), signatures=(signature,)
    )


def copy_and_hash(storage: Path, spec: SimpleNamespace, target: Path) -> None:
    """The baseline of a cold load: every file read from storage once, hashed, written."""
    target.mkdir(parents=True, exist_ok=True)
    for item in spec.files:
        digest = hashlib.sha256()
        with (storage / item.storage_key).open("rb") as source, (target / item.name).open("wb") as out:
            while chunk := source.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
        assert digest.hexdigest() == item.sha256


def hash_files(folder: Path, spec: SimpleNamespace) -> None:
    """The baseline of a warm load: every cached file read once and hashed."""
    for item in spec.files:
        digest = hashlib.sha256()
        with (folder / item.name).open("rb") as fh:
            while chunk := fh.read(CHUNK):
                digest.update(chunk)
        assert digest.hexdigest() == item.sha256


def measure(storage: Path, work: Path, spec: SimpleNamespace, rounds: int) -> dict[str, Any]:
    from inference.cache import ArtifactCache
    from inference.verify import verify_version

    size = sum(item.size_bytes for item in spec.files)
    cache = ArtifactCache(work / "cache", max_bytes=1 << 40)
    plain = work / "plain"

    def clear() -> None:
        shutil.rmtree(cache.root / spec.sha256, ignore_errors=True)
        shutil.rmtree(plain, ignore_errors=True)

    def checked_load() -> None:
        _, digests = cache.bundle_with_digests(spec.sha256, spec.files)
        verify_version(spec, digests)

    results: dict[str, Any] = {"bytes": size}
    results["cold_baseline_s"] = median_seconds(lambda: copy_and_hash(storage, spec, plain), rounds, clear)
    results["cold_verified_s"] = median_seconds(checked_load, rounds, clear)
    checked_load()  # the cache now holds the files
    read_before = rchar()
    checked_load()
    results["warm_read_ratio"] = (rchar() - read_before) / size
    results["warm_baseline_s"] = median_seconds(lambda: hash_files(cache.root / spec.sha256, spec), rounds)
    results["warm_verified_s"] = median_seconds(checked_load, rounds)
    started = time.perf_counter()
    for _ in range(20):
        verify_version(spec, {item.name: item.sha256 for item in spec.files})
    results["signature_only_ms"] = (time.perf_counter() - started) / 20 * 1000
    for phase in ("cold", "warm"):
        results[f"{phase}_ratio"] = results[f"{phase}_verified_s"] / results[f"{phase}_baseline_s"]
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--large-mib", type=int, default=1024, help="size of the generated bundle (0: skip it)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from modelyard.provenance import Signer, generate_private_key

    key = generate_private_key()
    signer = Signer(key)
    with tempfile.TemporaryDirectory(prefix="modelyard-bench-verify-") as tmp:
        work = Path(tmp)
        storage = work / "storage"
        setup_django(storage, key)
        bundles = {
            "minilm": {
                "model.onnx": MINILM / "model.onnx",
                "tokenizer.json": MINILM / "tokenizer.json",
            }
        }
        if args.large_mib:
            large = work / "large.bin"
            with large.open("wb") as fh:
                for _ in range(args.large_mib):
                    fh.write(os.urandom(CHUNK))
            bundles[f"random-{args.large_mib}mib"] = {"model.onnx": large}
        rows = {}
        for name, files in bundles.items():
            spec = stage(storage, name, files, signer)
            rows[name] = measure(storage, work / name, spec, args.rounds)
            shutil.rmtree(storage / "artifacts" / name, ignore_errors=True)
    print(
        "| bundle | MB | cold: copy+hash s | cold: checked load s | ratio | warm: hash s | warm: checked s | ratio "
        "| bytes read / size (warm) | signature check ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['bytes'] / 1e6:.0f} | {r['cold_baseline_s']:.3f} | {r['cold_verified_s']:.3f} "
            f"| {r['cold_ratio']:.2f}x | {r['warm_baseline_s']:.3f} | {r['warm_verified_s']:.3f} "
            f"| {r['warm_ratio']:.2f}x | {r['warm_read_ratio']:.3f} | {r['signature_only_ms']:.2f} |"
        )
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "verify.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
