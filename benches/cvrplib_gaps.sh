#!/usr/bin/env bash
# Gaps of a trained model to the optimal costs of the classical CVRPLIB sets in
# data/cvrplib (A, B, E, P), per set and strategy, as a markdown table.
#
#   benches/cvrplib_gaps.sh RUN_DIR [STRATEGY...]      (default: greedy multistart+aug8)
#
# Uses target/release/routeburn (cargo build --release first). Instances the model cannot
# take (E-n13-k4 has explicit distances and no coordinates) are reported and left out.
set -euo pipefail
cd "$(dirname "$0")/.."
run=${1:?usage: benches/cvrplib_gaps.sh RUN_DIR [STRATEGY...]}
shift
if [ $# -eq 0 ]; then strategies=(greedy multistart+aug8); else strategies=("$@"); fi
bin=target/release/routeburn
out=$(mktemp -d)
echo "| set | instances | $(printf '%s gap | ' "${strategies[@]}")"
echo "|---|---|$(printf -- '---|%.0s' "${strategies[@]}")"
for set in A B E P; do
    cells=""
    count=0
    for s in "${strategies[@]}"; do
        "$bin" solve --checkpoint "$run" --strategy "$s" --out-dir "$out/$set-$s" \
            data/cvrplib/$set/*.vrp >"$out/$set-$s.tsv" 2>"$out/$set-$s.err" || true
        read -r count gap < <(awk -F'\t' 'NR > 1 && $5 != "-" { g += $5; k++ }
            END { printf "%d %.2f\n", k, (k ? g / k : 0) }' "$out/$set-$s.tsv")
        cells="$cells $gap% |"
    done
    echo "| $set | $count |$cells"
done
echo
echo "per-instance results: $out"
