#!/usr/bin/env bash
# Create (or reuse) .venv-horovod: torch 2.13.0 CPU, the cached horovod wheel
# (scripts/horovod/build-wheel.sh builds it once), idist editable, and the lane's test
# tools. Idempotent and silent when nothing changed (a stamp keyed by the wheel and
# pyproject.toml). Prints the venv's python on stdout.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${IDIST_HOROVOD_VENV:-.venv-horovod}
whl=$(IDIST_HOROVOD_VENV="$VENV" bash scripts/horovod/build-wheel.sh)
key=$( (echo "$whl"; cat pyproject.toml "$0") | sha1sum | cut -c1-12)
stamp="$VENV/.idist-horovod-$key"
if [ ! -f "$stamp" ]; then
  # a cached wheel skips build-wheel.sh's venv set-up: a fresh checkout has no venv yet
  if [ ! -x "$VENV/bin/python" ]; then
    echo "setup-venv: creating $VENV" >&2
    "${PYTHON:-python3.11}" -m venv "$VENV"
  fi
  if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '${TORCH_VERSION:-2.13.0}')" 2>/dev/null; then
    echo "setup-venv: installing torch==${TORCH_VERSION:-2.13.0} into $VENV" >&2
    "$VENV/bin/python" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
  fi
  echo "setup-venv: installing $(basename "$whl") and the lane's tools into $VENV" >&2
  "$VENV/bin/python" -m pip install -q "$whl" numpy pytest pytest-timeout hypothesis mypy attrs
  "$VENV/bin/python" -m pip install -q --no-deps -e .
  "$VENV/bin/python" -c "import horovod.torch as hvd; assert hvd.gloo_built(), 'horovod without gloo'"
  rm -f "$VENV"/.idist-horovod-*
  touch "$stamp"
fi
echo "$VENV/bin/python"
