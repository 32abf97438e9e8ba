//! The encoder's attention core as CubeCL kernels (CUDA, and CubeCL's CPU runtime): the
//! forward pass of [`super::SelfAttentionBackend`] for `CubeBackend`, and its backward.
//!
//! One cube per (instance, head), each unit a node's row at a time; nothing but the
//! backward's per-row statistics goes through shared memory, so any node count fits.
//! Composed from Burn's ops, an attention core is a transposed copy, two batched matmuls,
//! a softmax of four kernels and a copy back, and autodiff's backward twice as many (with
//! a zeroed gradient and a slice assignment for each of q, k and v): ~25 launches a layer
//! for a training step. Here it is one launch each way.
//!
//! Products, softmaxes and sums run in f32 whatever the tensors' float type, in node and
//! feature order, as flex's kernel does; no tensor cores, so on CUDA the core is exact f32
//! at every `model.matmul_precision` (the op-by-op form's products are TF32 at `high`).
//!
//! The backward recomputes the attention rather than keeping `[B, H, N, N]` weights. Its
//! first phase, a unit per query row, finds the row's log-sum-exp, δ_i = g_i · o_i (which
//! is Σ_j a_ij ∂a_ij) and the query's gradient; after a barrier, its second phase, a unit
//! per key row, sums the key's and value's gradients over the query rows in row order.
//! No atomics: the numbers are the same on every run.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::Shape;
// The `cube` macro's expansion names the `cubecl` crate: Burn's re-export of it.
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::cubecl::CubeCount;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

use crate::runtime::cube_launch::address_type;
use crate::runtime::cube_launch::cube_dim;

/// Units per cube (a head of one instance) on a GPU at most: CVRP100's 101 rows in one
/// pass.
const UNITS: usize = 128;

/// Units for `nodes` rows: a unit a row up to [`UNITS`], in whole warps.
fn units_for(nodes: usize) -> u32 {
    nodes.next_multiple_of(32).clamp(32, UNITS) as u32
}

/// Static shared memory a CUDA block gets (48 KiB), in f32s: the backward keeps two per
/// node.
const SHARED_FLOATS: usize = 12 * 1024;

/// Whether instances of `nodes` nodes fit the backward's shared memory (6,144 nodes).
pub(crate) fn fits(nodes: usize) -> bool {
    2 * padded(nodes) <= SHARED_FLOATS
}

fn padded(nodes: usize) -> usize {
    nodes.div_ceil(8) * 8
}

/// The sizes of a `[B, N, 3d]` projection split into `heads`: `(B, N, head size)`.
fn sizes(qkv: &CubeTensor, heads: usize) -> (usize, usize, usize) {
    let [b, n, three_d] = qkv.meta.shape().dims::<3>();
    assert!(
        three_d % (3 * heads) == 0 && fits(n),
        "the CubeCL attention core takes [B, N, 3·H·dk] projections of at most 6,144 nodes"
    );
    (b, n, three_d / 3 / heads)
}

/// Every head's attention on a CubeCL device.
///
/// # Shapes
/// - `qkv`: `[B, N, 3d]` (queries, keys, values, each head-major) → `[B, N, d]`
pub(crate) fn forward(qkv: CubeTensor, heads: usize) -> CubeTensor {
    let qkv = into_contiguous(qkv);
    let (b, n, head_dim) = sizes(&qkv, heads);
    let output = empty_device_contiguous_dtype(
        qkv.client.clone(),
        qkv.device.clone(),
        Shape::new([b, n, heads * head_dim]),
        qkv.dtype,
    );
    let client = qkv.client.clone();
    self_attention_kernel::launch(
        &client,
        CubeCount::Static((b * heads) as u32, 1, 1),
        cube_dim(&client, units_for(n)),
        address_type([&qkv, &output]),
        qkv.clone().into_tensor_arg(),
        output.clone().into_tensor_arg(),
        (head_dim as f32).sqrt(),
        n as u32,
        heads,
        head_dim,
        dtype_to_storage_type(qkv.dtype),
    );
    output
}

/// The gradient of the projection from the output's.
///
/// # Shapes
/// - `qkv`: `[B, N, 3d]`, `grad_out`: `[B, N, d]` → `[B, N, 3d]`
pub(crate) fn backward(qkv: CubeTensor, grad_out: CubeTensor, heads: usize) -> CubeTensor {
    let (qkv, grad_out) = (into_contiguous(qkv), into_contiguous(grad_out));
    let (b, n, head_dim) = sizes(&qkv, heads);
    let grad = empty_device_contiguous_dtype(
        qkv.client.clone(),
        qkv.device.clone(),
        qkv.meta.shape().clone(),
        qkv.dtype,
    );
    let client = qkv.client.clone();
    self_attention_backward_kernel::launch(
        &client,
        CubeCount::Static((b * heads) as u32, 1, 1),
        cube_dim(&client, units_for(n)),
        address_type([&qkv, &grad_out, &grad]),
        qkv.clone().into_tensor_arg(),
        grad_out.into_tensor_arg(),
        grad.clone().into_tensor_arg(),
        (head_dim as f32).sqrt(),
        n as u32,
        heads,
        head_dim,
        padded(n),
        dtype_to_storage_type(qkv.dtype),
    );
    grad
}

/// `head_dim` features of a row of a contiguous tensor from element `at`, as f32.
#[cube]
fn load<F: Float>(tensor: &Tensor<F>, at: usize, #[comptime] head_dim: usize) -> Array<f32> {
    let mut out = Array::<f32>::new(head_dim);
    for f in 0..head_dim {
        out[f] = f32::cast_from(tensor[at + f]);
    }
    out
}

/// `Σ_f vector[f] · tensor[at + f]`.
#[cube]
fn dot<F: Float>(
    vector: &Array<f32>,
    tensor: &Tensor<F>,
    at: usize,
    #[comptime] head_dim: usize,
) -> f32 {
    let mut sum = f32::new(0.0);
    for f in 0..head_dim {
        sum += vector[f] * f32::cast_from(tensor[at + f]);
    }
    sum
}

/// `vector[f] += weight · tensor[at + f]`.
#[cube]
fn add_scaled<F: Float>(
    vector: &mut Array<f32>,
    weight: f32,
    tensor: &Tensor<F>,
    at: usize,
    #[comptime] head_dim: usize,
) {
    for f in 0..head_dim {
        vector[f] += weight * f32::cast_from(tensor[at + f]);
    }
}

/// A zeroed vector of `head_dim` f32s.
#[cube]
fn zeros(#[comptime] head_dim: usize) -> Array<f32> {
    let mut out = Array::<f32>::new(head_dim);
    for f in 0..head_dim {
        out[f] = f32::new(0.0);
    }
    out
}

/// Where a cube's head reads: the instance's first row (`qkv` rows of 3d, output rows of
/// d) and the head's query, key and value columns.
#[derive(CubeType, Clone)]
struct HeadAt {
    first_row: usize,
    width: usize,
    query: usize,
    key: usize,
    value: usize,
    out: usize,
}

#[cube]
fn head_at(nodes: usize, #[comptime] heads: usize, #[comptime] head_dim: usize) -> HeadAt {
    let d = heads * head_dim;
    let (instance, head) = (CUBE_POS_X as usize / heads, CUBE_POS_X as usize % heads);
    HeadAt {
        first_row: instance * nodes,
        width: 3 * d,
        query: head * head_dim,
        key: d + head * head_dim,
        value: 2 * d + head * head_dim,
        out: head * head_dim,
    }
}

/// The softmax of a query row's scores `q · k_j / root`: their maximum and the sum of
/// `exp(s_j − max)`.
#[derive(CubeType, Clone)]
struct RowSoftmax {
    max: f32,
    sum: f32,
}

/// A query row's [`RowSoftmax`], with `Σ_j exp(s_j − max) v_j` into `weighted` (zeroed).
#[cube]
fn row_softmax<F: Float>(
    qkv: &Tensor<F>,
    query: &Array<f32>,
    at: &HeadAt,
    root: f32,
    nodes: usize,
    weighted: &mut Array<f32>,
    #[comptime] head_dim: usize,
) -> RowSoftmax {
    let mut max = f32::new(-3.0e38);
    for j in 0..nodes {
        let key = (at.first_row + j) * at.width + at.key;
        max = max.max(dot(query, qkv, key, head_dim) / root);
    }
    let mut sum = f32::new(0.0);
    for j in 0..nodes {
        let row = (at.first_row + j) * at.width;
        let w = (dot(query, qkv, row + at.key, head_dim) / root - max).exp();
        sum += w;
        add_scaled(weighted, w, qkv, row + at.value, head_dim);
    }
    RowSoftmax { max, sum }
}

#[cube(launch, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
fn self_attention_kernel<F: Float>(
    qkv: &Tensor<F>,
    output: &mut Tensor<F>,
    root: f32,
    node_count: u32,
    #[comptime] heads: usize,
    #[comptime] head_dim: usize,
    #[define(F)] _dtype: ElemType,
) {
    let nodes = node_count as usize;
    let at = head_at(nodes, heads, head_dim);
    let out_width = heads * head_dim;
    let mut i = UNIT_POS_X as usize;
    while i < nodes {
        let query = load(qkv, (at.first_row + i) * at.width + at.query, head_dim);
        let mut weighted = zeros(head_dim);
        let softmax = row_softmax(qkv, &query, &at, root, nodes, &mut weighted, head_dim);
        let out = (at.first_row + i) * out_width + at.out;
        for f in 0..head_dim {
            output[out + f] = F::cast_from(weighted[f] / softmax.sum);
        }
        i += CUBE_DIM_X as usize;
    }
}

/// With a = softmax(s), s_ij = q_i · k_j / √dk, o_i = Σ_j a_ij v_j and g the output's
/// gradient: ∂s_ij = a_ij (g_i · v_j − δ_i) with δ_i = g_i · o_i; ∂q_i = Σ_j ∂s_ij k_j / √dk,
/// ∂k_j = Σ_i ∂s_ij q_i / √dk, ∂v_j = Σ_i a_ij g_i.
#[cube(launch, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
fn self_attention_backward_kernel<F: Float>(
    qkv: &Tensor<F>,
    grad_out: &Tensor<F>,
    grad: &mut Tensor<F>,
    root: f32,
    node_count: u32,
    #[comptime] heads: usize,
    #[comptime] head_dim: usize,
    #[comptime] padded_nodes: usize,
    #[define(F)] _dtype: ElemType,
) {
    let nodes = node_count as usize;
    let at = head_at(nodes, heads, head_dim);
    let out_width = heads * head_dim;
    let (unit, units) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let mut log_sum = Shared::new_slice(padded_nodes);
    let mut delta = Shared::new_slice(padded_nodes);

    // Query rows: each row's log-sum-exp, δ and query gradient.
    let mut i = unit;
    while i < nodes {
        let row = (at.first_row + i) * at.width;
        let query = load(qkv, row + at.query, head_dim);
        let g = load(grad_out, (at.first_row + i) * out_width + at.out, head_dim);
        let mut weighted = zeros(head_dim);
        let softmax = row_softmax(qkv, &query, &at, root, nodes, &mut weighted, head_dim);
        let lse = softmax.max + softmax.sum.ln();
        let mut g_dot_out = f32::new(0.0);
        for f in 0..head_dim {
            g_dot_out += g[f] * (weighted[f] / softmax.sum);
        }
        let mut d_query = zeros(head_dim);
        for j in 0..nodes {
            let other = (at.first_row + j) * at.width;
            let a = (dot(&query, qkv, other + at.key, head_dim) / root - lse).exp();
            let d_score = a * (dot(&g, qkv, other + at.value, head_dim) - g_dot_out) / root;
            add_scaled(&mut d_query, d_score, qkv, other + at.key, head_dim);
        }
        for f in 0..head_dim {
            grad[row + at.query + f] = F::cast_from(d_query[f]);
        }
        log_sum[i] = lse;
        delta[i] = g_dot_out;
        i += units;
    }
    sync_cube();

    // Key rows: each key's and value's gradient, summed over the query rows in order.
    let mut j = unit;
    while j < nodes {
        let row = (at.first_row + j) * at.width;
        let key = load(qkv, row + at.key, head_dim);
        let value = load(qkv, row + at.value, head_dim);
        let mut d_key = zeros(head_dim);
        let mut d_value = zeros(head_dim);
        for i in 0..nodes {
            let query = (at.first_row + i) * at.width + at.query;
            let g = (at.first_row + i) * out_width + at.out;
            let a = (dot(&key, qkv, query, head_dim) / root - log_sum[i]).exp();
            let d_score = a * (dot(&value, grad_out, g, head_dim) - delta[i]) / root;
            add_scaled(&mut d_key, d_score, qkv, query, head_dim);
            add_scaled(&mut d_value, a, grad_out, g, head_dim);
        }
        for f in 0..head_dim {
            grad[row + at.key + f] = F::cast_from(d_key[f]);
            grad[row + at.value + f] = F::cast_from(d_value[f]);
        }
        j += units;
    }
}

#[cfg(test)]
mod tests {
    use super::fits;

    /// By hand: two floats a node (padded to 8) in 12,288.
    #[test]
    fn shared_memory_bounds_the_nodes() {
        assert!(fits(6144));
        assert!(!fits(6145));
        assert!(fits(101));
    }
}
