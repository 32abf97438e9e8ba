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

/// How a multiply-add is computed: fused where the CPU has FMA (the AVX2 path), else a
/// product and a sum (a software `fmaf` would be far slower).
trait MulAdd {
    fn mul_add(a: f32, b: f32, c: f32) -> f32;
}

struct Fused;
struct Plain;

impl MulAdd for Fused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

impl MulAdd for Plain {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// `y += alpha · x` in whole 8-lane chunks (every length here is a multiple of 8 but the
/// odd head size), so each chunk is one vector multiply-add.
#[inline(always)]
fn axpy<M: MulAdd>(alpha: f32, x: &[f32], y: &mut [f32]) {
    let len = x.len().min(y.len());
    let (x, y) = (&x[..len], &mut y[..len]);
    let split = len - len % 8;
    let (y_main, y_rest) = y.split_at_mut(split);
    for (y, x) in y_main.chunks_exact_mut(8).zip(x.chunks_exact(8)) {
        let y: &mut [f32; 8] = y.try_into().expect("8 lanes");
        let x: &[f32; 8] = x.try_into().expect("8 lanes");
        // One 8-lane value: the loop vectoriser would keep only multiples of 64 lanes
        // in vectors and do the rest (every head-sized update) lane by lane.
        let mut v = *y;
        for lane in 0..8 {
            v[lane] = M::mul_add(x[lane], alpha, v[lane]);
        }
        *y = v;
    }
    for (y, x) in y_rest.iter_mut().zip(&x[split..]) {
        *y = M::mul_add(*x, alpha, *y);
    }
}

/// `out[..width] = Σ_k coefs[k] · rows[k·stride ..][..width]`, skipping zero
/// coefficients (masked nodes). The sums stay in registers, four 8-lane vectors at a
/// time, so consecutive multiply-adds wait on no store; lanes past a multiple of 8 are
/// summed one by one.
#[inline(always)]
fn weighted_sum<M: MulAdd>(
    coefs: &[f32],
    rows: &[f32],
    stride: usize,
    width: usize,
    out: &mut [f32],
) {
    let vectors = width / 8;
    let mut start = 0;
    for _ in 0..vectors / 4 {
        weighted_block::<M, 4>(coefs, rows, stride, start, out);
        start += 32;
    }
    match vectors % 4 {
        3 => weighted_block::<M, 3>(coefs, rows, stride, start, out),
        2 => weighted_block::<M, 2>(coefs, rows, stride, start, out),
        1 => weighted_block::<M, 1>(coefs, rows, stride, start, out),
        _ => {}
    }
    for lane in vectors * 8..width {
        out[lane] = coefs.iter().enumerate().fold(0.0, |acc, (k, &c)| {
            M::mul_add(rows[k * stride + lane], c, acc)
        });
    }
}

#[inline(always)]
fn weighted_block<M: MulAdd, const B: usize>(
    coefs: &[f32],
    rows: &[f32],
    stride: usize,
    start: usize,
    out: &mut [f32],
) {
    let mut acc = [[0.0f32; 8]; B];
    for (k, &c) in coefs.iter().enumerate() {
        if c == 0.0 {
            continue;
        }
        let row = &rows[k * stride + start..k * stride + start + 8 * B];
        for (b, acc) in acc.iter_mut().enumerate() {
            for lane in 0..8 {
                acc[lane] = M::mul_add(row[b * 8 + lane], c, acc[lane]);
            }
        }
    }
    for (b, acc) in acc.iter().enumerate() {
        out[start + b * 8..start + b * 8 + 8].copy_from_slice(acc);
    }
}

/// e^x for f32, written so a loop of it vectorises (glibc's `expf` is a call per
/// element, and exponentials were half of the forward pass): x = k·ln 2 + r with
/// |r| ≤ ln 2 / 2, e^r by its Taylor polynomial to degree 7 (truncation below 1e-8
/// relative), 2^k from the exponent bits. Arguments below −87 (−∞ included) give
/// ~1e-38, not 0: callers that need exact zeros (masked nodes) set them.
#[inline(always)]
fn exp_lane(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding and subtracting 1.5·2²³ rounds to the nearest integer without a libm call.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let k = (x * LOG2_E + ROUND) - ROUND;
    let r = (x - k * LN2_HI) - k * LN2_LO;
    let mut p = 1.0 / 5040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * r + c;
    }
    p * f32::from_bits(((k as i32 + 127) << 23) as u32)
}

/// Masked softmax in place over `values` (masked entries become 0), max-subtracted as
/// Burn's own `softmax` is.
#[inline(always)]
fn masked_softmax(values: &mut [f32], mask: &[u8]) {
    let mut max = f32::NEG_INFINITY;
    for (&v, &m) in values.iter().zip(mask) {
        // A compare and select, not `f32::max` and its NaN rule (a NaN shows anyway).
        max = if m == 0 && v > max { v } else { max };
    }
    for v in values.iter_mut() {
        *v = exp_lane(*v - max);
    }
    let mut sum = 0.0;
    for (v, &m) in values.iter_mut().zip(mask) {
        if m != 0 {
            *v = 0.0;
        }
        sum += *v;
    }
    let inverse = 1.0 / sum;
    for v in values.iter_mut() {
        *v *= inverse;
    }
}

/// Node counts padded to whole 8-lane vectors.
fn padded(nodes: usize) -> usize {
    nodes.div_ceil(8) * 8
}

/// One instance's `[N, C]` block (node-major) as `[C, Np]` (feature-major, zero-padded
/// to `Np` nodes): a product of one row against every node is then `C` vector updates of
/// `Np` lanes, with no horizontal sums.
fn transpose_padded(block: &[f32], nodes: usize, features: usize, out: &mut [f32]) {
    let np = padded(nodes);
    out.fill(0.0);
    for (node, row) in block.chunks_exact(features).take(nodes).enumerate() {
        for (f, &v) in row.iter().enumerate() {
            out[f * np + node] = v;
        }
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
            let block = i * n * d..(i + 1) * n * d;
            let np = padded(n);
            // [H·dk, Np] keys and [d, Np] logit keys, then one [Np] scratch row.
            let mut scratch = vec![0.0f32; 2 * d * np + np];
            let (keys_t, rest) = scratch.split_at_mut(d * np);
            let (logit_keys_t, lanes) = rest.split_at_mut(d * np);
            transpose_padded(&x.glimpse_keys[block.clone()], n, d, keys_t);
            transpose_padded(&x.logit_keys[block.clone()], n, d, logit_keys_t);
            let instance = InstanceIn {
                keys_t,
                values: &x.glimpse_values[block],
                logit_keys_t,
            };
            for row in 0..s {
                let r = i * s + row;
                let row_out = RowOut {
                    log_probs: &mut lp[row * n..(row + 1) * n],
                    attention: &mut att[row * h * n..(row + 1) * h * n],
                    glimpse: &mut glimpse[row * d..(row + 1) * d],
                    tanh: &mut tanh[row * n..(row + 1) * n],
                };
                let query = &x.query[r * d..(r + 1) * d];
                let mask = &x.mask[r * n..(r + 1) * n];
                forward_row_dispatch(dims, scale, (query, mask, &instance), row_out, lanes);
            }
        });
    (log_probs, saved)
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

/// A row's query and mask, and its instance.
type RowIn<'a> = (&'a [f32], &'a [u8], &'a InstanceIn<'a>);

struct RowOut<'a> {
    log_probs: &'a mut [f32],
    attention: &'a mut [f32],
    glimpse: &'a mut [f32],
    tanh: &'a mut [f32],
}

/// [`forward_row`] compiled for AVX2 and FMA, where the CPU has them.
fn forward_row_dispatch(dims: Dims, scale: Scale, x: RowIn, out: RowOut, lanes: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { forward_row_avx2(dims, scale, x, out, lanes) };
    }
    forward_row::<Plain>(dims, scale, x, out, lanes)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn forward_row_avx2(dims: Dims, scale: Scale, x: RowIn, out: RowOut, lanes: &mut [f32]) {
    forward_row::<Fused>(dims, scale, x, out, lanes)
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[inline(always)]
fn forward_row<M: MulAdd>(
    dims: Dims,
    scale: Scale,
    (query, mask, instance): RowIn,
    out: RowOut,
    lanes: &mut [f32],
) {
    let (n, dk, d) = (dims.nodes, dims.head_dim, dims.embed());
    let np = padded(n);
    // The glimpse: each head attends over the unmasked nodes.
    for head in 0..dims.heads {
        let keys = &instance.keys_t[head * dk * np..];
        weighted_sum::<M>(&query[head * dk..(head + 1) * dk], keys, np, np, lanes);
        let a = &mut out.attention[head * n..(head + 1) * n];
        a.copy_from_slice(&lanes[..n]);
        masked_softmax(a, mask);
        let g = &mut out.glimpse[head * dk..(head + 1) * dk];
        weighted_sum::<M>(a, &instance.values[head * dk..], d, dk, g);
    }
    // Single-head logits, clipped, masked, log-softmax.
    weighted_sum::<M>(out.glimpse, instance.logit_keys_t, np, np, lanes);
    let mut max = f32::NEG_INFINITY;
    for node in 0..n {
        out.log_probs[node] = if mask[node] != 0 {
            f32::NEG_INFINITY
        } else {
            let t = lanes[node].tanh();
            out.tanh[node] = t;
            let z = clipped(t, scale);
            max = max.max(z);
            z
        };
    }
    let sum: f32 = out
        .log_probs
        .iter()
        .zip(mask)
        .map(|(z, &m)| if m == 0 { exp_lane(z - max) } else { 0.0 })
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
            let block = i * n * d..(i + 1) * n * d;
            let np = padded(n);
            // [H·dk, Np] values, then scratch for a row's logit and glimpse gradients.
            let mut scratch = vec![0.0f32; d * np + np + 2 * n + d];
            let (values_t, rest) = scratch.split_at_mut(d * np);
            transpose_padded(&x.glimpse_values[block.clone()], n, d, values_t);
            let instance = InstanceBack {
                keys: &x.glimpse_keys[block.clone()],
                values_t,
                logit_keys: &x.logit_keys[block],
            };
            for row in 0..s {
                let r = i * s + row;
                let row_saved = RowSaved {
                    query: &x.query[r * d..(r + 1) * d],
                    mask: &x.mask[r * n..(r + 1) * n],
                    log_probs: &log_probs[r * n..(r + 1) * n],
                    attention: &saved.attention[r * h * n..(r + 1) * h * n],
                    glimpse: &saved.glimpse[r * d..(r + 1) * d],
                    tanh: &saved.tanh[r * n..(r + 1) * n],
                    grad_out: &grad_out[r * n..(r + 1) * n],
                };
                let row_grads = RowGrads {
                    query: &mut dq[row * d..(row + 1) * d],
                    keys: dk,
                    values: dv,
                    logit_keys: dl,
                };
                backward_row_dispatch(dims, scale, (&row_saved, &instance), row_grads, rest);
            }
        });
    grads
}

/// What a backward row reads of its instance.
struct InstanceBack<'a> {
    /// `[N, H, dk]`
    keys: &'a [f32],
    /// `[H·dk, Np]`
    values_t: &'a [f32],
    /// `[N, d]`
    logit_keys: &'a [f32],
}

/// A row's inputs, what its forward pass kept, and its output gradient.
struct RowSaved<'a> {
    query: &'a [f32],
    mask: &'a [u8],
    log_probs: &'a [f32],
    attention: &'a [f32],
    glimpse: &'a [f32],
    tanh: &'a [f32],
    grad_out: &'a [f32],
}

/// A row's query gradient, and its instance's key gradients (shared by its S rows).
struct RowGrads<'a> {
    query: &'a mut [f32],
    keys: &'a mut [f32],
    values: &'a mut [f32],
    logit_keys: &'a mut [f32],
}

type RowBack<'a> = (&'a RowSaved<'a>, &'a InstanceBack<'a>);

/// [`backward_row`] compiled for AVX2 and FMA, where the CPU has them.
fn backward_row_dispatch(dims: Dims, scale: Scale, row: RowBack, g: RowGrads, scratch: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { backward_row_avx2(dims, scale, row, g, scratch) };
    }
    backward_row::<Plain>(dims, scale, row, g, scratch)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn backward_row_avx2(dims: Dims, scale: Scale, row: RowBack, g: RowGrads, scratch: &mut [f32]) {
    backward_row::<Fused>(dims, scale, row, g, scratch)
}

#[inline(always)]
fn backward_row<M: MulAdd>(
    dims: Dims,
    scale: Scale,
    (x, instance): RowBack,
    g: RowGrads,
    scratch: &mut [f32],
) {
    let (n, dk, d) = (dims.nodes, dims.head_dim, dims.embed());
    let np = padded(n);
    let (lanes, rest) = scratch.split_at_mut(np);
    let (d_logits, rest) = rest.split_at_mut(n);
    let (d_glimpse, d_compat) = rest.split_at_mut(d);
    // log_softmax: dz = g − p·Σg (the sum over every entry, as the composed form takes
    // it); masked entries get none. tanh clipping: dlogit = dz · C/T · (1 − tanh²).
    let total: f32 = x.grad_out.iter().sum();
    let slope = scale.tanh_clipping / scale.temperature;
    for (node, d_logit) in d_logits.iter_mut().enumerate() {
        *d_logit = if x.mask[node] != 0 {
            0.0
        } else {
            let p = exp_lane(x.log_probs[node]);
            let t = x.tanh[node];
            (x.grad_out[node] - p * total) * slope * (1.0 - t * t)
        };
    }
    // logits = glimpse · logit_keys[node]
    weighted_sum::<M>(d_logits, instance.logit_keys, d, d, d_glimpse);
    for (node, &dlogit) in d_logits.iter().enumerate() {
        if dlogit != 0.0 {
            axpy::<M>(
                dlogit,
                x.glimpse,
                &mut g.logit_keys[node * d..(node + 1) * d],
            );
        }
    }
    // Each head: glimpse_h = Σ a·v, a = softmax(q_h · k).
    for head in 0..dims.heads {
        let heads = head * dk..(head + 1) * dk;
        let a = &x.attention[head * n..(head + 1) * n];
        let dg = &d_glimpse[heads.clone()];
        // d_attention[node] = dg · v[node], for every node at once.
        weighted_sum::<M>(dg, &instance.values_t[head * dk * np..], np, np, lanes);
        let weighted: f32 = a.iter().zip(lanes.iter()).map(|(a, da)| a * da).sum();
        for node in 0..n {
            d_compat[node] = a[node] * (lanes[node] - weighted);
            if a[node] != 0.0 {
                let at = node * d + head * dk;
                axpy::<M>(a[node], dg, &mut g.values[at..at + dk]);
                axpy::<M>(
                    d_compat[node],
                    &x.query[heads.clone()],
                    &mut g.keys[at..at + dk],
                );
            }
        }
        // The row's own query gradient (only this head writes these lanes).
        let keys = &instance.keys[head * dk..];
        weighted_sum::<M>(d_compat, keys, d, dk, &mut g.query[heads.clone()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The polynomial exponential against libm's, where it is used (softmax arguments are
    /// at most 0) and beyond.
    #[test]
    fn exp_lane_matches_exp_to_a_few_ulp() {
        let mut worst = 0.0f32;
        for i in 0..=170_000 {
            let x = -87.0 + i as f32 * 1e-3;
            let (ours, libm) = (exp_lane(x), x.exp());
            worst = worst.max((ours - libm).abs() / libm);
        }
        assert!(worst < 5e-7, "worst relative error {worst}");
        assert!(exp_lane(f32::NEG_INFINITY) < 1e-37);
        assert_eq!(exp_lane(0.0), 1.0);
    }

    #[test]
    fn transposed_blocks_are_padded_with_zeros() {
        // 3 nodes × 2 features → 2 × 8 lanes.
        let mut out = vec![f32::NAN; 16];
        transpose_padded(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3, 2, &mut out);
        let mut expected = vec![0.0; 16];
        expected[..3].copy_from_slice(&[1.0, 3.0, 5.0]);
        expected[8..11].copy_from_slice(&[2.0, 4.0, 6.0]);
        assert_eq!(out, expected);
    }
}
