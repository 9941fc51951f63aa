#!/usr/bin/env bash
# Create (or reuse) .venv-xla: torch 2.9.0 + torch_xla 2.9.0 from PyPI (torch_xla pins
# torch exactly; PyPI's torch 2.9.0 is a CUDA build, ~7 GB, that runs on the CPU), idist
# installed editable without its dependencies, and the few test tools the XLA lane needs.
# Idempotent: a stamp keyed on this script's content skips the install when nothing
# changed. pip's download cache is kept, so recreating the venv does not re-download.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3.11}
VENV=${IDIST_XLA_VENV:-.venv-xla}
stamp="$VENV/.idist-xla-setup-$(sha1sum scripts/xla/setup-venv.sh | cut -c1-12)"
if [ -f "$stamp" ]; then
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.9.0" "torch_xla==2.9.0"
"$VENV/bin/python" -m pip install -q "attrs>=23.1" numpy "pytest>=8" "pytest-timeout>=2.3" \
  "hypothesis>=6.100" "mypy>=1.10" "pytorch-ignite==0.5.5"
"$VENV/bin/python" -m pip install -q --no-deps -e .
rm -f "$VENV"/.idist-xla-setup-*
touch "$stamp"
