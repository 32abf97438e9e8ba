#!/usr/bin/env bash
# The seeds' benchmark, routeburn (flex) beside rl4co 0.7.0's attention model, interleaved:
# ROUNDS rounds of 3-epoch runs of `configs/tiny_1.toml`, of the same config with the
# rollout baseline's end-of-epoch test on 128 instances (what rl4co evaluates: its
# `val_data_size`; tiny_1 evaluates 1000), and of rl4co with the same recipe. Prints each
# round's second epoch, start to next start (routeburn: `elapsed_seconds` of epoch 2 less
# epoch 1's, so checkpoint writes count; rl4co: its "epoch 2 ... in all"), the ratios,
# and their medians over the rounds. Run on a quiet machine from the repository root,
# after `cargo build --release` and the venv of rl4co_reference.py:
#
#   benches/reference/tiny_1_epochs.sh [ROUNDS] [THREADS]
set -euo pipefail
rounds=${1:-5}; threads=${2:-2}
py=${PYTHON:-venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sed 's/^baseline_eval_size = .*/baseline_eval_size = 128/' configs/tiny_1.toml >"$work/like_rl4co.toml"

# Epoch 2's seconds, start to next start, of a 3-epoch run of `$1`.
routeburn_epoch_2() {
    rm -rf "$work/run"
    if ! RAYON_NUM_THREADS=$threads target/release/routeburn train --config "$1" --epochs 3 \
        --run-dir "$work/run" >"$work/train.log" 2>&1; then
        echo "tiny_1_epochs.sh: routeburn train --config $1 failed:" >&2
        tail -5 "$work/train.log" >&2
        exit 1
    fi
    awk -F, 'NR == 2 { first = $12 } NR == 3 { printf "%.3f", $12 - first }' "$work/run/metrics.csv"
}

median() { sort -g | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.2f", m }'; }

echo "round | routeburn tiny_1 (s) | routeburn, test on 128 (s) | rl4co (s) | ratio | ratio, test on 128"
: >"$work/ratios"
for round in $(seq 1 "$rounds"); do
    ours=$(routeburn_epoch_2 configs/tiny_1.toml)
    like=$(routeburn_epoch_2 "$work/like_rl4co.toml")
    theirs=$("$py" benches/reference/rl4co_reference.py train --n 10 --batch 128 --batches 25 \
        --epochs 3 --threads "$threads" 2>&1 | sed -n 's/^rl4co epoch 2: \([0-9.]*\) s in all$/\1/p' || true)
    if [ -z "$theirs" ]; then
        echo "tiny_1_epochs.sh: rl4co printed no 'epoch 2 ... in all' (is $py the venv of rl4co_reference.py?)" >&2
        exit 1
    fi
    ratio=$(awk -v a="$ours" -v b="$theirs" 'BEGIN { printf "%.2f", a / b }')
    ratio_like=$(awk -v a="$like" -v b="$theirs" 'BEGIN { printf "%.2f", a / b }')
    echo "$round | $ours | $like | $theirs | $ratio | $ratio_like"
    echo "$ratio $ratio_like" >>"$work/ratios"
done
echo "median ratio over $rounds rounds: $(cut -d' ' -f1 "$work/ratios" | median)," \
    "with the test on 128: $(cut -d' ' -f2 "$work/ratios" | median)"
