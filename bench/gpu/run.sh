#!/usr/bin/env bash
# The H200 run, in two device calls, since one call carries at most 64 MiB with the checkout.
#
#   here, once:   .gpu/ort-gpu-sm90.tar.xz, onnxruntime-gpu cut to the card's kernels (bench/gpu/README.md)
#                 bash bench/gpu/pack.sh wheels                 -> .gpu-wheels/*.whl
#                 bash bench/gpu/pack.sh split                  (only if the pack and the checkout pass 64 MiB)
#   call 1:       bash bench/gpu/run.sh unpack          (carry .gpu)         -> ONNX Runtime GPU in /tmp/site
#   call 2:       bash bench/gpu/run.sh                 (carry .gpu-wheels)  -> $OUT/gpu-serve.json
#   rehearsal:    bash bench/gpu/run.sh --cpu-dry-run   (this machine: the same steps, CPU provider, tiny model)
#
# Call 2 installs the Modelyard wheels next to ONNX Runtime, exports a MiniLM-shaped model with the image's
# torch, and runs bench/gpu/gpu_serve.py: raw ORT batch-1 and batch-128 on CUDA, then `modelyard serve --role
# all --workers N` on SQLite with the model uploaded and promoted through the REST API, the fleet showing it
# on CUDAExecutionProvider, and batch-1 binary-tensor clients. Extra arguments go to gpu_serve.py
# (e.g. --workers 8 --clients 384). MODELYARD_CUDA_* variables pass through to the server.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
mode=cuda
case "${1:-}" in
  --cpu-dry-run) mode=cpu; shift ;;
  unpack) mode=unpack ;;
esac
# The device's python3 has torch, numpy, onnx and the CUDA libraries; a rehearsal here uses the project's venv.
default_python=python3
if [ "$mode" = cpu ] && [ -x .venv/bin/python ]; then default_python=.venv/bin/python; fi
PYTHON=${PYTHON:-$default_python}
EXPORT_PYTHON=${EXPORT_PYTHON:-$PYTHON}   # a python with torch and transformers (the image's python3)
site_given=${SITE+x}
SITE=${SITE:-/tmp/site}

# A pack split in two (`bench/gpu/pack.sh split`): call 1 keeps .gpu's part a in $PARTS, call 2 brings
# part b in .gpu-wheels, and the two are joined and unpacked there.
PARTS=${PARTS:-/tmp/ort-pack-parts}
unpack_pack() {  # the whole pack on stdin -> $SITE
  mkdir -p "$SITE"
  "$PYTHON" -c "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall(sys.argv[1])" "$SITE"
}
if [ "$mode" = unpack ]; then
  if [ -f .gpu/ort-gpu-sm90.tar.xz ]; then
    unpack_pack < .gpu/ort-gpu-sm90.tar.xz
    ls "$SITE"
  else
    mkdir -p "$PARTS" && cp .gpu/ort-gpu-sm90.tar.xz.part-* "$PARTS"/
    ls -l "$PARTS"
  fi
  exit 0
fi
if [ "$mode" = cuda ] && [ ! -d "$SITE/onnxruntime" ] && compgen -G ".gpu-wheels/*.part-*" >/dev/null; then
  cp .gpu-wheels/ort-gpu-sm90.tar.xz.part-* "$PARTS"/
  cat "$PARTS"/ort-gpu-sm90.tar.xz.part-* | unpack_pack
fi

OUT=${OUT:-$root/bench/results}
mkdir -p "$OUT"
work=$(mktemp -d /tmp/modelyard-gpu-run-XXXXXX)
trap 'rm -rf "$work"' EXIT

# The ONNX Runtime pack and the wheels live in $SITE on the device; a rehearsal uses this environment
# unless SITE is set (then it rehearses the device's layout too).
if [ "$mode" = cuda ] || [ -n "$site_given" ]; then
  [ -d "$SITE/onnxruntime" ] || { echo "no ONNX Runtime in $SITE: run 'bash bench/gpu/run.sh unpack' first (call 1)" >&2; exit 2; }
  if compgen -G ".gpu-wheels/*.whl" >/dev/null; then  # the part of a split pack is no wheel: *.whl only
    "$PYTHON" -m pip install -q --no-index --no-deps --upgrade --target "$SITE" .gpu-wheels/*.whl
  fi
  pythonpath="$SITE:$root"
  # onnxruntime.preload_dlls() looks for CUDA and cuDNN in an `nvidia` folder beside `onnxruntime`, where
  # `pip install 'onnxruntime-gpu[cuda,cudnn]'` puts them; the image has them in its own site-packages.
  if [ ! -e "$SITE/nvidia" ]; then
    nvidia=${NVIDIA_DIR:-$(PYTHONPATH='' "$PYTHON" -c "import nvidia; print(list(nvidia.__path__)[0])" 2>/dev/null || true)}
    if [ -n "$nvidia" ]; then ln -s "$nvidia" "$SITE/nvidia" && echo "linked $SITE/nvidia -> $nvidia"; fi
  fi
else
  pythonpath="$root"
fi

if [ "$mode" = cuda ]; then
  preset=minilm; bench_args=(--device cuda)
else
  preset=tiny
  bench_args=(--device cpu --workers 1,2 --clients 4,16 --duration 2 --warmup 1 --raw-seconds 1 --load-processes 2)
fi
# The export runs on the image's own packages: the wheels in $SITE are not on its path.
# EXPORT_ARGS go to the export: EXPORT_ARGS='--fixed 1,32' for a model of fixed shapes (CUDA graphs).
"$EXPORT_PYTHON" bench/gpu/export_model.py "$work/model.onnx" --preset "$preset" ${EXPORT_ARGS:-}
name=$([ "$mode" = cuda ] && echo gpu-serve || echo gpu-serve-cpu-dry-run)
PYTHONPATH="$pythonpath${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" bench/gpu/gpu_serve.py \
  --model "$work/model.onnx" --out "$OUT/$name.json" "${bench_args[@]}" "$@"
