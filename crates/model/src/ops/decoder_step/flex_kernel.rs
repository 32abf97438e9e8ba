//! The attention decoder's step in plain Rust over contiguous `f32` rows: the CPU
//! implementation of [`super::DecoderStepBackend`] for flex.
//!
//! Work is split by instance: an instance's S rows read its keys, and its gradient rows
//! for the keys are written by those S rows alone, so instances run in parallel (rayon)
//! without atomics and every sum is taken in the same order on any number of threads.
//!
//! Layouts (row-major, contiguous): query `[B, S, d]`; glimpse keys and values
//! `[B, N, H, dk]` (node n's d values, head-major); logit keys `[B, N, d]`; the same three
//! by feature, `[B, 3d, Np]` (glimpse keys, logit keys, values; Np = N rounded up to a
//! multiple of 8, zero beyond N); mask `[R, N]` (non-zero = masked); R = B × S.
//!
//! A product of one row against every node reads the by-feature layout: `d` vector
//! updates of `Np` lanes, with no horizontal sums. The model makes it once per decode;
//! transposed here at every step it cost as much as a row's own arithmetic with one row
//! per instance (greedy decoding), and doubled the step's memory traffic.
//!
//! An instance's rows (its POMO starts) go through the products in blocks of
//! [`MulAdd::ROW_BLOCK`] (4 under AVX2, 8 under AVX-512): alone, a row keeps two or three
//! vectors of sums in flight and each multiply-add waits on the one before; a block's rows
//! share every key vector loaded and keep 12 (AVX2) or 16 (AVX-512). Each output is still
//! summed in the same order, so the block size changes no number. The forms are picked
//! per instance ([`simd_dispatch`]).

use rayon::prelude::*;

use crate::ops::row_kernels::{
    head_weighted_sums, heads_fit, kept_exp_sum, kept_max, masked_softmax_rows, padded,
    rows_in_block, simd_dispatch, weighted_sums, MulAdd, RowsAt, MAX_ROW_BLOCK,
};

/// Sizes of one step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub(crate) instances: usize,
    pub(crate) starts: usize,
    pub(crate) nodes: usize,
    pub(crate) heads: usize,
    pub(crate) head_dim: usize,
}

impl Dims {
    fn embed(&self) -> usize {
        self.heads * self.head_dim
    }

    fn rows(&self) -> usize {
        self.instances * self.starts
    }
}

/// The step's scalars: the logits are `clip · tanh(·) / temperature`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scale {
    pub(crate) tanh_clipping: f32,
    pub(crate) temperature: f32,
}

impl Scale {
    pub(crate) fn new(tanh_clipping: f32, temperature: f32) -> Self {
        Self {
            tanh_clipping,
            temperature,
        }
    }
}

/// The forward pass's inputs.
pub(crate) struct Inputs<'a> {
    pub(crate) query: &'a [f32],
    pub(crate) glimpse_keys: &'a [f32],
    pub(crate) glimpse_values: &'a [f32],
    pub(crate) logit_keys: &'a [f32],
    /// `[B, 3d, Np]`
    pub(crate) by_feature: &'a [f32],
    pub(crate) mask: &'a [u8],
}

/// What the forward pass computes, kept for the backward pass.
#[derive(Debug, Clone)]
pub(crate) struct Saved {
    /// `[R, H, N]` each head's attention weights (0 at masked nodes).
    pub(crate) attention: Vec<f32>,
    /// `[R, d]` the heads' concatenated outputs.
    pub(crate) glimpse: Vec<f32>,
    /// `[R, N]` tanh of the raw logits.
    pub(crate) tanh: Vec<f32>,
}

/// Gradients of the four float inputs, in their layouts.
pub(crate) struct Grads {
    pub(crate) query: Vec<f32>,
    pub(crate) glimpse_keys: Vec<f32>,
    pub(crate) glimpse_values: Vec<f32>,
    pub(crate) logit_keys: Vec<f32>,
}

/// tanh on eight lanes through [`MulAdd::exp8`]: 1 − 2 / (e^{2x} + 1). Absolute error
/// ~1e-7 (relative error grows as |x| → 0, where tanh does: the logits are
/// `clip · tanh`, so it is the absolute error that reaches them).
#[inline(always)]
fn tanh8<M: MulAdd>(x: &mut [f32; 8]) {
    for v in x.iter_mut() {
        *v *= 2.0;
    }
    M::exp8(x);
    for v in x.iter_mut() {
        *v = 1.0 - 2.0 / (*v + 1.0);
    }
}

/// One instance's by-feature block: `[3d, Np]`, glimpse keys, logit keys, values.
fn by_feature_block<'a>(x: &Inputs<'a>, dims: Dims, instance: usize) -> &'a [f32] {
    let len = 3 * dims.embed() * padded(dims.nodes);
    &x.by_feature[instance * len..(instance + 1) * len]
}

/// Log-probabilities `[R, N]` (−∞ at masked nodes) and what the backward pass needs.
pub(crate) fn forward(dims: Dims, scale: Scale, x: &Inputs) -> (Vec<f32>, Saved) {
    forward_with(dims, scale, x, forward_instance_dispatch)
}

/// One instance's forward pass: [`forward_instance`] in some form.
type ForwardInstance = fn(Dims, Scale, (&Inputs, usize), RowsOut);

/// [`forward`] with each instance's rows in `instance_kernel` (the tests pick each form).
fn forward_with(
    dims: Dims,
    scale: Scale,
    x: &Inputs,
    instance_kernel: ForwardInstance,
) -> (Vec<f32>, Saved) {
    let (n, h, d, s) = (dims.nodes, dims.heads, dims.embed(), dims.starts);
    let rows = dims.rows();
    let mut log_probs = vec![0.0f32; rows * n];
    let mut saved = Saved {
        attention: vec![0.0; rows * h * n],
        glimpse: vec![0.0; rows * d],
        tanh: vec![0.0; rows * n],
    };
    let per_instance = log_probs
        .par_chunks_mut(s * n)
        .zip(saved.attention.par_chunks_mut(s * h * n))
        .zip(saved.glimpse.par_chunks_mut(s * d))
        .zip(saved.tanh.par_chunks_mut(s * n));
    per_instance
        .enumerate()
        .for_each(|(i, (((log_probs, attention), glimpse), tanh))| {
            let out = RowsOut {
                log_probs,
                attention,
                glimpse,
                tanh,
            };
            instance_kernel(dims, scale, (x, i), out);
        });
    (log_probs, saved)
}

simd_dispatch! {
    /// [`forward_instance`] in the best form the CPU allows.
    fn forward_instance_dispatch => forward_instance(
        dims: Dims,
        scale: Scale,
        x: (&Inputs, usize),
        out: RowsOut,
    )
}

/// Instance `i`'s rows, in blocks of up to [`MulAdd::ROW_BLOCK`]: `out` holds its rows'
/// outputs.
#[inline(always)]
fn forward_instance<M: MulAdd>(dims: Dims, scale: Scale, (x, i): (&Inputs, usize), out: RowsOut) {
    let (n, h, d, s) = (dims.nodes, dims.heads, dims.embed(), dims.starts);
    let block = i * n * d..(i + 1) * n * d;
    let np = padded(n);
    let (keys_t, rest) = by_feature_block(x, dims, i).split_at(d * np);
    // Two [MAX_ROW_BLOCK, Np] blocks: the rows' lanes and which nodes each may choose.
    let mut lanes = vec![0.0f32; 2 * MAX_ROW_BLOCK * np];
    let instance = InstanceIn {
        keys_t,
        values: &x.glimpse_values[block],
        logit_keys_t: &rest[..d * np],
    };
    let mut row = 0;
    while row < s {
        let count = rows_in_block::<M>(s - row);
        let (r, rows) = (i * s + row, row..row + count);
        let rows_out = RowsOut {
            log_probs: &mut out.log_probs[rows.start * n..rows.end * n],
            attention: &mut out.attention[rows.start * h * n..rows.end * h * n],
            glimpse: &mut out.glimpse[rows.start * d..rows.end * d],
            tanh: &mut out.tanh[rows.start * n..rows.end * n],
        };
        let query = &x.query[r * d..(r + count) * d];
        let mask = &x.mask[r * n..(r + count) * n];
        let x = (query, mask, &instance);
        let lanes = &mut lanes;
        match count {
            8 => forward_rows::<M, 8>(dims, scale, x, rows_out, lanes),
            4 => forward_rows::<M, 4>(dims, scale, x, rows_out, lanes),
            2 => forward_rows::<M, 2>(dims, scale, x, rows_out, lanes),
            _ => forward_rows::<M, 1>(dims, scale, x, rows_out, lanes),
        }
        row += count;
    }
}

/// What a forward row reads of its instance.
struct InstanceIn<'a> {
    /// `[H·dk, Np]`
    keys_t: &'a [f32],
    /// `[N, H, dk]`
    values: &'a [f32],
    /// `[d, Np]`
    logit_keys_t: &'a [f32],
}

/// Consecutive rows' queries `[rows, d]` and masks `[rows, N]`, and their instance.
type RowsIn<'a> = (&'a [f32], &'a [u8], &'a InstanceIn<'a>);

/// Consecutive rows' outputs, each `[rows, ·]`.
struct RowsOut<'a> {
    log_probs: &'a mut [f32],
    attention: &'a mut [f32],
    glimpse: &'a mut [f32],
    tanh: &'a mut [f32],
}

/// `R` rows of one instance: the glimpse's products and the logits for all of them at
/// once, the softmaxes row by row.
#[inline(always)]
fn forward_rows<M: MulAdd, const R: usize>(
    dims: Dims,
    scale: Scale,
    (query, mask, instance): RowsIn,
    out: RowsOut,
    lanes: &mut [f32],
) {
    let (n, h, dk, d) = (dims.nodes, dims.heads, dims.head_dim, dims.embed());
    let np = padded(n);
    let (lanes, keep) = lanes.split_at_mut(MAX_ROW_BLOCK * np);
    for r in 0..R {
        let keep = &mut keep[r * np..(r + 1) * np];
        for (k, &m) in keep.iter_mut().zip(&mask[r * n..(r + 1) * n]) {
            *k = if m == 0 { 1.0 } else { 0.0 };
        }
        keep[n..].fill(0.0);
    }
    let lane_rows = |count| RowsAt::contiguous(d, count, np);
    // The glimpse: each head attends over the unmasked nodes. A row alone takes its
    // heads' weighted values together, after every head's softmax: one head's sums are
    // only dk / 8 vectors, each multiply-add waiting on the one before.
    let heads_together = R == 1 && heads_fit(dk);
    for head in 0..h {
        let keys = &instance.keys_t[head * dk * np..];
        weighted_sums::<M, R>(&query[head * dk..], keys, (np, np), lane_rows(dk), lanes);
        let attention = &mut out.attention[head * n..];
        masked_softmax_rows::<M, R>((lanes, keep), np, attention, (n, h * n));
        if heads_together {
            continue;
        }
        let by_attention = RowsAt::contiguous(h * n, n, d);
        let values = &instance.values[head * dk..];
        let attention = &out.attention[head * n..];
        let glimpse = &mut out.glimpse[head * dk..];
        weighted_sums::<M, R>(attention, values, (d, dk), by_attention, glimpse);
    }
    if heads_together {
        head_weighted_sums::<M>(out.attention, instance.values, (n, h, dk), out.glimpse);
    }
    // Single-head logits, clipped, masked, log-softmax, over the padded lanes.
    let logit_keys = instance.logit_keys_t;
    weighted_sums::<M, R>(out.glimpse, logit_keys, (np, np), lane_rows(d), lanes);
    for r in 0..R {
        let row_lanes = &mut lanes[r * np..(r + 1) * np];
        let row_out = (
            &mut out.tanh[r * n..(r + 1) * n],
            &mut out.log_probs[r * n..(r + 1) * n],
        );
        let row_mask = (&mask[r * n..(r + 1) * n], &keep[r * np..(r + 1) * np]);
        log_softmax_row::<M>(scale, row_lanes, row_mask, row_out);
    }
}

/// A row's logits from its raw products: tanh (kept), clipped, masked, log-softmax.
#[inline(always)]
fn log_softmax_row<M: MulAdd>(
    scale: Scale,
    lanes: &mut [f32],
    (mask, keep): (&[u8], &[f32]),
    (tanh, log_probs): (&mut [f32], &mut [f32]),
) {
    let n = mask.len();
    for z in lanes.chunks_exact_mut(8) {
        tanh8::<M>(z.try_into().expect("8 lanes"));
    }
    tanh.copy_from_slice(&lanes[..n]);
    for z in lanes.iter_mut() {
        *z = clipped(*z, scale);
    }
    log_probs.copy_from_slice(&lanes[..n]);
    let max = kept_max::<M>(lanes, keep);
    let log_sum = max + kept_exp_sum::<M>(lanes, max, keep).ln();
    for (lp, &m) in log_probs.iter_mut().zip(mask) {
        *lp = if m == 0 {
            *lp - log_sum
        } else {
            f32::NEG_INFINITY
        };
    }
}

/// `clip · tanh / temperature`, in the order the op-by-op form computes it.
fn clipped(t: f32, scale: Scale) -> f32 {
    let z = t * scale.tanh_clipping;
    if scale.temperature == 1.0 {
        z
    } else {
        z / scale.temperature
    }
}

/// Gradients of every float input from the gradient of the log-probabilities.
///
/// Per instance, rows in blocks of [`MulAdd::ROW_BLOCK`]: each row computes its own query
/// gradient and keeps, in `[S, ·]` tables, the logit and compatibility gradients the
/// instance's key, value and logit-key gradients need; those are then summed over the
/// rows in registers, a block of nodes at a time (each node's coefficients a column of
/// the tables, read in place), and written once per node (no read-modify-write per row),
/// in row order.
pub(crate) fn backward(
    dims: Dims,
    scale: Scale,
    x: &Inputs,
    log_probs: &[f32],
    saved: &Saved,
    grad_out: &[f32],
) -> Grads {
    let from = BackIn {
        x,
        log_probs,
        saved,
        grad_out,
    };
    backward_with(dims, scale, &from, backward_instance_dispatch)
}

/// One instance's backward pass: [`backward_instance`] in some form.
type BackwardInstance = fn(Dims, Scale, (&BackIn, usize), InstanceGradsOut);

/// [`backward`] with each instance in `instance_kernel` (the tests pick each form).
fn backward_with(
    dims: Dims,
    scale: Scale,
    from: &BackIn,
    instance_kernel: BackwardInstance,
) -> Grads {
    let (n, d, s) = (dims.nodes, dims.embed(), dims.starts);
    let mut grads = Grads {
        query: vec![0.0; dims.rows() * d],
        glimpse_keys: vec![0.0; dims.instances * n * d],
        glimpse_values: vec![0.0; dims.instances * n * d],
        logit_keys: vec![0.0; dims.instances * n * d],
    };
    let per_instance = grads
        .query
        .par_chunks_mut(s * d)
        .zip(grads.glimpse_keys.par_chunks_mut(n * d))
        .zip(grads.glimpse_values.par_chunks_mut(n * d))
        .zip(grads.logit_keys.par_chunks_mut(n * d));
    per_instance
        .enumerate()
        .for_each(|(i, (((dq, dk), dv), dl))| {
            instance_kernel(dims, scale, (from, i), (dq, dk, dv, dl));
        });
    grads
}

/// What the backward pass reads: the forward pass's inputs, outputs and saved values, and
/// the gradient of its outputs.
struct BackIn<'a> {
    x: &'a Inputs<'a>,
    log_probs: &'a [f32],
    saved: &'a Saved,
    grad_out: &'a [f32],
}

/// Instance `i`'s gradients `(query, keys, values, logit keys)`, each its own block.
type InstanceGradsOut<'a> = (&'a mut [f32], &'a mut [f32], &'a mut [f32], &'a mut [f32]);

simd_dispatch! {
    /// [`backward_instance`] in the best form the CPU allows.
    fn backward_instance_dispatch => backward_instance(
        dims: Dims,
        scale: Scale,
        from: (&BackIn, usize),
        out: InstanceGradsOut,
    )
}

/// Instance `i`'s rows, in blocks of up to [`MulAdd::ROW_BLOCK`], then the gradients of
/// what its rows share.
#[inline(always)]
fn backward_instance<M: MulAdd>(
    dims: Dims,
    scale: Scale,
    (from, i): (&BackIn, usize),
    (dq, dk, dv, dl): InstanceGradsOut,
) {
    let (n, d, s, h) = (dims.nodes, dims.embed(), dims.starts, dims.heads);
    let (x, saved) = (from.x, from.saved);
    let block = i * n * d..(i + 1) * n * d;
    let mut scratch = BackScratch::new(dims);
    let instance = InstanceBack {
        values_t: &by_feature_block(x, dims, i)[2 * d * padded(n)..],
        keys: &x.glimpse_keys[block.clone()],
        logit_keys: &x.logit_keys[block],
        query: &x.query[i * s * d..(i + 1) * s * d],
        glimpse: &saved.glimpse[i * s * d..(i + 1) * s * d],
        attention: &saved.attention[i * s * h * n..(i + 1) * s * h * n],
    };
    let mut row = 0;
    while row < s {
        let count = rows_in_block::<M>(s - row);
        let r = (i * s + row)..(i * s + row + count);
        let rows_saved = RowSaved {
            mask: &x.mask[r.start * n..r.end * n],
            log_probs: &from.log_probs[r.start * n..r.end * n],
            attention: &saved.attention[r.start * h * n..r.end * h * n],
            tanh: &saved.tanh[r.start * n..r.end * n],
            grad_out: &from.grad_out[r.start * n..r.end * n],
        };
        let query = &mut dq[row * d..(row + count) * d];
        let rows = (row, &rows_saved, &instance);
        let scratch = &mut scratch;
        match count {
            8 => backward_rows::<M, 8>(dims, scale, rows, query, scratch),
            4 => backward_rows::<M, 4>(dims, scale, rows, query, scratch),
            2 => backward_rows::<M, 2>(dims, scale, rows, query, scratch),
            _ => backward_rows::<M, 1>(dims, scale, rows, query, scratch),
        }
        row += count;
    }
    instance_grads::<M>(dims, &instance, &scratch, (dk, dv, dl));
}

/// What a backward row reads of its instance.
struct InstanceBack<'a> {
    /// `[H·dk, Np]` values, node-minor.
    values_t: &'a [f32],
    /// `[N, H, dk]`
    keys: &'a [f32],
    /// `[N, d]`
    logit_keys: &'a [f32],
    /// `[S, d]` the instance's rows' queries.
    query: &'a [f32],
    /// `[S, d]` the instance's rows' glimpses.
    glimpse: &'a [f32],
    /// `[S, H, N]` the instance's rows' attention weights.
    attention: &'a [f32],
}

/// An instance's working memory in the backward pass.
struct BackScratch {
    /// `[MAX_ROW_BLOCK, Np]` the block's rows' attention gradients for one head.
    lanes: Vec<f32>,
    /// `[Np]` one row's probabilities.
    probs: Vec<f32>,
    /// `[S, d]` each row's glimpse gradient.
    d_glimpse: Vec<f32>,
    /// `[S, N]` each row's logit gradients.
    d_logits: Vec<f32>,
    /// `[S, H, N]` each row's compatibility gradients.
    d_compat: Vec<f32>,
}

impl BackScratch {
    fn new(dims: Dims) -> Self {
        let (n, d, s, h) = (dims.nodes, dims.embed(), dims.starts, dims.heads);
        let np = padded(n);
        Self {
            lanes: vec![0.0; MAX_ROW_BLOCK * np],
            probs: vec![0.0; np],
            d_glimpse: vec![0.0; s * d],
            d_logits: vec![0.0; s * n],
            d_compat: vec![0.0; s * h * n],
        }
    }
}

/// Consecutive rows' masks, what their forward pass kept, and their output gradients,
/// each `[rows, ·]`.
struct RowSaved<'a> {
    mask: &'a [u8],
    log_probs: &'a [f32],
    attention: &'a [f32],
    tanh: &'a [f32],
    grad_out: &'a [f32],
}

/// The first row's index within its instance, the rows' saved values, and their instance.
type RowBack<'a> = (usize, &'a RowSaved<'a>, &'a InstanceBack<'a>);

/// `R` consecutive rows: their query gradients, and their rows of the instance's logit and
/// compatibility gradients. Each head's attention gradients are one product of the `R`
/// rows' glimpse gradients against the values (they share them); the rest goes row by row.
#[inline(always)]
fn backward_rows<M: MulAdd, const R: usize>(
    dims: Dims,
    scale: Scale,
    (first, x, instance): RowBack,
    d_query: &mut [f32],
    scratch: &mut BackScratch,
) {
    let (n, h, dk, d) = (dims.nodes, dims.heads, dims.head_dim, dims.embed());
    let np = padded(n);
    for r in 0..R {
        logit_grads_row::<M>(dims, scale, (first + r, r, x), scratch);
    }
    let BackScratch {
        lanes,
        d_glimpse,
        d_compat,
        d_logits,
        ..
    } = scratch;
    // logits = glimpse · logit_keys[node]: the rows' glimpse gradients in one product
    // against the logit keys they share.
    let from_logits = RowsAt::contiguous(n, n, d);
    let dg_rows = &mut d_glimpse[first * d..(first + R) * d];
    let logit_keys = instance.logit_keys;
    weighted_sums::<M, R>(
        &d_logits[first * n..],
        logit_keys,
        (d, d),
        from_logits,
        dg_rows,
    );
    let from_glimpse = RowsAt::contiguous(d, dk, np);
    // Each head: glimpse_h = Σ a·v, a = softmax(q_h · k).
    for head in 0..h {
        // d_attention[node] = dg · v[node], for every node and row at once.
        let dg = &d_glimpse[first * d + head * dk..];
        let values = &instance.values_t[head * dk * np..];
        weighted_sums::<M, R>(dg, values, (np, np), from_glimpse, lanes);
        for r in 0..R {
            let attention = &x.attention[(r * h + head) * n..][..n];
            let da = &lanes[r * np..][..n];
            // Σ a·da, in node order.
            let weighted = (attention.iter().zip(da)).fold(0.0, |w, (&a, &da)| w + a * da);
            // d_compat = a·(da − Σ a·da).
            let row_compat = &mut d_compat[((first + r) * h + head) * n..][..n];
            for ((c, &a), &da) in row_compat.iter_mut().zip(attention).zip(da) {
                *c = a * (da - weighted);
            }
        }
        // The rows' query gradients (only this head writes these lanes): one product
        // of the block's rows against the keys they share.
        let keys = &instance.keys[head * dk..];
        let from_compat = RowsAt::contiguous(h * n, n, d);
        let compat = &d_compat[(first * h + head) * n..];
        weighted_sums::<M, R>(
            compat,
            keys,
            (d, dk),
            from_compat,
            &mut d_query[head * dk..],
        );
    }
}

/// One row's logit gradients, in its row of `d_logits`: `(row within the instance, row
/// within the block, the block)`.
#[inline(always)]
fn logit_grads_row<M: MulAdd>(
    dims: Dims,
    scale: Scale,
    (row, r, x): (usize, usize, &RowSaved),
    scratch: &mut BackScratch,
) {
    let n = dims.nodes;
    let (mask, log_probs) = (&x.mask[r * n..][..n], &x.log_probs[r * n..][..n]);
    let (tanh, grad_out) = (&x.tanh[r * n..][..n], &x.grad_out[r * n..][..n]);
    let probs = &mut scratch.probs;
    probs[..n].copy_from_slice(log_probs);
    probs[n..].fill(0.0);
    for p in probs.chunks_exact_mut(8) {
        M::exp8_unfused(p.try_into().expect("8 lanes"));
    }
    // log_softmax: dz = g − p·Σg (the sum over every entry, as the composed form takes
    // it); masked entries get none. tanh clipping: dlogit = dz · C/T · (1 − tanh²).
    let total: f32 = grad_out.iter().sum();
    let slope = scale.tanh_clipping / scale.temperature;
    let d_logits = &mut scratch.d_logits[row * n..][..n];
    for (node, d_logit) in d_logits.iter_mut().enumerate() {
        *d_logit = if mask[node] != 0 {
            0.0
        } else {
            let t = tanh[node];
            (grad_out[node] - probs[node] * total) * slope * (1.0 - t * t)
        };
    }
}

/// The instance's key, value and logit-key gradients: `[N, H, dk]`, `[N, H, dk]`, `[N, d]`.
type InstanceGrads<'a> = (&'a mut [f32], &'a mut [f32], &'a mut [f32]);

/// Sums over the instance's rows, [`MulAdd::ROW_BLOCK`] nodes at a time (they share the
/// rows' glimpses, queries and glimpse gradients): logit keys from the logit gradients
/// and glimpses, values from the attention weights and glimpse gradients, keys from the
/// compatibility gradients and queries. Each output is written once, summed over the rows
/// in row order (a zero coefficient adds an exact zero).
#[inline(always)]
fn instance_grads<M: MulAdd>(
    dims: Dims,
    instance: &InstanceBack,
    scratch: &BackScratch,
    out: InstanceGrads,
) {
    let mut node = 0;
    while node < dims.nodes {
        let count = rows_in_block::<M>(dims.nodes - node);
        let out = (&mut *out.0, &mut *out.1, &mut *out.2);
        match count {
            8 => instance_grads_nodes::<M, 8>(dims, instance, scratch, out, node),
            4 => instance_grads_nodes::<M, 4>(dims, instance, scratch, out, node),
            2 => instance_grads_nodes::<M, 2>(dims, instance, scratch, out, node),
            _ => instance_grads_nodes::<M, 1>(dims, instance, scratch, out, node),
        }
        node += count;
    }
}

/// [`instance_grads`] for nodes `first..first + R`: each node's coefficients are a
/// column of a `[S, ·]` table, read in place.
#[inline(always)]
fn instance_grads_nodes<M: MulAdd, const R: usize>(
    dims: Dims,
    instance: &InstanceBack,
    scratch: &BackScratch,
    (d_keys, d_values, d_logit_keys): InstanceGrads,
    first: usize,
) {
    let (n, h, dk, d, s) = (
        dims.nodes,
        dims.heads,
        dims.head_dim,
        dims.embed(),
        dims.starts,
    );
    let at = first * d;
    let over_rows = |row_length| RowsAt {
        coef_stride: 1,
        coef_step: row_length,
        count: s,
        out_stride: d,
    };
    let d_logits = &scratch.d_logits[first..];
    let out = &mut d_logit_keys[at..];
    weighted_sums::<M, R>(d_logits, instance.glimpse, (d, d), over_rows(n), out);
    for head in 0..h {
        let column = head * n + first;
        let out = at + head * dk;
        let d_glimpse = &scratch.d_glimpse[head * dk..];
        let attention = &instance.attention[column..];
        let values_out = &mut d_values[out..];
        weighted_sums::<M, R>(attention, d_glimpse, (d, dk), over_rows(h * n), values_out);
        let query = &instance.query[head * dk..];
        let d_compat = &scratch.d_compat[column..];
        weighted_sums::<M, R>(
            d_compat,
            query,
            (d, dk),
            over_rows(h * n),
            &mut d_keys[out..],
        );
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::row_kernels::{assert_forms_agree, Fused, NamedOutputs, Plain, Wide};
    use crate::test_support::pseudo_random;

    /// A step's inputs and output gradient, fixed pseudo-random values; every third node
    /// of the flattened `[R, N]` mask is masked.
    struct StepData {
        dims: Dims,
        query: Vec<f32>,
        keys: Vec<f32>,
        values: Vec<f32>,
        logit_keys: Vec<f32>,
        by_feature: Vec<f32>,
        mask: Vec<u8>,
        grad_out: Vec<f32>,
    }

    impl StepData {
        fn new(dims: Dims) -> Self {
            let (rows, n, d, b) = (dims.rows(), dims.nodes, dims.embed(), dims.instances);
            let query = pseudo_random(rows * d, 1, 0.5);
            let keys = pseudo_random(b * n * d, 2, 0.125);
            let values = pseudo_random(b * n * d, 3, 0.5);
            let logit_keys = pseudo_random(b * n * d, 4, 0.05);
            let mask: Vec<u8> = (0..rows * n).map(|i| u8::from(i % 3 == 1)).collect();
            // [B, 3d, Np]: each instance's three [N, d] blocks, by feature.
            let np = padded(n);
            let mut by_feature = vec![0.0f32; b * 3 * d * np];
            for (i, out) in by_feature.chunks_exact_mut(3 * d * np).enumerate() {
                for (part, source) in [&keys, &logit_keys, &values].into_iter().enumerate() {
                    for node in 0..n {
                        for f in 0..d {
                            out[(part * d + f) * np + node] = source[(i * n + node) * d + f];
                        }
                    }
                }
            }
            let grad_out = pseudo_random(rows * n, 5, 0.5);
            Self {
                dims,
                query,
                keys,
                values,
                logit_keys,
                by_feature,
                mask,
                grad_out,
            }
        }

        fn inputs(&self) -> Inputs<'_> {
            Inputs {
                query: &self.query,
                glimpse_keys: &self.keys,
                glimpse_values: &self.values,
                logit_keys: &self.logit_keys,
                by_feature: &self.by_feature,
                mask: &self.mask,
            }
        }

        /// The forward and backward pass with each instance in the given kernels: the
        /// log-probabilities, then every saved value and gradient, in one list.
        fn run(&self, kernels: (ForwardInstance, BackwardInstance)) -> NamedOutputs {
            let (dims, scale, x) = (self.dims, Scale::new(10.0, 1.0), self.inputs());
            let (log_probs, saved) = forward_with(dims, scale, &x, kernels.0);
            let from = BackIn {
                x: &x,
                log_probs: &log_probs,
                saved: &saved,
                grad_out: &self.grad_out,
            };
            let grads = backward_with(dims, scale, &from, kernels.1);
            vec![
                ("attention", saved.attention),
                ("glimpse", saved.glimpse),
                ("tanh", saved.tanh),
                ("log_probs", log_probs),
                ("d_query", grads.query),
                ("d_keys", grads.glimpse_keys),
                ("d_values", grads.glimpse_values),
                ("d_logit_keys", grads.logit_keys),
            ]
        }
    }

    /// Each form of the kernels run whole, forward and backward ([`assert_forms_agree`]):
    /// `Wide` has 8-row blocks and 16-lane sums, `Fused` 4-row blocks and 8-lane sums. Row
    /// counts that leave blocks of 8, 4, 2 and 1, and one row per instance (the heads
    /// summed together); node counts whose padded width is one 16-lane vector, one and a
    /// half, or less.
    #[test]
    fn every_form_gives_the_same_numbers() {
        for (instances, starts, nodes) in
            [(3, 20, 21), (2, 7, 11), (3, 1, 21), (2, 15, 16), (2, 3, 5)]
        {
            let dims = Dims {
                instances,
                starts,
                nodes,
                heads: 8,
                head_dim: 16,
            };
            let data = StepData::new(dims);
            assert_forms_agree(
                &format!("{dims:?}"),
                || data.run((forward_instance::<Plain>, backward_instance::<Plain>)),
                || data.run((forward_instance::<Fused>, backward_instance::<Fused>)),
                || data.run((forward_instance::<Wide>, backward_instance::<Wide>)),
            );
        }
    }

    /// One POMO-sized step (64 instances × 20 starts, 21 nodes, d = 128, 8 heads), forward
    /// and backward, for counting instructions:
    /// `RAYON_NUM_THREADS=1 valgrind --tool=callgrind TEST_BINARY --ignored pomo_sized_step`.
    #[test]
    #[ignore = "a profiling harness, not a check"]
    fn pomo_sized_step() {
        let dims = Dims {
            instances: 64,
            starts: 20,
            nodes: 21,
            heads: 8,
            head_dim: 16,
        };
        let data = StepData::new(dims);
        let (inputs, scale) = (data.inputs(), Scale::new(10.0, 1.0));
        // ROUTEBURN_STEP_REPEATS=K runs the step K times and prints each pass's mean time.
        let repeats = std::env::var("ROUTEBURN_STEP_REPEATS").map_or(1, |k| k.parse().unwrap());
        let (mut forward_time, mut backward_time) = (0.0, 0.0);
        for _ in 0..repeats {
            let clock = std::time::Instant::now();
            let (log_probs, saved) = forward(dims, scale, &inputs);
            forward_time += clock.elapsed().as_secs_f64();
            let clock = std::time::Instant::now();
            let grads = backward(dims, scale, &inputs, &log_probs, &saved, &data.grad_out);
            backward_time += clock.elapsed().as_secs_f64();
            assert!(grads.glimpse_keys.iter().all(|g| g.is_finite()));
        }
        let ms = |t: f64| 1e3 * t / repeats as f64;
        println!(
            "forward {:.3} ms, backward {:.3} ms",
            ms(forward_time),
            ms(backward_time)
        );
    }
}
