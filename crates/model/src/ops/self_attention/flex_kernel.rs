//! The encoder's attention core in plain Rust over contiguous `f32` rows: the CPU
//! implementation of [`super::SelfAttentionBackend`] for flex.
//!
//! Layouts (row-major, contiguous): `qkv` `[B, N, 3d]`, each node's queries, keys and
//! values, each head-major (the output of the attention's one projection); the output and
//! its gradient `[B, N, d]`, the heads' outputs side by side (what the output projection
//! reads). Neither needs a transpose: a head is a column range.
//!
//! Work is split by instance (rayon); an instance's heads run in turn, and every sum is
//! taken in one order, so no number depends on the thread count. A product of a row
//! against every node reads that head's keys (or values) by feature, `[dk, Np]` (Np = N
//! rounded up to a multiple of 8, zero beyond N), built per head into scratch space: `dk`
//! vector updates of Np lanes, no horizontal sums.

use rayon::prelude::*;

use crate::ops::row_kernels::{
    masked_softmax, padded, simd_dispatch, weighted_sums_all, MulAdd, RowsAt,
};

/// Sizes of one instance (a call takes as many as its slices hold).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub(crate) nodes: usize,
    pub(crate) heads: usize,
    pub(crate) head_dim: usize,
}

impl Dims {
    fn embed(&self) -> usize {
        self.heads * self.head_dim
    }

    /// √dk, what the scores are divided by.
    fn root(&self) -> f32 {
        (self.head_dim as f32).sqrt()
    }
}

/// Query rows whose attention weights a forward holds at once. `[N, Np]` of weights per
/// thread is 14 GiB at 60,000 nodes; `[ROW_BLOCK, Np]` is 59 MiB, so inference on a large
/// instance holds what grows as N, not N², beside the weights training keeps. A multiple of
/// [`weighted_sums_all`]'s 8-row blocks, and each row's sums are taken in one order, so the
/// blocks change no number.
const ROW_BLOCK: usize = 256;

/// One thread's working space for the forward, reused across the instances it takes.
struct ForwardScratch {
    /// Query rows a block holds: [`ROW_BLOCK`], or N where fewer.
    block_rows: usize,
    /// `[dk, Np]` one head's keys by feature.
    keys_t: Vec<f32>,
    /// `[block_rows, Np]` a block of rows' scores, then their attention weights.
    attention: Vec<f32>,
    /// `[Np]` 1 at nodes, 0 at padding.
    keep: Vec<f32>,
}

impl ForwardScratch {
    fn new(dims: Dims) -> Self {
        Self::with_blocks_of(dims, ROW_BLOCK)
    }

    /// Blocks of `rows` query rows (a multiple of 8 for the same numbers as any other).
    fn with_blocks_of(dims: Dims, rows: usize) -> Self {
        let (n, dk) = (dims.nodes, dims.head_dim);
        let np = padded(n);
        let block_rows = rows.min(n).max(1);
        let mut keep = vec![0.0; np];
        keep[..n].fill(1.0);
        Self {
            block_rows,
            keys_t: vec![0.0; dk * np],
            attention: vec![0.0; block_rows * np],
            keep,
        }
    }
}

/// One thread's working space for the backward, reused across the instances it takes.
struct BackwardScratch {
    /// `[dk, Np]` one head's values by feature.
    values_t: Vec<f32>,
    /// `[N, Np]` the weights' gradients, then the scores'.
    d_scores: Vec<f32>,
}

impl BackwardScratch {
    fn new(dims: Dims) -> Self {
        let np = padded(dims.nodes);
        Self {
            values_t: vec![0.0; dims.head_dim * np],
            d_scores: vec![0.0; dims.nodes * np],
        }
    }
}

/// `out[b, i, head] = Σ_j softmax_j(q_i · k_j / √dk) v_j` for every instance, node and
/// head: `[B, N, d]` from `qkv` `[B, N, 3d]`. With `weights` (`[B, H, N, Np]`, see
/// [`weights_len`]) the attention weights are kept there for the backward.
pub(crate) fn forward(dims: Dims, qkv: &[f32], weights: Option<&mut [f32]>) -> Vec<f32> {
    let (n, d) = (dims.nodes, dims.embed());
    let mut out = vec![0.0f32; qkv.len() / 3];
    let Some(weights) = weights else {
        forward_in_row_blocks(dims, qkv, &mut out);
        return out;
    };
    out.par_chunks_mut(n * d)
        .zip(qkv.par_chunks(n * 3 * d))
        .zip(weights.par_chunks_mut(dims.heads * n * padded(n)))
        .for_each_init(
            || ForwardScratch::new(dims),
            |scratch, ((out, qkv), weights)| {
                forward_instance_dispatch(dims, qkv, (out, Some(weights)), scratch)
            },
        );
    out
}

/// [`forward`] without kept weights (inference), split by blocks of [`ROW_BLOCK`] query
/// rows of every instance rather than by instance, so that one large instance takes every
/// core. A block reads its instance's keys by feature again for each head (N·dk copies
/// beside its ROW_BLOCK·N·dk products); instances of at most ROW_BLOCK nodes are one block
/// each, as before. A row's sums run in the same order in any block.
fn forward_in_row_blocks(dims: Dims, qkv: &[f32], out: &mut [f32]) {
    let (n, d) = (dims.nodes, dims.embed());
    let blocks: Vec<(usize, &mut [f32])> = out
        .chunks_mut(n * d)
        .enumerate()
        .flat_map(|(b, rows)| rows.chunks_mut(ROW_BLOCK * d).map(move |block| (b, block)))
        .collect();
    blocks.into_par_iter().enumerate().for_each_init(
        || ForwardScratch::new(dims),
        |scratch, (k, (b, block))| {
            let first = (k - b * n.div_ceil(ROW_BLOCK)) * ROW_BLOCK;
            let qkv = &qkv[b * n * 3 * d..][..n * 3 * d];
            forward_rows_dispatch(dims, qkv, (first, block), scratch);
        },
    );
}

/// The length of the attention weights [`forward`] keeps for `instances`: `[B, H, N, Np]`.
pub(crate) fn weights_len(dims: Dims, instances: usize) -> usize {
    instances * dims.heads * dims.nodes * padded(dims.nodes)
}

/// One instance's output `[N, d]`, and where to keep its weights `[H, N, Np]`.
type ForwardOut<'a> = (&'a mut [f32], Option<&'a mut [f32]>);

simd_dispatch! {
    /// [`forward_instance`] in the best form the CPU allows.
    fn forward_instance_dispatch => forward_instance(
        dims: Dims,
        qkv: &[f32],
        out: ForwardOut,
        scratch: &mut ForwardScratch,
    )
}

simd_dispatch! {
    /// [`forward_rows`] in the best form the CPU allows.
    fn forward_rows_dispatch => forward_rows(
        dims: Dims,
        qkv: &[f32],
        out: (usize, &mut [f32]),
        scratch: &mut ForwardScratch,
    )
}

/// Query rows `first..` of one instance (`qkv` `[N, 3d]`), as many as `out` holds
/// (`[rows, d]`, at most `s.block_rows`), head by head, without kept weights.
#[inline(always)]
fn forward_rows<M: MulAdd>(
    dims: Dims,
    qkv: &[f32],
    (first, out): (usize, &mut [f32]),
    s: &mut ForwardScratch,
) {
    let (n, d, dk) = (dims.nodes, dims.embed(), dims.head_dim);
    let np = padded(n);
    let rows = out.len() / d;
    for head in 0..dims.heads {
        by_feature(&qkv[d + head * dk..], 3 * d, (n, dk), &mut s.keys_t);
        let attention = &mut s.attention[..rows * np]; // [rows, Np]
        let queries = &qkv[first * 3 * d + head * dk..];
        attention_weights::<M>(dims, queries, (&s.keys_t, &s.keep), attention);
        let by_weight = RowsAt::contiguous(np, n, d);
        let values = &qkv[2 * d + head * dk..];
        let out = &mut out[head * dk..];
        weighted_sums_all::<M>(rows, attention, values, (3 * d, dk), by_weight, out);
    }
}

/// One instance: `qkv` `[N, 3d]` → `out` `[N, d]`, head by head and, within a head, by
/// blocks of query rows (`s.block_rows`).
#[inline(always)]
fn forward_instance<M: MulAdd>(dims: Dims, qkv: &[f32], io: ForwardOut, s: &mut ForwardScratch) {
    let (n, d, dk) = (dims.nodes, dims.embed(), dims.head_dim);
    let np = padded(n);
    let (out, mut weights) = io;
    for head in 0..dims.heads {
        by_feature(&qkv[d + head * dk..], 3 * d, (n, dk), &mut s.keys_t);
        for first in (0..n).step_by(s.block_rows) {
            let rows = s.block_rows.min(n - first);
            let attention = &mut s.attention[..rows * np]; // [rows, Np]
            let queries = &qkv[first * 3 * d + head * dk..];
            attention_weights::<M>(dims, queries, (&s.keys_t, &s.keep), attention);
            if let Some(w) = weights.as_deref_mut() {
                w[(head * n + first) * np..][..rows * np].copy_from_slice(attention);
            }
            let by_weight = RowsAt::contiguous(np, n, d);
            let values = &qkv[2 * d + head * dk..];
            let out = &mut out[first * d + head * dk..];
            weighted_sums_all::<M>(rows, attention, values, (3 * d, dk), by_weight, out);
        }
    }
}

/// The attention weights `[rows, Np]` (0 at padding) of a block of query rows, `queries`
/// (row r's at `r · 3d`), against one head's keys by feature `[dk, Np]`.
#[inline(always)]
fn attention_weights<M: MulAdd>(
    dims: Dims,
    queries: &[f32],
    (keys_t, keep): (&[f32], &[f32]),
    attention: &mut [f32],
) {
    let (n, d, dk) = (dims.nodes, dims.embed(), dims.head_dim);
    let np = padded(n);
    let by_query = RowsAt::contiguous(3 * d, dk, np);
    let rows = attention.len() / np;
    weighted_sums_all::<M>(rows, queries, keys_t, (np, np), by_query, attention);
    let root = dims.root();
    for row in attention.chunks_exact_mut(np) {
        for score in row.iter_mut() {
            *score /= root;
        }
        masked_softmax::<M>(row, keep);
    }
}

/// `out[f·Np + j] = rows[j·stride + f]` for `n` rows of `width` features (`out`'s lanes
/// past `n` are left as they are: zero).
fn by_feature(rows: &[f32], stride: usize, (n, width): (usize, usize), out: &mut [f32]) {
    let np = padded(n);
    for j in 0..n {
        for (f, &x) in rows[j * stride..][..width].iter().enumerate() {
            out[f * np + j] = x;
        }
    }
}

/// The gradient of `qkv` `[B, N, 3d]` from the output's, `grad_out` `[B, N, d]`, and the
/// attention weights the forward kept.
pub(crate) fn backward(dims: Dims, qkv: &[f32], weights: &[f32], grad_out: &[f32]) -> Vec<f32> {
    let (n, d) = (dims.nodes, dims.embed());
    let mut grad = vec![0.0f32; qkv.len()];
    grad.par_chunks_mut(n * 3 * d)
        .zip(qkv.par_chunks(n * 3 * d))
        .zip(weights.par_chunks(dims.heads * n * padded(n)))
        .zip(grad_out.par_chunks(n * d))
        .for_each_init(
            || BackwardScratch::new(dims),
            |scratch, (((grad, qkv), weights), grad_out)| {
                let io = (qkv, weights, grad_out, grad);
                backward_instance_dispatch(dims, io, scratch)
            },
        );
    grad
}

/// One instance's `qkv` `[N, 3d]`, attention weights `[H, N, Np]`, output gradient
/// `[N, d]` and `qkv` gradient `[N, 3d]`.
type BackwardIo<'a> = (&'a [f32], &'a [f32], &'a [f32], &'a mut [f32]);

simd_dispatch! {
    /// [`backward_instance`] in the best form the CPU allows.
    fn backward_instance_dispatch => backward_instance(
        dims: Dims,
        io: BackwardIo,
        scratch: &mut BackwardScratch,
    )
}

/// One instance, head by head. With a = softmax(s), s = q·k/√dk, o = Σ a v:
/// ∂a_ij = g_i · v_j, ∂s_ij = a_ij (∂a_ij − Σ_j' a_ij' ∂a_ij') / √dk, then
/// ∂q_i = Σ_j ∂s_ij k_j, ∂k_j = Σ_i ∂s_ij q_i, ∂v_j = Σ_i a_ij g_i.
#[inline(always)]
fn backward_instance<M: MulAdd>(dims: Dims, io: BackwardIo, s: &mut BackwardScratch) {
    let (qkv, weights, grad_out, grad) = io;
    let (n, d, dk) = (dims.nodes, dims.embed(), dims.head_dim);
    let np = padded(n);
    let root = dims.root();
    for head in 0..dims.heads {
        let attention = &weights[head * n * np..][..n * np]; // [N, Np]
        by_feature(&qkv[2 * d + head * dk..], 3 * d, (n, dk), &mut s.values_t);
        let by_gradient = RowsAt::contiguous(d, dk, np);
        let g = &grad_out[head * dk..];
        weighted_sums_all::<M>(n, g, &s.values_t, (np, np), by_gradient, &mut s.d_scores);
        for (ds, a) in s
            .d_scores
            .chunks_exact_mut(np)
            .zip(attention.chunks_exact(np))
        {
            let dot = ds
                .iter()
                .zip(a)
                .fold(0.0, |acc, (&x, &w)| M::mul_add(x, w, acc));
            for (x, &w) in ds.iter_mut().zip(a) {
                *x = w * (*x - dot) / root;
            }
        }
        let over_nodes = RowsAt::contiguous(np, n, 3 * d);
        let keys = &qkv[d + head * dk..];
        let d_queries = &mut grad[head * dk..];
        weighted_sums_all::<M>(n, &s.d_scores, keys, (3 * d, dk), over_nodes, d_queries);
        // Node j's coefficients are column j of the `[N, Np]` tables, read in place.
        let over_rows = RowsAt {
            coef_stride: 1,
            coef_step: np,
            ..over_nodes
        };
        let queries = &qkv[head * dk..];
        let d_keys = &mut grad[d + head * dk..];
        weighted_sums_all::<M>(n, &s.d_scores, queries, (3 * d, dk), over_rows, d_keys);
        let d_values = &mut grad[2 * d + head * dk..];
        let g = (&grad_out[head * dk..], (d, dk));
        weighted_sums_all::<M>(n, attention, g.0, g.1, over_rows, d_values);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::row_kernels::{assert_forms_agree, Fused, NamedOutputs, Plain, Wide};
    use crate::test_support::pseudo_random;

    /// `instances` instances' output, kept weights and `qkv` gradient, each instance
    /// through the form `M`'s kernels in turn.
    fn run<M: MulAdd>(dims: Dims, qkv: &[f32], grad_out: &[f32]) -> NamedOutputs {
        let (n, d) = (dims.nodes, dims.embed());
        let instances = qkv.len() / (n * 3 * d);
        let per_weights = weights_len(dims, 1);
        let mut scratch = ForwardScratch::new(dims);
        let mut backward_scratch = BackwardScratch::new(dims);
        let mut out = vec![0.0f32; instances * n * d];
        let mut weights = vec![0.0f32; weights_len(dims, instances)];
        let mut grad = vec![0.0f32; qkv.len()];
        for i in 0..instances {
            let qkv = &qkv[i * n * 3 * d..][..n * 3 * d];
            let w = &mut weights[i * per_weights..][..per_weights];
            let io = (&mut out[i * n * d..][..n * d], Some(w));
            forward_instance::<M>(dims, qkv, io, &mut scratch);
        }
        for i in 0..instances {
            let qkv_i = &qkv[i * n * 3 * d..][..n * 3 * d];
            let w = &weights[i * per_weights..][..per_weights];
            let g = &grad_out[i * n * d..][..n * d];
            let grad_i = &mut grad[i * n * 3 * d..][..n * 3 * d];
            backward_instance::<M>(dims, (qkv_i, w, g, grad_i), &mut backward_scratch);
        }
        vec![("out", out), ("weights", weights), ("d_qkv", grad)]
    }

    /// One instance's output and kept weights with its query rows in blocks of `rows`.
    fn forward_in_blocks(dims: Dims, qkv: &[f32], rows: usize) -> (Vec<f32>, Vec<f32>) {
        let mut scratch = ForwardScratch::with_blocks_of(dims, rows);
        let mut out = vec![0.0f32; dims.nodes * dims.embed()];
        let mut weights = vec![0.0f32; weights_len(dims, 1)];
        let io = (&mut out[..], Some(&mut weights[..]));
        forward_instance_dispatch(dims, qkv, io, &mut scratch);
        (out, weights)
    }

    /// Query rows in blocks, as inference on a large instance runs them: the same bits
    /// whatever the block (one block, 256 rows and a remainder, 8-row blocks), and the
    /// attention's definition taken in f64 node by node.
    #[test]
    fn blocks_of_query_rows_change_no_number() {
        let dims = Dims {
            nodes: 300,
            heads: 2,
            head_dim: 8,
        };
        let (n, d, dk) = (dims.nodes, dims.embed(), dims.head_dim);
        let qkv = pseudo_random(n * 3 * d, 11, 1.0);
        let whole = forward_in_blocks(dims, &qkv, n);
        assert_eq!(forward_in_blocks(dims, &qkv, ROW_BLOCK), whole);
        assert_eq!(forward_in_blocks(dims, &qkv, 8), whole);
        let at = |node: usize, part: usize, head: usize, f: usize| {
            f64::from(qkv[node * 3 * d + part * d + head * dk + f])
        };
        for head in 0..dims.heads {
            for i in [0, 1, 255, 256, 299] {
                let scores: Vec<f64> = (0..n)
                    .map(|j| {
                        (0..dk)
                            .map(|f| at(i, 0, head, f) * at(j, 1, head, f))
                            .sum::<f64>()
                    })
                    .map(|s| s / (dk as f64).sqrt())
                    .collect();
                let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                for f in 0..dk {
                    let expected: f64 = (0..n)
                        .map(|j| (scores[j] - max).exp() / total * at(j, 2, head, f))
                        .sum();
                    let got = f64::from(whole.0[i * d + head * dk + f]);
                    assert!(
                        (got - expected).abs() < 1e-5,
                        "node {i} head {head}: {got} vs {expected}"
                    );
                }
            }
        }
    }

    /// Inference's blocks of query rows across instances (one instance of 600 nodes in three
    /// blocks, three of 300 in two each, small ones in one) give the bits of the forward
    /// that keeps its weights, instance by instance.
    #[test]
    fn inference_in_row_blocks_matches_the_training_forward() {
        for (nodes, instances) in [(600, 1), (300, 3), (11, 5)] {
            let dims = Dims {
                nodes,
                heads: 2,
                head_dim: 8,
            };
            let qkv = pseudo_random(instances * nodes * 3 * dims.embed(), 13, 1.0);
            let mut weights = vec![0.0f32; weights_len(dims, instances)];
            let kept = forward(dims, &qkv, Some(&mut weights));
            assert_eq!(
                forward(dims, &qkv, None),
                kept,
                "{nodes} nodes, {instances} instances"
            );
        }
    }

    /// The encoder attention's kernels in each form ([`assert_forms_agree`]), at node
    /// counts whose rows fill 4- and 8-row blocks and leave 2 and 1, and whose padded
    /// width is less than, one, or one and a half 16-lane vectors; heads of 16 and of 8.
    #[test]
    fn every_form_gives_the_same_numbers() {
        for (nodes, heads, head_dim) in [(21, 8, 16), (11, 8, 16), (16, 8, 16), (5, 4, 8)] {
            let dims = Dims {
                nodes,
                heads,
                head_dim,
            };
            let (instances, d) = (3, heads * head_dim);
            let qkv = pseudo_random(instances * nodes * 3 * d, 7, 0.5);
            let grad_out = pseudo_random(instances * nodes * d, 8, 0.5);
            assert_forms_agree(
                &format!("{dims:?}"),
                || run::<Plain>(dims, &qkv, &grad_out),
                || run::<Fused>(dims, &qkv, &grad_out),
                || run::<Wide>(dims, &qkv, &grad_out),
            );
        }
    }
}
