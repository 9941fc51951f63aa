#!/usr/bin/env bash
# The README's main job: set up the venv, then train on scikit-learn's bundled digits with
# 2 CPU gloo processes (examples/train_digits.py): 3 epochs with save_checkpoint after each,
# then a second run on 3 processes that resumes from that checkpoint to epoch 5 (a checkpoint
# does not depend on the number of processes that wrote it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
ckpt_dir=$(mktemp -d)
trap 'rm -rf "$ckpt_dir"' EXIT
# torchrun sets 1 anyway, with a banner that says so on every run unless it is set already
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
run=(.venv/bin/python -m torch.distributed.run --standalone)
"${run[@]}" --nproc_per_node 2 examples/train_digits.py --checkpoint "$ckpt_dir/digits" --epochs 3 "$@"
echo "== resuming from $ckpt_dir/digits on 3 processes"
"${run[@]}" --nproc_per_node 3 examples/train_digits.py --checkpoint "$ckpt_dir/digits" --epochs 5 --resume "$@"
