#!/usr/bin/env bash
# The whole test suite: lint, types, tests, properties, then the backend lanes.
# This is the README's test command; .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
bash scripts/setup-system.sh  # mpirun and slurm for the launcher tests (skip if impossible)
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
"$PY" scripts/arch_report.py
echo "== pytest (tests + properties)"
set +e
"$PY" -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
[ "$rc" -eq 0 ] || exit "$rc"

for lane in scripts/lanes/*.sh; do
  [ -e "$lane" ] || continue
  echo "== lane $(basename "$lane" .sh)"
  bash "$lane"
done
echo "== all green"
