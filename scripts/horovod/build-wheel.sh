#!/usr/bin/env bash
# Build the horovod wheel ONCE from its PyPI sdist against the pinned torch CPU build and
# cache it outside the repository, keyed by (horovod, torch, python) versions. Prints the
# wheel's path on stdout; everything else goes to stderr. A cached wheel costs nothing.
#
# Why each step (see issue 6): horovod 0.28.1 has no wheel on PyPI; its bundled gloo
# CMakeLists needs a cmake < 4 (Debian's 3.25, not the PyPI cmake 4 wheel); torch 2.x
# headers need C++17 where horovod asks for 14; the build must see the venv's torch, so
# --no-build-isolation.
set -euo pipefail
cd "$(dirname "$0")/../.."
HVD_VERSION=${HOROVOD_VERSION:-0.28.1}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
PY=${PYTHON:-python3.11}
VENV=${IDIST_HOROVOD_VENV:-.venv-horovod}
CACHE_ROOT=${IDIST_WHEEL_CACHE:-$HOME/.cache/idist/wheels}
pytag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
CACHE="$CACHE_ROOT/horovod-$HVD_VERSION-torch$TORCH_VERSION-$pytag"

log() { echo "build-wheel: $*" >&2; }

cached=$(ls "$CACHE"/horovod-"$HVD_VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -n "$cached" ]; then
  echo "$cached"
  exit 0
fi

# The build venv is the lane's venv: it must already hold the torch the wheel links against.
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  log "installing torch==$TORCH_VERSION into $VENV"
  "$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION" numpy
fi
"$VENV/bin/python" -m pip install -q setuptools wheel packaging

cmake_bin=$(command -v cmake || true)
if [ -z "$cmake_bin" ] || ! cmake --version | head -n1 | grep -Eq 'version 3\.'; then
  log "need cmake 3.x on PATH (Debian: apt-get install -y cmake); cmake 4 rejects horovod's bundled gloo"
  exit 2
fi
command -v g++ >/dev/null || { log "need g++ (Debian: apt-get install -y build-essential)"; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/idist-hvd-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
log "downloading horovod==$HVD_VERSION sdist"
"$VENV/bin/python" -m pip download -q --no-deps --no-binary :all: "horovod==$HVD_VERSION" -d "$work/sdist"
tar -xzf "$work"/sdist/horovod-"$HVD_VERSION".tar.gz -C "$work"
src="$work/horovod-$HVD_VERSION"
for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
  sed -i -E 's/set\(CMAKE_CXX_STANDARD 1[14]\)/set(CMAKE_CXX_STANDARD 17)/' "$f"
  grep -q 'CMAKE_CXX_STANDARD 17' "$f" || { log "C++17 patch did not apply to $f"; exit 3; }
done

log "building the wheel (several minutes on 2 cores; log: $work/build.log)"
mkdir -p "$work/out"
if ! HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo \
  MAKEFLAGS="-j${IDIST_BUILD_JOBS:-$(nproc)}" \
  "$VENV/bin/python" -m pip wheel -v --no-deps --no-build-isolation "$src" -w "$work/out" >"$work/build.log" 2>&1; then
  tail -n 60 "$work/build.log" >&2
  log "wheel build failed"
  exit 1
fi
mkdir -p "$CACHE"
whl=$(ls "$work"/out/horovod-*.whl | head -n1)
# Copy then rename so a concurrent reader never sees half a wheel.
cp "$whl" "$CACHE/.partial"
mv "$CACHE/.partial" "$CACHE/$(basename "$whl")"
log "cached $CACHE/$(basename "$whl")"
echo "$CACHE/$(basename "$whl")"
