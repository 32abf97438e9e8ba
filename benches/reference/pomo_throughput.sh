#!/usr/bin/env bash
# POMO training throughput, routeburn (flex) beside rl4co 0.7.0's POMO, in one run: the
# same n, batch, model (d = 128, 8 heads, 3 layers, instance norm), starts (one per
# customer) and threads. Run on a quiet machine from the repository root, after
# `cargo build --release` and the venv of rl4co_reference.py:
#
#   benches/reference/pomo_throughput.sh [N] [BATCH] [STEPS] [THREADS]
set -euo pipefail
n=${1:-20}; batch=${2:-64}; steps=${3:-20}; threads=${4:-2}
py=${PYTHON:-venv/bin/python}
config=$(mktemp --suffix=.toml)
trap 'rm -f "$config"' EXIT
printf '[problem]\nn = %s\n[model]\nkind = "attention"\nnormalization = "instance"\n[training]\nbatch_size = %s\nlr = 1e-4\nweight_decay = 1e-6\nseed = 1\n[reinforce]\nbaseline = "pomo"\n' \
    "$n" "$batch" >"$config"
echo "== routeburn flex, $threads threads: POMO n=$n, batch $batch x $n starts, $steps steps (first excluded)"
RAYON_NUM_THREADS=$threads target/release/routeburn compare-backends --backends flex \
    --config "$config" --steps $((steps + 1)) --agreement-instances 8 | grep -E '^\| (backend|flex)'
echo "== rl4co 0.7.0 POMO, torch.set_num_threads($threads)"
"$py" benches/reference/rl4co_reference.py pomo --n "$n" --batch "$batch" --batches "$steps" \
    --threads "$threads" 2>&1 | grep '^rl4co pomo'
