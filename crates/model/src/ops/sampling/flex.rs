use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Bytes, Flex};
use burn::tensor::DType;
use burn_flex::{FlexTensor, Layout};

use super::SamplingBackend;
use crate::ops::row_kernels::floats;

/// Rows whose CDFs are summed together: one row's running sum is a chain of N dependent
/// additions, and eight rows' chains are in flight at once.
const ROW_BLOCK: usize = 8;

/// One row's probabilities into `probs` (`[N]`): flex's `exp`, Rust's `f32::exp`
/// (`expf`), of its open nodes alone, gathered first into `open` (`[N]`) without a branch
/// (which nodes are open is as unpredictable as the tours); a masked node's `exp(−∞)` is
/// +0, and +0 it is.
fn probabilities(log_p: &[f32], probs: &mut [f32], open: &mut [usize]) {
    let mut count = 0;
    for (node, &lp) in log_p.iter().enumerate() {
        open[count] = node;
        count += usize::from(lp != f32::NEG_INFINITY);
    }
    probs.fill(0.0);
    for &node in &open[..count] {
        probs[node] = log_p[node].exp();
    }
}

/// Up to [`ROW_BLOCK`] rows' choices: each the number of nodes whose CDF value lies below
/// `uniform · total` (at most N − 1), as the op-by-op form counts them. `cdf` is the rows'
/// working memory (`[rows, N]`), `open` `[N]`.
///
/// Each CDF is the op-by-op form's bit for bit: `cumsum` adds from +0 in node order, as
/// here, and adding a masked node's +0 leaves a sum as it was.
fn inverse_cdf_rows(
    (log_p, uniforms): (&[f32], &[f32]),
    (cdf, open): (&mut [f32], &mut [usize]),
    picks: &mut [i64],
) {
    let n = open.len();
    let mut rows: Vec<&mut [f32]> = cdf.chunks_exact_mut(n).take(uniforms.len()).collect();
    for (row, log_p) in rows.iter_mut().zip(log_p.chunks_exact(n)) {
        probabilities(log_p, row, open);
    }
    let mut totals = [0.0f32; ROW_BLOCK];
    for node in 0..n {
        for (total, row) in totals.iter_mut().zip(rows.iter_mut()) {
            *total += row[node];
            row[node] = *total;
        }
    }
    for (((pick, row), &total), &u) in picks.iter_mut().zip(&rows).zip(&totals).zip(uniforms) {
        let threshold = u * total;
        let below = row
            .iter()
            .map(|&c| usize::from(c < threshold))
            .sum::<usize>();
        *pick = below.min(n - 1) as i64;
    }
}

/// Each row's pick (`[rows]`) from its log-probabilities `log_p` (`[rows, N]`) and its
/// uniform: what [`SamplingBackend::inverse_cdf`] gives, on slices (a whole decode on
/// flex samples with it too).
pub(crate) fn inverse_cdf_picks(log_p: &[f32], uniforms: &[f32], n: usize, picks: &mut [i64]) {
    let (mut cdf, mut open) = (vec![0.0f32; ROW_BLOCK * n], vec![0usize; n]);
    let blocks = log_p.chunks(ROW_BLOCK * n).zip(uniforms.chunks(ROW_BLOCK));
    for ((log_p, uniforms), picks) in blocks.zip(picks.chunks_mut(ROW_BLOCK)) {
        inverse_cdf_rows((log_p, uniforms), (&mut cdf, &mut open), picks);
    }
}

impl SamplingBackend for Flex {
    fn inverse_cdf(log_p: FloatTensor<Self>, uniform: FloatTensor<Self>) -> IntTensor<Self> {
        let n = log_p.layout().shape()[1];
        let [log_p, uniform] = [log_p, uniform].map(|t| t.to_contiguous());
        let uniforms = floats(&uniform);
        let mut picks = vec![0i64; uniforms.len()];
        inverse_cdf_picks(floats(&log_p), uniforms, n, &mut picks);
        let layout = Layout::contiguous([picks.len(), 1].into());
        FlexTensor::new(Bytes::from_elems(picks), layout, DType::I64)
    }
}
