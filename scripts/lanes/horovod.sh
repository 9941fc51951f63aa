#!/usr/bin/env bash
# The Horovod lane (run by scripts/test.sh after the main suite): the Horovod backend
# against a real Horovod 0.28.1 build on 2 CPU ranks (horovodrun --gloo, loopback).
#   1. builds the wheel once (cached under ~/.cache/idist/wheels) and .venv-horovod
#   2. tests/horovod: the collective semantics row by row, bad input, rank failure, lifecycle, auto_* equivalence,
#      spawn/Parallel(backend="horovod") through horovod.run
#   3. the property suite on 2 Horovod ranks (IDIST_PROPERTY_RUNNER=hvd_world:HorovodWorld@2)
#   4. mypy.stubtest of stubs/horovod against the installed package (skipped while neither changed)
#   5. examples/horovod_training.py through `idist run --backend horovod -n 2`
#   6. benchmarks/bench_horovod.py --smoke: every raw-vs-idist workload runs and agrees (no timing targets)
# Set IDIST_SKIP_HOROVOD=1 to skip the lane (it says so). Exit status non-zero on failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${IDIST_SKIP_HOROVOD:-}" = 1 ]; then
  echo "horovod lane: skipped (IDIST_SKIP_HOROVOD=1)"
  exit 0
fi
PY=$(bash scripts/horovod/setup-venv.sh 2> >(grep -v "^WARNING: Location" >&2))
BIN="$PWD/$(dirname "$PY")"
export PYTHONHASHSEED=0
# horovodrun and idist from the lane's venv; tests/horovod holds the runner and rank functions, tests the shared cases
export PATH="$BIN:$PATH"
export PYTHONPATH="$PWD/tests/horovod:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"

echo "-- horovod: tests/horovod (2 ranks)"
"$PY" -m pytest -q -p no:cacheprovider tests/horovod

echo "-- horovod: property suite on 2 Horovod ranks (all of it)"
IDIST_PROPERTY_RUNNER="hvd_world:HorovodWorld@2" "$PY" -m pytest -q -p no:cacheprovider properties

echo "-- horovod: stubtest stubs/horovod"
key=$( (find stubs/horovod scripts/horovod/stubtest-allowlist.txt -type f | sort | xargs cat; "$PY" -m pip show horovod mypy 2>/dev/null | grep -E '^(Name|Version)') | sha1sum | cut -c1-12)
stamp="$BIN/../.idist-stubtest-$key"
if [ -f "$stamp" ]; then
  echo "stubs and package unchanged since the last passing stubtest"
else
  MYPYPATH=stubs "$PY" -m mypy.stubtest --ignore-missing-stub --allowlist scripts/horovod/stubtest-allowlist.txt \
    horovod  # the package and every stubbed submodule (horovod.torch, horovod.common.*)
  rm -f "$BIN"/../.idist-stubtest-*
  touch "$stamp"
fi

echo "-- horovod: examples/horovod_training.py on 2 ranks"
out=$(cd "${TMPDIR:-/tmp}" && timeout 300 "$BIN/idist" run --backend horovod -n 2 "$OLDPWD/examples/horovod_training.py" --epochs 3 2>&1) || {
  echo "$out" | tail -n 40
  echo "horovod lane: the training example failed" >&2
  exit 1
}
echo "$out" | grep -E "OK: 2 rank" || { echo "$out" | tail -n 40; echo "horovod lane: no OK line" >&2; exit 1; }

echo "-- horovod: benchmarks/bench_horovod.py --smoke (2 ranks; runs and agrees, no timing targets)"
timeout 300 "$PY" benchmarks/bench_horovod.py --smoke
