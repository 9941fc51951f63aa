#!/usr/bin/env bash
# XLA lane: torch_xla 2.9 on the XLA CPU device (PJRT_DEVICE=CPU), in its own venv.
# 1. create/reuse .venv-xla (cached by a stamp; pip's download cache is kept)
# 2. mypy (strict) of the XLA backend against torch_xla's own py.typed
# 3. tests/xla: XlaContext at world sizes 1, 2, 3 (XLA CPU device threads), spawn/Parallel
#    with backend="xla-tpu" (torch_xla.launch) and launcher detection
# 4. examples/xla_training.py on 2 XLA CPU replicas
# 5. benchmarks/bench_xla.py --smoke: every raw-vs-idist workload runs and agrees, and nothing
#    compiles after warm-up (no timing targets)
# 6. the property suite with the XlaWorld runner at world sizes 1, 2, 3 (IDIST_XLA_PROPERTIES=0 skips it)
# Set IDIST_SKIP_XLA=1 to skip the lane (it says so), as IDIST_SKIP_HOROVOD=1 does for Horovod's.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${IDIST_SKIP_XLA:-}" = 1 ]; then
  echo "xla lane: skipped (IDIST_SKIP_XLA=1)"
  exit 0
fi
bash scripts/xla/setup-venv.sh
PY=.venv-xla/bin/python
export PYTHONHASHSEED=0 PJRT_DEVICE=CPU

echo "-- mypy: idist's XLA modules against torch_xla's py.typed"
"$PY" -m mypy --strict --python-version 3.11 --follow-imports=silent \
  src/idist/_backends/xla

echo "-- pytest tests/xla"
"$PY" -m pytest -q -p no:cacheprovider tests/xla

echo "-- examples/xla_training.py (2 replicas)"
CPU_NUM_DEVICES=2 timeout 600 "$PY" examples/xla_training.py

echo "-- benchmarks/bench_xla.py --smoke (2 device threads; runs, agrees, compiles nothing after warm-up)"
timeout 300 "$PY" benchmarks/bench_xla.py --smoke

if [ "${IDIST_XLA_PROPERTIES:-1}" = "1" ]; then
  echo "-- property suite on XlaWorld@1,2,3"
  IDIST_PROPERTY_RUNNER="idist.testing._xla_world:XlaWorld@1,idist.testing._xla_world:XlaWorld@2,idist.testing._xla_world:XlaWorld@3" \
    "$PY" -m pytest -q -p no:cacheprovider --timeout 600 properties
else
  echo "-- property suite on XlaWorld: skipped (IDIST_XLA_PROPERTIES=0)"
fi
