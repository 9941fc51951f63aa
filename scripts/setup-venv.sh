#!/usr/bin/env bash
# Create (or reuse) the project's main virtual environment in .venv and install idist
# with its dev tools. torch is pinned to the CPU build first, so that nothing pulls a
# multi-GB CUDA build. Idempotent: a second run only checks what is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
VENV=${IDIST_VENV:-.venv}
stamp="$VENV/.idist-setup-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
if [ ! -f "$stamp" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "torch==2.13.0"
  "$VENV/bin/python" -m pip install -q -e ".[dev]"
  rm -f "$VENV"/.idist-setup-*
  touch "$stamp"
fi
