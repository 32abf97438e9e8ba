//! The decoder step from the query on, in Burn's tensor operations: what backends without
//! a fused step run, and the reference every fused form is tested against (`tests.rs`).

use burn::tensor::activation::{log_softmax, softmax};
use burn::tensor::{Bool, Tensor};

use crate::ops::matmul::{product, MatmulPrecision};

/// The step's log-probabilities: an H-head glimpse of the query over the unmasked nodes,
/// then single-head pointer logits against the logit keys, clipped to C·tanh(·), divided
/// by the temperature, masked and log-softmaxed. S = the query's rows per instance.
///
/// # Shapes
/// - `query`: `[B, S, d]`; `glimpse_keys` (already divided by √dk) and `glimpse_values`:
///   `[B, N, H, dk]`; `logit_keys`: `[B, N, d]`; `mask`: `[B × S, N]` (true = masked)
/// - output: `[B × S, N]`, −∞ at masked nodes
#[allow(clippy::too_many_arguments)]
pub(crate) fn op_by_op(
    query: Tensor<3>,
    glimpse_keys: Tensor<4>,
    glimpse_values: Tensor<4>,
    logit_keys: Tensor<3>,
    mask: Tensor<2, Bool>,
    tanh_clipping: f64,
    temperature: f64,
    precision: MatmulPrecision,
) -> Tensor<2> {
    let [b, s, _] = query.dims();
    let [_, n, _] = logit_keys.dims();
    let r = b * s;
    let heads_out = glimpse_heads(query, glimpse_keys, glimpse_values, mask.clone(), precision); // [B, S, d]

    // Single-head pointer logits, clipped, masked.
    let logits = if s == 1 {
        (heads_out * logit_keys).sum_dim(2) // [B, N, 1]
    } else {
        product(heads_out, logit_keys.swap_dims(1, 2), precision) // [B, S, N]
    }
    .reshape([r, n]); // [R, N]
    let clipped = logits.tanh() * tanh_clipping;
    let scaled = if temperature == 1.0 {
        clipped
    } else {
        clipped / temperature
    };
    log_softmax(scaled.mask_fill(mask, f32::NEG_INFINITY), 1)
}

/// The H-head glimpse: each head's query attends over the unmasked nodes; the heads'
/// outputs are concatenated (the model folds its output projection into the logit keys).
///
/// One query row per instance (S = 1) is a broadcast product summed over the features: as
/// matmuls it would be B × H one-row gemm calls on the CPU backends. With S rollouts per
/// instance the same work is a batched matmul against the instance's keys, and the
/// broadcast form would build an `[R, N, H, dk]` product at every step.
///
/// # Shapes
/// - `query`: `[B, S, d]`, keys and values `[B, N, H, dk]`, `mask`: `[R, N]` → `[B, S, d]`
fn glimpse_heads(
    query: Tensor<3>,
    glimpse_keys: Tensor<4>,
    glimpse_values: Tensor<4>,
    mask: Tensor<2, Bool>,
    precision: MatmulPrecision,
) -> Tensor<3> {
    let [b, n, heads, dk] = glimpse_keys.dims();
    let [_, s, _] = query.dims();
    if s == 1 {
        let q = query.reshape([b, 1, heads, dk]); // [B, 1, H, dk]
        let compatibility = (q * glimpse_keys).sum_dim(3); // [B, N, H, 1]
        let head_mask = mask.reshape([b, n, 1, 1]).expand([b, n, heads, 1]);
        let attention = softmax(compatibility.mask_fill(head_mask, f32::NEG_INFINITY), 1); // [B, N, H, 1]
        return (attention * glimpse_values)
            .sum_dim(1)
            .reshape([b, 1, heads * dk]); // [B, 1, d]
    }
    let q = query.reshape([b, s, heads, dk]).swap_dims(1, 2); // [B, H, S, dk]
    let keys = glimpse_keys.permute([0, 2, 3, 1]); // [B, H, dk, N]
    let compatibility = product(q, keys, precision); // [B, H, S, N]
    let head_mask = mask.reshape([b, 1, s, n]).expand([b, heads, s, n]); // [B, H, S, N]
    let attention = softmax(compatibility.mask_fill(head_mask, f32::NEG_INFINITY), 3); // [B, H, S, N]
    let values = glimpse_values.swap_dims(1, 2); // [B, H, N, dk]
    product(attention, values, precision) // [B, H, S, dk]
        .swap_dims(1, 2)
        .reshape([b, s, heads * dk]) // [B, S, d]
}
