#!/usr/bin/env bash
# The package as a user gets it, built once per run and shared: tests/test_package_types.py and
# scripts/check-package.sh both need the same sdist, wheel and fresh venv.
#   bash scripts/package-build.sh DIR
# leaves in DIR: dist/ (the sdist, and the wheel built from it by an isolated `python -m build`),
# build.log, and venv/ (made from $PYTHON, torch==2.13.0 first, the CPU build from local disk,
# then the wheel, not editable). DIR/key names the content it was built from (every file git
# tracks or would track, and the python), so a second call with unchanged sources only reuses
# it, and a call after any edit builds again. Outside a git checkout it always builds.
# scripts/test.sh gives pytest and the package stage one temporary DIR, removed at the end.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
cd "$(dirname "$0")/.."
PY=${IDIST_VENV:-.venv}/bin/python   # has build (the dev extra)
BASE_PY=${PYTHON:-python3.11}         # what the fresh venv is made from (as setup-venv.sh)
dir=$1
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

key() {
  git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "no-git-$$-$RANDOM"; return; }
  {
    "$BASE_PY" --version
    git ls-files -z -c -o --exclude-standard | sort -z | xargs -0 -r sha1sum 2>/dev/null || true
  } | sha1sum | cut -c1-16
}

exec 9>"$dir/.lock"
flock 9  # pytest's workers and the package stage may ask at once: one builds, the others wait
want=$(key)
if [ -f "$dir/key" ] && [ "$(cat "$dir/key")" = "$want" ] && [ -x "$dir/venv/bin/python" ]; then
  echo "package-build: reusing $dir (content $want)"
  exit 0
fi
rm -rf "$dir/dist" "$dir/venv" "$dir/key" "$dir/build.log"
if ! "$PY" -m build --outdir "$dir/dist" . >"$dir/build.log" 2>&1; then
  tail -n 40 "$dir/build.log"
  echo "package-build: python -m build failed" >&2
  exit 1
fi
wheel=$(echo "$dir"/dist/idist-*-py3-none-any.whl)
[ -f "$wheel" ] || { ls -l "$dir/dist" >&2; echo "package-build: no wheel" >&2; exit 1; }
"$BASE_PY" -m venv "$dir/venv"
# --no-compile: byte-compiling torch's ~20k modules is most of the install's CPU time
"$dir/venv/bin/python" -m pip install -q --no-compile "torch==2.13.0"
"$dir/venv/bin/python" -m pip install -q --no-compile "$wheel"
echo "$want" >"$dir/key"
echo "package-build: built $dir (content $want)"
