#!/usr/bin/env bash
# POMO training throughput, routeburn (flex) beside rl4co 0.7.0's POMO, in one run: the
# same n, batch, model (d = 128, 8 heads, 3 layers, instance norm), starts (one per
# customer) and threads. Run on a quiet machine from the repository root, after
# `cargo build --release` (or with ROUTEBURN set to the binary) and the venv of
# rl4co_reference.py. Each side's peak resident memory is printed after its line.
#
#   benches/reference/pomo_throughput.sh [N] [BATCH] [STEPS] [THREADS] [SHARDS]
#
# SHARDS is routeburn's `training.shards` (default: THREADS, one shard a thread, as the
# recipes train); rl4co has no such setting. routeburn's validation (`compare-backends`
# cuts it to 64 generated instances) is not in its s/step.
set -euo pipefail
n=${1:-20}; batch=${2:-64}; steps=${3:-20}; threads=${4:-2}; shards=${5:-$threads}
py=${PYTHON:-venv/bin/python}
bin=${ROUTEBURN:-target/release/routeburn}
config=$(mktemp --suffix=.toml); rss=$(mktemp)
trap 'rm -f "$config" "$rss"' EXIT
peak() { echo "peak RSS $(( $(cat "$rss") / 1024 )) MB"; }
printf '[problem]\nn = %s\n[model]\nkind = "attention"\nnormalization = "instance"\n[training]\nbatch_size = %s\nlr = 1e-4\nweight_decay = 1e-6\nseed = 1\nshards = %s\n[reinforce]\nbaseline = "pomo"\n' \
    "$n" "$batch" "$shards" >"$config"
echo "== routeburn flex, $threads threads, $shards shards: POMO n=$n, batch $batch x $n starts, $steps steps (first excluded)"
RAYON_NUM_THREADS=$threads /usr/bin/time -f %M -o "$rss" "$bin" compare-backends --backends flex \
    --config "$config" --steps $((steps + 1)) --agreement-instances 8 | grep -E '^\| (backend|flex)'
peak
echo "== rl4co 0.7.0 POMO, torch.set_num_threads($threads)"
/usr/bin/time -f %M -o "$rss" "$py" benches/reference/rl4co_reference.py pomo --n "$n" --batch "$batch" --batches "$steps" \
    --threads "$threads" 2>&1 | grep '^rl4co pomo'
peak
