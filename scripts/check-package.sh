#!/usr/bin/env bash
# The package as a user gets it (run by scripts/test.sh after pytest):
#   1. `python -m build`: an sdist, and a wheel built from that sdist (isolated, so
#      build-system.requires is what is tested); setuptools must not warn about the metadata
#   2. `twine check --strict` on both, and the wheel holds py.typed, the Horovod stubs and the LICENSE
#   3. a fresh venv in a temporary folder: torch==2.13.0 first (the CPU build from local
#      disk, never a CUDA one), then the wheel itself (not editable)
#   (1 and 3 are scripts/package-build.sh, into $IDIST_PACKAGE_DIR when scripts/test.sh gives
#   one: pytest's tests/test_package_types.py has built them already in this run, for the
#   same content, so they are reused instead of built twice)
#   4. from a folder outside the checkout, so the installed copy is what is imported:
#      `idist info`, and `idist run -n 2` of a script that checks an all_reduce on 2 ranks
# The temporary folder goes on exit, also on failure or Ctrl-C. pip's cache is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${IDIST_VENV:-.venv}/bin/python   # has build and twine (the dev extra)
work=$(mktemp -d "${TMPDIR:-/tmp}/idist-package.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
step() { echo "-- package: $* (${SECONDS}s)"; }

step "build sdist + wheel, and a fresh venv with torch==2.13.0, then the wheel"
# built once per run: scripts/test.sh shares IDIST_PACKAGE_DIR with tests/test_package_types.py
pkg=${IDIST_PACKAGE_DIR:-$work/package}
bash scripts/package-build.sh "$pkg"
if grep -n "SetuptoolsDeprecationWarning" "$pkg/build.log"; then
  echo "check-package: setuptools warns about the package metadata (above)" >&2
  exit 1
fi
sdist=$(echo "$pkg"/dist/idist-*.tar.gz)
wheel=$(echo "$pkg"/dist/idist-*-py3-none-any.whl)
[ -f "$sdist" ] && [ -f "$wheel" ] || { ls -l "$pkg/dist" >&2; echo "check-package: no sdist or wheel" >&2; exit 1; }
echo "$(basename "$sdist") $(basename "$wheel")"

step "twine check --strict"
"$PY" -m twine check --strict "$sdist" "$wheel"
"$PY" - "$wheel" "$sdist" <<'EOF'
import sys
import tarfile
import zipfile

wheel, sdist = sys.argv[1:]
names = set(zipfile.ZipFile(wheel).namelist())
meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
dist_info = meta.rsplit("/", 1)[0]
need = {"idist/py.typed", "idist/__main__.py", f"{dist_info}/licenses/LICENSE", f"{dist_info}/entry_points.txt"}
need |= {"horovod-stubs/__init__.pyi", "horovod-stubs/torch/__init__.pyi"}  # the Horovod stubs (PEP 561)
missing = need - names
assert not missing, f"wheel lacks {sorted(missing)}"
stray = sorted(n for n in names if not n.startswith(("idist/", "horovod-stubs/", dist_info + "/")))
assert not stray, f"the wheel holds more than the idist and horovod-stubs packages: {stray[:5]}"
text = zipfile.ZipFile(wheel).read(meta).decode()
assert "License-Expression: BSD-3-Clause" in text, "no License-Expression in the wheel's METADATA"
members = {m.split("/", 1)[1] for m in tarfile.open(sdist).getnames() if "/" in m}
missing = {
    "LICENSE", "README.md", "CHANGELOG.md", "CONTRIBUTING.md", "src/idist/py.typed",
    "tests/conftest.py", "properties/conftest.py", "examples/train_digits.py",
} - members
assert not missing, f"sdist lacks {sorted(missing)}"
print(f"wheel: {len(names)} files, py.typed and LICENSE present; sdist: {len(members)} entries")
EOF

step "idist info, idist run -n 2 (from $work, not the checkout)"
cat >"$work/smoke.py" <<'EOF'
import sys

import torch

import idist

assert idist.__file__.startswith(sys.prefix), f"idist imported from {idist.__file__}, not the venv"
ctx = idist.initialize()
try:
    assert ctx.world_size == 2, ctx.world_size
    t = ctx.all_reduce(torch.tensor([float(ctx.rank + 1), 10.0]))
    assert t.tolist() == [3.0, 20.0], t
    assert ctx.all_gather(f"r{ctx.rank}") == ["r0", "r1"]
    print(f"smoke ok: {type(ctx).__name__} rank {ctx.rank}/{ctx.world_size} from {idist.__file__}")
finally:
    idist.finalize()
EOF
cd "$work"
unset PYTHONPATH
"$pkg/venv/bin/idist" info
out=$(timeout 300 "$pkg/venv/bin/idist" run -n 2 smoke.py 2>&1) || {
  echo "$out" | tail -n 40
  echo "check-package: the 2-rank smoke test failed" >&2
  exit 1
}
echo "$out" | grep "smoke ok"
[ "$(echo "$out" | grep -c "smoke ok: NativeContext rank ")" -eq 2 ] || {
  echo "$out" | tail -n 40
  echo "check-package: expected a 'smoke ok' line from each of 2 ranks" >&2
  exit 1
}
case "$out" in *"$ROOT/src"*) echo "check-package: the checkout's src/ was imported" >&2; exit 1 ;; esac
echo "check-package: ok (${SECONDS}s)"
