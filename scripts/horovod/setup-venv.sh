#!/usr/bin/env bash
# Create (or reuse) .venv-horovod: torch 2.13.0 CPU, the cached horovod wheel
# (scripts/horovod/build-wheel.sh builds it once) and the lane's test tools, in a venv
# shared by every clone and built once (scripts/layered_venv.py), with this clone's idist
# installed editable on top. Idempotent and silent when nothing changed. Prints the venv's
# python on stdout.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${IDIST_HOROVOD_VENV:-.venv-horovod}
whl=$(IDIST_HOROVOD_VENV="$VENV" bash scripts/horovod/build-wheel.sh)
"${PYTHON:-python3.11}" scripts/layered_venv.py "$VENV" horovod \
  --pip "torch==${TORCH_VERSION:-2.13.0}" \
  --pip "$whl numpy pytest pytest-timeout hypothesis mypy attrs" \
  --check "import horovod.torch as hvd; assert hvd.gloo_built(), 'horovod without gloo'"
