#!/usr/bin/env bash
# The whole test suite: lint, types, tests, properties, the docs, the package check, then
# the backend lanes. This is the README's test command; .ci/run calls exactly this.
#   bash scripts/test.sh                  everything (what CI runs)
#   bash scripts/test.sh --quick          ruff, mypy and the tests not marked slow (< 1 min):
#                                         no system launchers, docs build, package check or lanes
#   bash scripts/test.sh [--quick] ARGS   ARGS go to pytest (paths, -k, -x, ...)
# pytest runs on IDIST_TEST_WORKERS xdist workers (default 2; 0 runs it in one process); the tests
# marked `timed` (they bound a time in seconds) run one after another on one worker.
# The lanes run side by side when memory allows (IDIST_LANES_SERIAL=1 runs them one by one).
# Each stage prints its wall time, and a summary of them all comes last, also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
args=()
for arg in "$@"; do
  if [ "$arg" = --quick ]; then quick=1; else args+=("$arg"); fi
done
PY=.venv/bin/python
export PYTHONHASHSEED=0
# torch's store looks up the name of every peer it connects to or accepts (getnameinfo, for its
# logs); for a loopback peer seen as ::ffff:127.0.0.1 that is a DNS query. A resolver that drops
# queries past a burst (this machine's drops those past about 50 a second) stalls the connection
# for glibc's timeout before its retry: 1 s instead of the default 5 (a second attempt stays).
export RES_OPTIONS="${RES_OPTIONS:+$RES_OPTIONS }timeout:1"

times=()
stage_name=""
stage_start=$SECONDS
run_start=$SECONDS
end_stage() {
  [ -n "$stage_name" ] || return 0
  local took=$((SECONDS - stage_start))
  echo "-- $stage_name: ${took}s"
  times+=("$(printf '%5ss  %s' "$took" "$stage_name")")
  stage_name=""
}
stage() {
  end_stage
  stage_name=$1
  stage_start=$SECONDS
  echo "== $1"
}
summary() {
  local rc=$?
  end_stage
  [ -z "${package_tmp:-}" ] || rm -rf "$package_tmp"
  echo "== stage times (wall clock)"
  printf '%s\n' "${times[@]}"
  printf '%5ss  total (exit status %s)\n' "$((SECONDS - run_start))" "$rc"
}
trap summary EXIT
# The sdist, wheel and fresh venv of scripts/package-build.sh, built once in this run (by
# tests/test_package_types.py, or else by the package stage) and reused by the other; set
# IDIST_PACKAGE_DIR yourself to keep them across runs (rebuilt whenever the sources change).
package_tmp=""
if [ -z "${IDIST_PACKAGE_DIR:-}" ]; then
  package_tmp=$(mktemp -d "${TMPDIR:-/tmp}/idist-package-build.XXXXXX")
  export IDIST_PACKAGE_DIR=$package_tmp
fi

stage "set-up (scripts/setup-venv.sh)"
bash scripts/setup-venv.sh
if [ "$quick" = 0 ]; then
  stage "set-up (scripts/setup-system.sh)"
  bash scripts/setup-system.sh  # mpirun and slurm for the launcher tests (skip if impossible)
fi

stage "ruff"
"$PY" -m ruff check .
"$PY" -m ruff format --check .
stage "mypy (strict)"
"$PY" -m mypy
stage "pyright (strict, tests/typing)"
"$PY" -m pyright
stage "architecture (scripts/arch_report.py)"
if [ "$quick" = 1 ]; then "$PY" scripts/arch_report.py --no-duplicates; else "$PY" scripts/arch_report.py; fi
if [ "$quick" = 0 ]; then
  stage "docs (mkdocs build --strict)"
  # into a temporary folder, so the checkout stays clean; a broken link or reference fails
  site=$(mktemp -d)
  set +e
  NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict --site-dir "$site"
  rc=$?
  set -e
  rm -rf "$site"
  [ "$rc" -eq 0 ] || exit "$rc"
fi

workers=${IDIST_TEST_WORKERS:-2}
if [ "$workers" = 0 ]; then xdist=(-p no:xdist); else xdist=(-n "$workers" --dist loadgroup); fi
if [ "$quick" = 1 ]; then
  stage "pytest (tests + properties, not slow; $workers workers)"
  args=(-m "not slow" ${args[@]+"${args[@]}"})
else
  stage "pytest (tests + properties; $workers workers)"
fi
set +e
"$PY" -m pytest -q "${xdist[@]}" ${args[@]+"${args[@]}"}
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
[ "$rc" -eq 0 ] || exit "$rc"
if [ "$quick" = 1 ]; then
  end_stage
  echo "== quick tier green (the full run adds the slow tests, the package check and the lanes)"
  exit 0
fi

stage "package (scripts/check-package.sh)"
bash scripts/check-package.sh

# The lanes: each has its own venv and processes, so they run side by side when there is
# room for both (the XLA property suite and 2 Horovod ranks take a few GiB each). Each runs
# with a temporary folder of its own, removed after it: torch before 2.10 leaves a folder in
# it for every process that imports torch.distributed.nn and ends with os._exit (as
# multiprocessing's children do), about 20 per XLA lane.
run_lane() {
  local tmp rc
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/idist-lane-$(basename "$1" .sh).XXXXXX")
  set +e
  TMPDIR=$tmp bash "$1"
  rc=$?
  set -e
  rm -rf "$tmp"
  return "$rc"
}
lanes=()
for lane in scripts/lanes/*.sh; do [ -e "$lane" ] && lanes+=("$lane"); done
avail_gib=$(awk '/^MemAvailable:/ {print int($2 / 1048576)}' /proc/meminfo)
if [ "${IDIST_LANES_SERIAL:-0}" = 1 ] || [ "${#lanes[@]}" -lt 2 ] || [ "${avail_gib:-0}" -lt 12 ]; then
  for lane in ${lanes[@]+"${lanes[@]}"}; do
    stage "lane $(basename "$lane" .sh)"
    run_lane "$lane"
  done
else
  stage "lanes side by side (${lanes[*]}; ${avail_gib} GiB available)"
  pids=()
  for lane in "${lanes[@]}"; do
    name=$(basename "$lane" .sh)
    (
      start=$SECONDS
      set +e
      run_lane "$lane" 2>&1 | sed -u "s/^/[$name] /"
      rc=${PIPESTATUS[0]}
      echo "[$name] lane finished: exit status $rc, $((SECONDS - start))s"
      exit "$rc"
    ) &
    pids+=("$!")
  done
  failed=0
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { echo "lane $(basename "${lanes[$i]}" .sh) failed" >&2; failed=1; }
  done
  [ "$failed" = 0 ] || exit 1
fi
end_stage
echo "== all green"
