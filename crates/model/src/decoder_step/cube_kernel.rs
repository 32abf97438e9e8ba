//! The attention decoder's step as CubeCL kernels (CUDA, and CubeCL's CPU runtime): the
//! forward pass of [`super::DecoderStepBackend`] for `CubeBackend`, and its backward.
//!
//! One cube per row, [`UNITS`] units sharing the row's work through shared memory: the
//! glimpse scores by (head, node), each head's softmax, the glimpse by feature, the logits
//! by node, the log-softmax. Composed from Burn's ops the same step is ~30 kernels (and a
//! fusion plan each) per decode step; here it is one launch with one compiled kernel per
//! padded node count.
//!
//! It reads the keys by feature (`[B, 3d, Np]`, the layout the model makes once per decode
//! for flex): the units of a cube walk the nodes, so adjacent units read adjacent
//! addresses. Sums run in f32 in node or feature order, as flex's do; the exponentials and
//! tanh are the device's, so values agree with the op-by-op form to float rounding.
//!
//! The backward kernel recomputes each row's forward pass rather than keeping its
//! attention weights: one cube per instance walks the instance's rows, so the gradients of
//! the instance's keys are summed without atomics, in row order.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::Shape;
// The `cube` macro's expansion names the `cubecl` crate: Burn's re-export of it.
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::cubecl::{CubeCount, CubeDim};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

/// Units per cube (one row) on a GPU: a multiple of the warp, and past CVRP50's 51 nodes
/// two passes over the nodes at most up to CVRP100.
const UNITS: u32 = 64;

/// Units per cube (one instance) of the backward pass on a GPU: its rows run one after
/// another, so the parallelism is within a row, mostly the instance's `3·N·d` gradient
/// entries.
const BACKWARD_UNITS: u32 = 256;

/// `units`, or fewer where the runtime runs fewer at once: CubeCL's CPU runtime gives each
/// unit of a cube with barriers its own thread and spins at `sync_cube`, so more units
/// than cores (2 here) made a step take minutes.
fn cube_dim(client: &cubecl::client::Client, units: u32) -> CubeDim {
    CubeDim::new_1d(
        units
            .min(client.properties().hardware.max_units_per_cube)
            .max(1),
    )
}

/// The most nodes the kernel takes (depot included): its shared memory is `(H + 1)·Np + d +
/// 2H + 2` floats, 34 KB at H = 8 and 1024 nodes, under the 48 KB a CUDA block gets by
/// default.
pub(crate) const MAX_NODES: usize = 1024;

/// The step's forward pass on a CubeCL device.
///
/// # Shapes
/// - `query`: `[B, S, d]`, `by_feature`: `[B, 3d, Np]`, `mask`: `[B × S, N]`
/// - output: `[B × S, N]` log-probabilities, −∞ at masked nodes
pub(crate) fn forward(
    query: CubeTensor,
    by_feature: CubeTensor,
    mask: CubeTensor,
    (heads, nodes): (usize, usize),
    (tanh_clipping, temperature): (f32, f32),
) -> CubeTensor {
    let query = into_contiguous(query);
    let by_feature = into_contiguous(by_feature);
    let mask = into_contiguous(mask);
    let [b, s, d] = query.meta.shape().dims::<3>();
    let padded_nodes = by_feature.meta.shape().dims::<3>()[2];
    assert!(
        nodes <= MAX_NODES && d % heads == 0,
        "the CubeCL decoder step takes up to {MAX_NODES} nodes (got {nodes})"
    );
    let rows = b * s;
    let (float, boolean) = (query.dtype, mask.dtype);
    let output = empty_device_contiguous_dtype(
        query.client.clone(),
        query.device.clone(),
        Shape::new([rows, nodes]),
        float,
    );
    decoder_step_kernel::launch(
        &query.client,
        CubeCount::Static(rows as u32, 1, 1),
        cube_dim(&query.client, UNITS),
        query.clone().into_tensor_arg(),
        by_feature.into_tensor_arg(),
        mask.into_tensor_arg(),
        output.clone().into_tensor_arg(),
        tanh_clipping,
        temperature,
        s as u32,
        nodes as u32,
        heads,
        d / heads,
        padded_nodes,
        [dtype_to_storage_type(float), dtype_to_storage_type(boolean)],
    );
    output
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn decoder_step_kernel<F: Float, M: Int>(
    query: &Tensor<F>,
    by_feature: &Tensor<F>,
    mask: &Tensor<M>,
    output: &mut Tensor<F>,
    tanh_clipping: f32,
    temperature: f32,
    starts: u32,
    node_count: u32,
    #[comptime] heads: usize,
    #[comptime] head_dim: usize,
    #[comptime] padded_nodes: usize,
    #[define(F, M)] _dtypes: [ElemType; 2],
) {
    let d = heads * head_dim;
    let nodes = node_count as usize;
    let row = CUBE_POS_X as usize;
    let unit = UNIT_POS_X as usize;
    let units = CUBE_DIM_X as usize;
    let instance = row / starts as usize;
    let start = row % starts as usize;

    let q = instance * query.stride(0) + start * query.stride(1);
    let q_feature = query.stride(2);
    let keys = instance * by_feature.stride(0);
    let (k_feature, k_node) = (by_feature.stride(1), by_feature.stride(2));
    let m = row * mask.stride(0);
    let m_node = mask.stride(1);

    // Scores, then unnormalised attention weights, by (head, node).
    let mut weights = Shared::new_slice(heads * padded_nodes);
    let mut glimpse = Shared::new_slice(d);
    let mut logits = Shared::new_slice(padded_nodes);
    // Each head's sum of weights, then the row's log-sum-exp at `heads`.
    let mut sums = Shared::new_slice(heads + 1);

    let mut i = unit;
    while i < heads * nodes {
        let head = i / nodes;
        let node = i % nodes;
        let mut score = F::new(0.0);
        for j in 0..head_dim {
            let f = head * head_dim + j;
            score += query[q + f * q_feature] * by_feature[keys + f * k_feature + node * k_node];
        }
        weights[head * padded_nodes + node] = score;
        i += units;
    }
    sync_cube();

    // Heads by unit, in turn where a cube has fewer units than heads.
    let mut head = unit;
    while head < heads {
        let at = head * padded_nodes;
        let mut max = F::new(-3.0e38);
        for node in 0..nodes {
            if u32::cast_from(mask[m + node * m_node]) == 0u32 {
                max = F::max(max, weights[at + node]);
            }
        }
        let mut sum = F::new(0.0);
        for node in 0..nodes {
            let mut w = F::new(0.0);
            if u32::cast_from(mask[m + node * m_node]) == 0u32 {
                w = F::exp(weights[at + node] - max);
            }
            weights[at + node] = w;
            sum += w;
        }
        sums[head] = sum;
        head += units;
    }
    sync_cube();

    // The heads' outputs, by feature: the values are rows 2d..3d of the keys by feature.
    let mut f = unit;
    while f < d {
        let head = f / head_dim;
        let at = head * padded_nodes;
        let values = keys + (2 * d + f) * k_feature;
        let mut g = F::new(0.0);
        for node in 0..nodes {
            g += weights[at + node] * by_feature[values + node * k_node];
        }
        glimpse[f] = g / sums[head];
        f += units;
    }
    sync_cube();

    // Single-head logits against the logit keys (rows d..2d), clipped.
    let mut node = unit;
    while node < nodes {
        let mut raw = F::new(0.0);
        for f in 0..d {
            raw += glimpse[f] * by_feature[keys + (d + f) * k_feature + node * k_node];
        }
        logits[node] = F::tanh(raw) * F::cast_from(tanh_clipping) / F::cast_from(temperature);
        node += units;
    }
    sync_cube();

    if unit == 0 {
        let mut max = F::new(-3.0e38);
        for node in 0..nodes {
            if u32::cast_from(mask[m + node * m_node]) == 0u32 {
                max = F::max(max, logits[node]);
            }
        }
        let mut sum = F::new(0.0);
        for node in 0..nodes {
            if u32::cast_from(mask[m + node * m_node]) == 0u32 {
                sum += F::exp(logits[node] - max);
            }
        }
        sums[heads] = max + F::ln(sum);
    }
    sync_cube();

    let log_sum = sums[heads];
    let out = row * output.stride(0);
    let out_node = output.stride(1);
    let mut node = unit;
    while node < nodes {
        let mut log_p = F::new(f32::NEG_INFINITY);
        if u32::cast_from(mask[m + node * m_node]) == 0u32 {
            log_p = logits[node] - log_sum;
        }
        output[out + node * out_node] = log_p;
        node += units;
    }
}

/// Gradients of the step's query `[B, S, d]` and of its glimpse keys, glimpse values and
/// logit keys, node-major `[B, N, d]`, from the gradient of its log-probabilities.
///
/// One cube per instance: its rows one after another (each recomputes its forward pass
/// in shared memory), and each entry of the instance's key, value and logit-key gradients
/// owned by one unit, which adds the rows' terms in row order. No atomics, so the sums
/// are the same on every run.
///
/// # Shapes
/// - `query`: `[B, S, d]`, `by_feature`: `[B, 3d, Np]`, `mask`, `log_probs` and
///   `grad_out`: `[B × S, N]`
pub(crate) fn backward(
    [query, by_feature, mask, log_probs, grad_out]: [CubeTensor; 5],
    (heads, nodes): (usize, usize),
    (tanh_clipping, temperature): (f32, f32),
) -> [CubeTensor; 4] {
    let [query, by_feature, mask, log_probs, grad_out] =
        [query, by_feature, mask, log_probs, grad_out].map(into_contiguous);
    let [b, s, d] = query.meta.shape().dims::<3>();
    let padded_nodes = by_feature.meta.shape().dims::<3>()[2];
    let (float, boolean) = (query.dtype, mask.dtype);
    let empty = |shape: Shape| {
        empty_device_contiguous_dtype(query.client.clone(), query.device.clone(), shape, float)
    };
    let grads = [
        empty(Shape::new([b, s, d])),
        empty(Shape::new([b, nodes, d])),
        empty(Shape::new([b, nodes, d])),
        empty(Shape::new([b, nodes, d])),
    ];
    let [d_query, d_keys, d_values, d_logit_keys] = grads.clone();
    let client = query.client.clone();
    decoder_step_backward_kernel::launch(
        &client,
        CubeCount::Static(b as u32, 1, 1),
        cube_dim(&client, BACKWARD_UNITS),
        query.into_tensor_arg(),
        by_feature.into_tensor_arg(),
        mask.into_tensor_arg(),
        log_probs.into_tensor_arg(),
        grad_out.into_tensor_arg(),
        d_query.into_tensor_arg(),
        d_keys.into_tensor_arg(),
        d_values.into_tensor_arg(),
        d_logit_keys.into_tensor_arg(),
        tanh_clipping / temperature,
        s as u32,
        nodes as u32,
        heads,
        d / heads,
        padded_nodes,
        [dtype_to_storage_type(float), dtype_to_storage_type(boolean)],
    );
    grads
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn decoder_step_backward_kernel<F: Float, M: Int>(
    query: &Tensor<F>,
    by_feature: &Tensor<F>,
    mask: &Tensor<M>,
    log_probs: &Tensor<F>,
    grad_out: &Tensor<F>,
    d_query: &mut Tensor<F>,
    d_keys: &mut Tensor<F>,
    d_values: &mut Tensor<F>,
    d_logit_keys: &mut Tensor<F>,
    slope: f32,
    starts: u32,
    node_count: u32,
    #[comptime] heads: usize,
    #[comptime] head_dim: usize,
    #[comptime] padded_nodes: usize,
    #[define(F, M)] _dtypes: [ElemType; 2],
) {
    let d = heads * head_dim;
    let nodes = node_count as usize;
    let rows = starts as usize;
    let instance = CUBE_POS_X as usize;
    let unit = UNIT_POS_X as usize;
    let units = CUBE_DIM_X as usize;
    let keys = instance * by_feature.stride(0);
    let (k_feature, k_node) = (by_feature.stride(1), by_feature.stride(2));
    let (m_row, m_node) = (mask.stride(0), mask.stride(1));
    // The instance's node-major gradients, `[B, N, d]` contiguous.
    let node_major = instance * nodes * d;

    // Attention weights, then their gradients, by (head, node); the glimpse and its
    // gradient by feature; tanh and the raw logits' gradient by node.
    let mut attention = Shared::new_slice(heads * padded_nodes);
    let mut d_scores = Shared::new_slice(heads * padded_nodes);
    let mut glimpse = Shared::new_slice(d);
    let mut d_glimpse = Shared::new_slice(d);
    let mut tanh = Shared::new_slice(padded_nodes);
    let mut d_raw = Shared::new_slice(padded_nodes);
    let mut sums = Shared::new_slice(heads + 1);

    for start in 0..rows {
        let row = instance * rows + start;
        let q = instance * query.stride(0) + start * query.stride(1);
        let q_feature = query.stride(2);
        let m = row * m_row;

        // The forward pass again: normalised attention weights, the glimpse, tanh.
        let mut i = unit;
        while i < heads * nodes {
            let head = i / nodes;
            let node = i % nodes;
            let mut score = F::new(0.0);
            for j in 0..head_dim {
                let f = head * head_dim + j;
                score +=
                    query[q + f * q_feature] * by_feature[keys + f * k_feature + node * k_node];
            }
            attention[head * padded_nodes + node] = score;
            i += units;
        }
        sync_cube();
        // Heads by unit, then log_softmax's Σg over every entry (as the composed form
        // takes it) as one more task.
        let mut task = unit;
        while task <= heads {
            if task < heads {
                let at = task * padded_nodes;
                let mut max = F::new(-3.0e38);
                for node in 0..nodes {
                    if u32::cast_from(mask[m + node * m_node]) == 0u32 {
                        max = F::max(max, attention[at + node]);
                    }
                }
                let mut sum = F::new(0.0);
                for node in 0..nodes {
                    let mut w = F::new(0.0);
                    if u32::cast_from(mask[m + node * m_node]) == 0u32 {
                        w = F::exp(attention[at + node] - max);
                    }
                    attention[at + node] = w;
                    sum += w;
                }
                for node in 0..nodes {
                    attention[at + node] = attention[at + node] / sum;
                }
            } else {
                let mut total = F::new(0.0);
                for node in 0..nodes {
                    total += grad_out[row * nodes + node];
                }
                sums[heads] = total;
            }
            task += units;
        }
        sync_cube();
        let mut f = unit;
        while f < d {
            let at = (f / head_dim) * padded_nodes;
            let values = keys + (2 * d + f) * k_feature;
            let mut g = F::new(0.0);
            for node in 0..nodes {
                g += attention[at + node] * by_feature[values + node * k_node];
            }
            glimpse[f] = g;
            f += units;
        }
        sync_cube();

        // log_softmax and tanh clipping: dz = g − p·Σg, d_raw = dz · C/T · (1 − tanh²).
        let mut node = unit;
        while node < nodes {
            let mut raw = F::new(0.0);
            for f in 0..d {
                raw += glimpse[f] * by_feature[keys + (d + f) * k_feature + node * k_node];
            }
            let t = F::tanh(raw);
            tanh[node] = t;
            let mut grad = F::new(0.0);
            if u32::cast_from(mask[m + node * m_node]) == 0u32 {
                let p = F::exp(log_probs[row * nodes + node]);
                let dz = grad_out[row * nodes + node] - p * sums[heads];
                grad = dz * F::cast_from(slope) * (F::new(1.0) - t * t);
            }
            d_raw[node] = grad;
            node += units;
        }
        sync_cube();

        // raw = glimpse · logit_keys[node]
        let mut f = unit;
        while f < d {
            let logit_keys = keys + (d + f) * k_feature;
            let mut g = F::new(0.0);
            for node in 0..nodes {
                g += d_raw[node] * by_feature[logit_keys + node * k_node];
            }
            d_glimpse[f] = g;
            f += units;
        }
        let mut i = unit;
        while i < nodes * d {
            let term = d_raw[i / d] * glimpse[i % d];
            if start == 0 {
                d_logit_keys[node_major + i] = term;
            } else {
                d_logit_keys[node_major + i] += term;
            }
            i += units;
        }
        sync_cube();

        // glimpse = Σ_node attention · values
        let mut i = unit;
        while i < heads * nodes {
            let head = i / nodes;
            let node = i % nodes;
            let mut g = F::new(0.0);
            for j in 0..head_dim {
                let f = head * head_dim + j;
                g += d_glimpse[f] * by_feature[keys + (2 * d + f) * k_feature + node * k_node];
            }
            d_scores[head * padded_nodes + node] = g;
            i += units;
        }
        let mut i = unit;
        while i < nodes * d {
            let node = i / d;
            let f = i % d;
            let term = attention[(f / head_dim) * padded_nodes + node] * d_glimpse[f];
            if start == 0 {
                d_values[node_major + i] = term;
            } else {
                d_values[node_major + i] += term;
            }
            i += units;
        }
        sync_cube();

        // softmax: d_score = a · (d_a − Σ a·d_a), per head
        let mut head = unit;
        while head < heads {
            let at = head * padded_nodes;
            let mut dot = F::new(0.0);
            for node in 0..nodes {
                dot += attention[at + node] * d_scores[at + node];
            }
            sums[head] = dot;
            head += units;
        }
        sync_cube();
        let mut i = unit;
        while i < heads * nodes {
            let head = i / nodes;
            let at = head * padded_nodes + i % nodes;
            d_scores[at] = attention[at] * (d_scores[at] - sums[head]);
            i += units;
        }
        sync_cube();

        // score = query_head · keys[node, head]
        let mut f = unit;
        while f < d {
            let at = (f / head_dim) * padded_nodes;
            let mut g = F::new(0.0);
            for node in 0..nodes {
                g += d_scores[at + node] * by_feature[keys + f * k_feature + node * k_node];
            }
            d_query[row * d + f] = g;
            f += units;
        }
        let mut i = unit;
        while i < nodes * d {
            let node = i / d;
            let f = i % d;
            let term = d_scores[(f / head_dim) * padded_nodes + node] * query[q + f * q_feature];
            if start == 0 {
                d_keys[node_major + i] = term;
            } else {
                d_keys[node_major + i] += term;
            }
            i += units;
        }
        sync_cube();
    }
}
