//! The attention decoder's step in plain Rust over contiguous `f32` rows: the CPU
//! implementation of [`super::DecoderStepBackend`] for flex.
//!
//! Work is split by instance: an instance's S rows read its keys, and its gradient rows
//! for the keys are written by those S rows alone, so instances run in parallel (rayon)
//! without atomics and every sum is taken in the same order on any number of threads.
//!
//! Layouts (row-major, contiguous): query `[B, S, d]`; glimpse keys and values
//! `[B, N, H, dk]` (node n's d values, head-major); logit keys `[B, N, d]`; mask `[R, N]`
//! (non-zero = masked); R = B × S.

use rayon::prelude::*;

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

/// The forward pass's inputs.
pub(crate) struct Inputs<'a> {
    pub(crate) query: &'a [f32],
    pub(crate) glimpse_keys: &'a [f32],
    pub(crate) glimpse_values: &'a [f32],
    pub(crate) logit_keys: &'a [f32],
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

/// Eight lanes of partial sums, so the products vectorise instead of waiting on one
/// running sum (head dims and embeddings are multiples of 8 in every shipped model; the
/// rest is summed after).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 8;
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let split = len - len % LANES;
    let mut acc = [0.0f32; LANES];
    for (x, y) in a[..split]
        .chunks_exact(LANES)
        .zip(b[..split].chunks_exact(LANES))
    {
        for lane in 0..LANES {
            acc[lane] += x[lane] * y[lane];
        }
    }
    let mut sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in a[split..].iter().zip(&b[split..]) {
        sum += x * y;
    }
    sum
}

/// `y += alpha · x`
#[inline(always)]
fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

/// Masked softmax in place over `values` (masked entries become 0), max-subtracted as
/// Burn's own `softmax` is.
#[inline(always)]
fn masked_softmax(values: &mut [f32], mask: &[u8]) {
    let max = values
        .iter()
        .zip(mask)
        .filter(|(_, &m)| m == 0)
        .map(|(v, _)| *v)
        .fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for (v, &m) in values.iter_mut().zip(mask) {
        *v = if m == 0 { (*v - max).exp() } else { 0.0 };
        sum += *v;
    }
    for v in values.iter_mut() {
        *v /= sum;
    }
}

/// Log-probabilities `[R, N]` (−∞ at masked nodes) and what the backward pass needs.
pub(crate) fn forward(dims: Dims, scale: Scale, x: &Inputs) -> (Vec<f32>, Saved) {
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
        .for_each(|(i, (((lp, att), glimpse), tanh))| {
            let keys = &x.glimpse_keys[i * n * d..(i + 1) * n * d];
            let values = &x.glimpse_values[i * n * d..(i + 1) * n * d];
            let logit_keys = &x.logit_keys[i * n * d..(i + 1) * n * d];
            for row in 0..s {
                let r = i * s + row;
                let row_out = RowOut {
                    log_probs: &mut lp[row * n..(row + 1) * n],
                    attention: &mut att[row * h * n..(row + 1) * h * n],
                    glimpse: &mut glimpse[row * d..(row + 1) * d],
                    tanh: &mut tanh[row * n..(row + 1) * n],
                };
                let row_in = RowIn {
                    query: &x.query[r * d..(r + 1) * d],
                    mask: &x.mask[r * n..(r + 1) * n],
                    keys,
                    values,
                    logit_keys,
                };
                forward_row_dispatch(dims, scale, &row_in, row_out);
            }
        });
    (log_probs, saved)
}

/// One row's inputs: its query and mask, its instance's keys.
struct RowIn<'a> {
    query: &'a [f32],
    mask: &'a [u8],
    keys: &'a [f32],
    values: &'a [f32],
    logit_keys: &'a [f32],
}

struct RowOut<'a> {
    log_probs: &'a mut [f32],
    attention: &'a mut [f32],
    glimpse: &'a mut [f32],
    tanh: &'a mut [f32],
}

/// [`forward_row`] compiled for AVX2 and FMA, where the CPU has them.
fn forward_row_dispatch(dims: Dims, scale: Scale, x: &RowIn, out: RowOut) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { forward_row_avx2(dims, scale, x, out) };
    }
    forward_row(dims, scale, x, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn forward_row_avx2(dims: Dims, scale: Scale, x: &RowIn, out: RowOut) {
    forward_row(dims, scale, x, out)
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[inline(always)]
fn forward_row(dims: Dims, scale: Scale, x: &RowIn, out: RowOut) {
    let (n, dk, d) = (dims.nodes, dims.head_dim, dims.embed());
    // The glimpse: each head attends over the unmasked nodes.
    for head in 0..dims.heads {
        let q = &x.query[head * dk..(head + 1) * dk];
        let a = &mut out.attention[head * n..(head + 1) * n];
        for (node, a) in a.iter_mut().enumerate() {
            if x.mask[node] == 0 {
                *a = dot(q, &x.keys[node * d + head * dk..node * d + (head + 1) * dk]);
            }
        }
        masked_softmax(a, x.mask);
        let g = &mut out.glimpse[head * dk..(head + 1) * dk];
        for (node, &weight) in a.iter().enumerate() {
            if weight != 0.0 {
                axpy(weight, &x.values[node * d + head * dk..], g);
            }
        }
    }
    // Single-head logits, clipped, masked, log-softmax.
    let mut max = f32::NEG_INFINITY;
    for node in 0..n {
        out.log_probs[node] = if x.mask[node] != 0 {
            f32::NEG_INFINITY
        } else {
            let t = dot(out.glimpse, &x.logit_keys[node * d..(node + 1) * d]).tanh();
            out.tanh[node] = t;
            let z = clipped(t, scale);
            max = max.max(z);
            z
        };
    }
    let sum: f32 = out
        .log_probs
        .iter()
        .filter(|z| z.is_finite())
        .map(|z| (z - max).exp())
        .sum();
    let log_sum = max + sum.ln();
    for lp in out.log_probs.iter_mut() {
        *lp -= log_sum;
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
pub(crate) fn backward(
    dims: Dims,
    scale: Scale,
    x: &Inputs,
    log_probs: &[f32],
    saved: &Saved,
    grad_out: &[f32],
) -> Grads {
    let (n, d, s, h) = (dims.nodes, dims.embed(), dims.starts, dims.heads);
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
            let block = n * d;
            let mut scratch = vec![0.0f32; n + d];
            for row in 0..s {
                let r = i * s + row;
                let row_in = RowIn {
                    query: &x.query[r * d..(r + 1) * d],
                    mask: &x.mask[r * n..(r + 1) * n],
                    keys: &x.glimpse_keys[i * block..(i + 1) * block],
                    values: &x.glimpse_values[i * block..(i + 1) * block],
                    logit_keys: &x.logit_keys[i * block..(i + 1) * block],
                };
                let row_saved = RowSaved {
                    log_probs: &log_probs[r * n..(r + 1) * n],
                    attention: &saved.attention[r * h * n..(r + 1) * h * n],
                    glimpse: &saved.glimpse[r * d..(r + 1) * d],
                    tanh: &saved.tanh[r * n..(r + 1) * n],
                };
                let row_grads = RowGrads {
                    query: &mut dq[row * d..(row + 1) * d],
                    keys: dk,
                    values: dv,
                    logit_keys: dl,
                };
                let grad_out = &grad_out[r * n..(r + 1) * n];
                backward_row_dispatch(
                    dims,
                    scale,
                    (&row_in, &row_saved, grad_out),
                    row_grads,
                    &mut scratch,
                );
            }
        });
    grads
}

struct RowSaved<'a> {
    log_probs: &'a [f32],
    attention: &'a [f32],
    glimpse: &'a [f32],
    tanh: &'a [f32],
}

/// A row's query gradient, and its instance's key gradients (shared by its S rows).
struct RowGrads<'a> {
    query: &'a mut [f32],
    keys: &'a mut [f32],
    values: &'a mut [f32],
    logit_keys: &'a mut [f32],
}

/// A row's forward inputs, what its forward pass kept, and its output gradient.
type RowBackward<'a> = (&'a RowIn<'a>, &'a RowSaved<'a>, &'a [f32]);

/// [`backward_row`] compiled for AVX2 and FMA, where the CPU has them.
fn backward_row_dispatch(
    dims: Dims,
    scale: Scale,
    row: RowBackward,
    g: RowGrads,
    scratch: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { backward_row_avx2(dims, scale, row, g, scratch) };
    }
    backward_row(dims, scale, row, g, scratch)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn backward_row_avx2(dims: Dims, scale: Scale, row: RowBackward, g: RowGrads, scratch: &mut [f32]) {
    backward_row(dims, scale, row, g, scratch)
}

#[inline(always)]
fn backward_row(
    dims: Dims,
    scale: Scale,
    (x, saved, grad_out): RowBackward,
    g: RowGrads,
    scratch: &mut [f32],
) {
    let (n, dk, d) = (dims.nodes, dims.head_dim, dims.embed());
    let (d_logits, d_glimpse) = scratch.split_at_mut(n);
    d_glimpse.fill(0.0);
    // log_softmax: dz = g − p·Σg (the sum over every entry, as the composed form takes
    // it); masked entries get none. tanh clipping: dlogit = dz · C/T · (1 − tanh²).
    let total: f32 = grad_out.iter().sum();
    let slope = scale.tanh_clipping / scale.temperature;
    for node in 0..n {
        d_logits[node] = if x.mask[node] != 0 {
            0.0
        } else {
            let p = saved.log_probs[node].exp();
            let t = saved.tanh[node];
            (grad_out[node] - p * total) * slope * (1.0 - t * t)
        };
    }
    // logits = glimpse · logit_keys[node]
    for (node, &dlogit) in d_logits.iter().enumerate() {
        if dlogit != 0.0 {
            let row = node * d..(node + 1) * d;
            axpy(dlogit, &x.logit_keys[row.clone()], d_glimpse);
            axpy(dlogit, saved.glimpse, &mut g.logit_keys[row]);
        }
    }
    // Each head: glimpse_h = Σ a·v, a = softmax(q_h · k).
    let mut d_attention = vec![0.0f32; n];
    for head in 0..dims.heads {
        let heads = head * dk..(head + 1) * dk;
        let a = &saved.attention[head * n..(head + 1) * n];
        let dg = &d_glimpse[heads.clone()];
        let mut weighted = 0.0;
        for node in 0..n {
            let at = node * d + head * dk;
            d_attention[node] = if a[node] != 0.0 {
                axpy(a[node], dg, &mut g.values[at..at + dk]);
                dot(dg, &x.values[at..at + dk])
            } else {
                0.0
            };
            weighted += a[node] * d_attention[node];
        }
        for node in 0..n {
            let d_compat = a[node] * (d_attention[node] - weighted);
            if d_compat != 0.0 {
                let at = node * d + head * dk;
                axpy(d_compat, &x.keys[at..at + dk], &mut g.query[heads.clone()]);
                axpy(d_compat, &x.query[heads.clone()], &mut g.keys[at..at + dk]);
            }
        }
    }
}
