#!/usr/bin/env bash
# The README's main job: set up the venv, then train on scikit-learn's bundled digits with
# 2 CPU gloo processes (examples/train_digits.py): 3 epochs with an atomic checkpoint per
# epoch, then a second run that resumes from the checkpoint to epoch 5.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
ckpt_dir=$(mktemp -d)
trap 'rm -rf "$ckpt_dir"' EXIT
# torchrun sets 1 anyway, with a banner that says so on every run unless it is set already
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
run=(.venv/bin/python -m torch.distributed.run --standalone --nproc_per_node 2
     examples/train_digits.py --checkpoint "$ckpt_dir/digits.pt")
"${run[@]}" --epochs 3 "$@"
echo "== resuming from $ckpt_dir/digits.pt"
"${run[@]}" --epochs 5 --resume "$@"
