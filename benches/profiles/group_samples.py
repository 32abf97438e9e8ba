#!/usr/bin/env python3
"""Shares of a POMO step's time by part, from `perf script -F comm,tid,ip,sym` output.

Each sample is counted under the first frame, walking from the leaf to the root, that
matches one of GROUPS, tried in order (the rule of pomo_flex_session18.md); a sample
no frame of which matches counts as routeburn's other frames if any frame names routeburn.
Usage:

    perf script -i perf.data -F comm,tid,ip,sym > perf.txt
    python3 benches/profiles/group_samples.py perf.txt [--without-validation]
"""
import sys
from collections import Counter

GROUPS = [
    ("linear layers' products", ["linear::kernel", "ops::linear::"]),
    ("decoder step kernel, backward",
     ["decoder_step::flex_kernel::backward", "decoder_step::flex_kernel::instance_grads"]),
    ("decoder step kernel, forward", ["decoder_step::flex_kernel::forward"]),
    ("encoder attention, forward and backward", ["self_attention::"]),
    ("instance norm", ["normalization::", "ops::norm::"]),
    ("the mask", ["mask_kernel", "ops::mask::"]),
    ("sampling (`sample_inverse_cdf`, `ops::sampling`)", ["sample_inverse_cdf", "ops::sampling::"]),
    ("checkpoints and metrics", ["run::checkpoint", "run::metrics"]),
    ("`CvrpState::step` and the rest of the state", ["CvrpState::"]),
    ("the whole decode's own state, mask and choice (`flex_decode`)",
     ["decoder_step::flex_decode::"]),
    ("`Record` (log-probabilities and tours)", ["decode::Record"]),
    ("`step_log_probs`' own operations", ["step_log_probs"]),
    ("`precompute`", ["precompute"]),
    ("the encoder's other operations", ["encoder::"]),
    ("summing the shards' gradients", ["ModuleGradsAccumulator"]),
    ("optimiser (Adam, weight decay, clipping)",
     ["burn_optim::optim::adam", "weight_decay", "grad_clipping", "GradientClipping",
      "trainer::adam::"]),
    ("Burn's backward of the other operations", ["AutodiffServer::execute_steps"]),
]
# A sample with any of these frames is validation's (a decode without gradients), counted
# apart: `--without-validation` leaves them out of the shares. The decoder step's forward
# without gradients is `flex_kernel::log_probs`.
VALIDATION = ["flex_kernel::log_probs", "evaluate::validated_costs", "evaluate::decode_costs"]
# Tried only when no frame of the sample matches GROUPS: inlined frames name their
# generic arguments (`weighted_rows_block<routeburn_model::row_kernels::Avx512Lanes, ..>`)
# and would otherwise take the samples of the kernel they are inlined into.
OTHER_ROUTEBURN = "other routeburn frames"


def samples(path):
    """Each sample's frames, leaf first."""
    frames = []
    with open(path, errors="replace") as f:
        for line in f:
            if not line.strip():
                if frames:
                    yield frames
                frames = []
            elif line.startswith(("\t", " ")):
                frames.append(line.split(None, 1)[1].strip() if len(line.split()) > 1 else "")
    if frames:
        yield frames


def group_of(frames):
    for frame in frames:
        for name, keys in GROUPS:
            if any(k in frame for k in keys):
                return name
    if any("routeburn" in frame for frame in frames):
        return OTHER_ROUTEBURN
    return "startup, allocator, idle, other"


def main():
    without_validation = "--without-validation" in sys.argv[2:]
    counts, validation = Counter(), 0
    for frames in samples(sys.argv[1]):
        if without_validation and any(k in f for f in frames for k in VALIDATION):
            validation += 1
            continue
        counts[group_of(frames)] += 1
    total = sum(counts.values())
    left_out = f", {validation} of validation left out" if without_validation else ""
    print(f"{total} samples{left_out}\n\n| where | share |\n|---|---|")
    for name, c in counts.most_common():
        print(f"| {name} | {100 * c / total:.1f}% |")


if __name__ == "__main__":
    main()
