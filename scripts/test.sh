#!/usr/bin/env bash
# The whole test suite: lint, types, tests, properties, the docs, the package check, then
# the backend lanes. This is the README's test command; .ci/run calls exactly this.
#   bash scripts/test.sh                  everything (what CI runs)
#   bash scripts/test.sh --quick          ruff, mypy and the tests not marked slow (< 2 min):
#                                         no system launchers, docs build, package check or lanes
#   bash scripts/test.sh [--quick] ARGS   ARGS go to pytest (paths, -k, -x, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
args=()
for arg in "$@"; do
  if [ "$arg" = --quick ]; then quick=1; else args+=("$arg"); fi
done
bash scripts/setup-venv.sh
if [ "$quick" = 0 ]; then
  bash scripts/setup-system.sh  # mpirun and slurm for the launcher tests (skip if impossible)
fi
PY=.venv/bin/python
export PYTHONHASHSEED=0

echo "== ruff"
"$PY" -m ruff check .
"$PY" -m ruff format --check .
echo "== mypy (strict)"
"$PY" -m mypy
echo "== pyright (strict, tests/typing)"
"$PY" -m pyright
echo "== architecture (scripts/arch_report.py)"
if [ "$quick" = 1 ]; then "$PY" scripts/arch_report.py --no-duplicates; else "$PY" scripts/arch_report.py; fi
if [ "$quick" = 0 ]; then
  echo "== docs (mkdocs build --strict)"
  # into a temporary folder, so the checkout stays clean; a broken link or reference fails
  site=$(mktemp -d)
  set +e
  NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict --site-dir "$site"
  rc=$?
  set -e
  rm -rf "$site"
  [ "$rc" -eq 0 ] || exit "$rc"
fi
if [ "$quick" = 1 ]; then
  echo "== pytest (tests + properties, not slow)"
  args=(-m "not slow" ${args[@]+"${args[@]}"})
else
  echo "== pytest (tests + properties)"
fi
set +e
"$PY" -m pytest -q ${args[@]+"${args[@]}"}
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
[ "$rc" -eq 0 ] || exit "$rc"
if [ "$quick" = 1 ]; then
  echo "== quick tier green (the full run adds the slow tests, the package check and the lanes)"
  exit 0
fi

echo "== package"
bash scripts/check-package.sh

for lane in scripts/lanes/*.sh; do
  [ -e "$lane" ] || continue
  echo "== lane $(basename "$lane" .sh)"
  bash "$lane"
done
echo "== all green"
