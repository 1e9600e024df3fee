#!/usr/bin/env bash
# Build the pdserve-kernels wheel (launchers, ops, SGLang plugin and its entry point) with the fatbins and
# their metadata inside, from a copy of kernels/python so the source tree stays clean.
#   bash kernels/python/build_wheel.sh [BUILD_DIR (default kernels/build)] [OUT_DIR (default dist/)]
# Needs a Python with pip and setuptools ($PYTHON, default python3); no network (--no-build-isolation).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
out=${2:-dist}
python=${PYTHON:-python3}
for k in dsa_indexer sparse_mla_decode; do
  for f in "$build/$k.fatbin" "$build/$k.json"; do
    [[ -f $f ]] || { echo "build_wheel.sh: $f missing: run bash kernels/build.sh first" >&2; exit 1; }
  done
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$here/pyproject.toml" "$here/pdserve_kernels" "$work/"
find "$work" -name __pycache__ -prune -exec rm -rf {} +
cp "$build"/dsa_indexer.{fatbin,json} "$build"/sparse_mla_decode.{fatbin,json} "$work/pdserve_kernels/"
mkdir -p "$out"
# SOURCE_DATE_EPOCH: the same sources give the same wheel bytes.
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-315532800} "$python" -m pip wheel --no-deps --no-build-isolation -q \
  -w "$out" "$work"
