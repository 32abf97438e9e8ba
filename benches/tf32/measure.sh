#!/usr/bin/env bash
# TF32's share of the flex/cuda disagreement, measured on the CPU: ndarray with every
# matmul's operands rounded to TF32 (burn-ndarray.patch, routeburn.patch; README.md here)
# against flex and exact ndarray.
#
#   benches/tf32/measure.sh PATCHED-ROUTEBURN [OUT-DIR]
#
# 1. Kool's three published models, greedy on data/validation: tours as his code decodes
#    them, and the mean gap, with TF32 nowhere / everywhere / in the encoder / in the
#    decoder, and everywhere with --matmul-precision highest (3xTF32: "all, highest").
# 2. compare-backends flex vs ndarray: the same 256 tours scored on both (max |Δll|, and
#    per step of the tour), untrained models at n = 10, 20, 50, 100 (seeds 1-3), and Kool's
#    three models (these also at highest).
set -u
rb=${1:?usage: measure.sh PATCHED-ROUTEBURN [OUT-DIR]}
out=${2:-$(mktemp -d)}
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
# "S of T": eval --out's tours (its `tour` column) equal to the JSONL file's `actions`.
same_tours() {
    awk -F, 'NR == FNR { if (FNR == 1) { for (i = 1; i <= NF; i++) if ($i == "tour") c = i }
                         else ours[FNR - 1] = $c; next }
        match($0, /"actions": *\[[^]]*\]/) {
            a = substr($0, RSTART, RLENGTH); sub(/^[^[]*\[/, "", a); sub(/\]$/, "", a); gsub(/, */, " ", a)
            total++; if (ours[FNR] == a) same++ }
        END { printf "%d of %d", same, total }' "$1" "$2"
}
kool() { echo "$repo/data/kool-pretrained/cvrp_$1"; }

echo "| model | TF32 in | tours as Kool's | mean gap |"
echo "|---|---|---|---|"
for n in 20 50 100; do
    for mode in none all encoder decoder all,highest; do
        precision=high; [[ $mode == *,highest ]] && precision=highest
        ROUTEBURN_EMULATE_TF32=${mode%,highest} "$rb" eval --backend ndarray --checkpoint "$(kool $n)/epoch-99.pt" \
            --matmul-precision $precision --data "$repo/data/validation/cvrp$n.jsonl" \
            --out "$out/kool-$mode-$n.csv" >"$out/kool-$mode-$n.txt" 2>&1
        echo "| cvrp_$n | ${mode/,/, } | $(same_tours "$out/kool-$mode-$n.csv" "$(kool $n)/greedy-validation-cvrp$n.jsonl") | $(awk '/^mean gap/ { print $3 }' "$out/kool-$mode-$n.txt") |"
    done
done

echo
echo "| model | TF32 | max abs Δll | max Δll per step | own greedy tours differing |"
echo "|---|---|---|---|---|"
agree() { # agree LABEL MODE ARGS...: compare-backends flex,ndarray, one row
    local label=$1 mode=$2; shift 2
    ROUTEBURN_EMULATE_TF32=${mode%,highest} "$rb" compare-backends --backends flex,ndarray --steps 1 "$@" 2>/dev/null \
        | awk -F'|' -v l="$label" -v m="$mode" '/^\| ndarray \|/ { print "| " l " | " m " |" $(NF-4) "|" $(NF-3) "|" $(NF-2) "|" }'
}
for n in 10 20 50 100; do
    for seed in 1 2 3; do
        printf '[problem]\nn = %d\n[training]\nbatch_size = 16\nseed = %d\n[reinforce]\nbatches_per_epoch = 1\nbaseline = "exponential"\n[validation]\nsize = 16\nbatch_size = 16\n' \
            "$n" "$seed" >"$out/n$n-s$seed.toml"
        for mode in none all; do agree "untrained, n = $n, seed $seed" $mode --config "$out/n$n-s$seed.toml"; done
    done
done
for n in 20 50 100; do
    for mode in none all; do agree "Kool's cvrp_$n" $mode --checkpoint "$(kool $n)/epoch-99.pt"; done
    agree "Kool's cvrp_$n" all,highest --checkpoint "$(kool $n)/epoch-99.pt" --matmul-precision highest
done
