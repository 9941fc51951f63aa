#!/usr/bin/env bash
# Create (or reuse) .venv-xla: torch 2.9.0 + torch_xla 2.9.0 from PyPI (torch_xla pins
# torch exactly; PyPI's torch 2.9.0 is a CUDA build, ~7 GB, that runs on the CPU) and the
# few test tools the XLA lane needs, in a venv shared by every clone and built once
# (scripts/layered_venv.py), with this clone's idist installed editable on top.
# Idempotent: a second run does nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
"${PYTHON:-python3.11}" scripts/layered_venv.py "${IDIST_XLA_VENV:-.venv-xla}" xla \
  --pip "torch==2.9.0 torch_xla==2.9.0" \
  --pip "attrs>=23.1 numpy pytest>=8 pytest-timeout>=2.3 hypothesis>=6.100 mypy>=1.10 pytorch-ignite==0.5.5" \
  >/dev/null
