#!/usr/bin/env bash
# The README's main job: set up the venv, then run the 2-process demo on CPU gloo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
exec .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 examples/collectives_demo.py "$@"
