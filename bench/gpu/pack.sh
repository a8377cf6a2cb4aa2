#!/usr/bin/env bash
# Packs what the H200 run brings to a GPU machine that cannot reach a package index, into the two
# git-ignored folders that its two calls carry (at most 64 MiB each, the checkout included).
#
#   bash bench/gpu/pack.sh wheels         .gpu-wheels/*.whl: bench/gpu/wheels.txt with every dependency, as
#                                         cp312 manylinux wheels, less what the GPU image already has (IMAGE_HAS)
#   bash bench/gpu/pack.sh split [PACK]   PACK (default .gpu/ort-gpu-sm90.tar.xz, an onnxruntime-gpu package tree
#                                         as tar.xz) cut in two: .gpu/PACK.part-a (call 1) and
#                                         .gpu-wheels/PACK.part-b (call 2), for when the whole pack and the
#                                         checkout together pass one call's limit; run.sh joins them there
#
# Both folders belong in .git/info/exclude (or .gitignore: /.gpu/ and /.gpu-wheels/ are there).
set -euo pipefail
cd "$(dirname "$0")/../.."
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# The image's own packages, which import as they are: the wheels would only repeat them (and numpy and onnx
# are large). protobuf and grpcio are not here: the generated gRPC modules need the versions wheels.txt names.
IMAGE_HAS=${IMAGE_HAS:-"numpy onnx ml_dtypes requests certifi charset_normalizer urllib3 pygments rich markdown_it_py mdurl"}
SPLIT_AT=${SPLIT_AT:-54000000}   # bytes in part a: with the checkout (about 7.5 MB) under one call's 64 MiB

case "${1:-}" in
  wheels)
    rm -rf .gpu-wheels/*.whl && mkdir -p .gpu-wheels
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
      -d .gpu-wheels $(grep -v '^#' bench/gpu/wheels.txt)
    for name in $IMAGE_HAS; do rm -f .gpu-wheels/"$name"-*.whl; done
    du -sh .gpu-wheels ;;
  split)
    pack=${2:-.gpu/ort-gpu-sm90.tar.xz}
    name=$(basename "$pack")
    tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
    split -b "$SPLIT_AT" -a 1 "$pack" "$tmp/p."
    [ -f "$tmp/p.b" ] && [ ! -f "$tmp/p.c" ] || { echo "split: $pack must make exactly two parts at SPLIT_AT=$SPLIT_AT" >&2; exit 2; }
    mkdir -p .gpu .gpu-wheels
    mv "$tmp/p.a" ".gpu/$name.part-a" && mv "$tmp/p.b" ".gpu-wheels/$name.part-b" && rm "$pack"
    ls -l ".gpu/$name.part-a" ".gpu-wheels/$name.part-b" ;;
  *) echo "usage: bench/gpu/pack.sh wheels | split [PACK]" >&2; exit 2 ;;
esac
