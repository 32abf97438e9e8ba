use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Bytes, Flex};
use burn::tensor::DType;
use burn_flex::{FlexTensor, Layout};

use super::SamplingBackend;
use crate::ops::row_kernels::floats;

/// One row's choice: the number of nodes whose CDF value lies below `uniform · total`
/// (at most N − 1), as the op-by-op form counts them. `cdf` is the row's working memory,
/// `[N]`, and `open` `[N]` node indices.
///
/// Its CDF is the op-by-op form's bit for bit: flex's `exp` is Rust's `f32::exp` (`expf`),
/// and its `cumsum` adds from +0 in node order. A masked node's `exp(−∞)` is +0 and
/// `x + 0 = x`, so only the open nodes' exponentials are taken, gathered first without a
/// branch (which nodes are open is as unpredictable as the tours).
fn inverse_cdf_row(log_p: &[f32], uniform: f32, (cdf, open): (&mut [f32], &mut [usize])) -> usize {
    let mut count = 0;
    for (node, &lp) in log_p.iter().enumerate() {
        open[count] = node;
        count += usize::from(lp != f32::NEG_INFINITY);
    }
    cdf.fill(0.0);
    for &node in &open[..count] {
        cdf[node] = log_p[node].exp();
    }
    let mut total = 0.0f32;
    for c in cdf.iter_mut() {
        total += *c;
        *c = total;
    }
    let threshold = uniform * total;
    let below = cdf
        .iter()
        .map(|&c| usize::from(c < threshold))
        .sum::<usize>();
    below.min(log_p.len() - 1)
}

impl SamplingBackend for Flex {
    fn inverse_cdf(log_p: FloatTensor<Self>, uniform: FloatTensor<Self>) -> IntTensor<Self> {
        let n = log_p.layout().shape()[1];
        let [log_p, uniform] = [log_p, uniform].map(|t| t.to_contiguous());
        let (mut cdf, mut open) = (vec![0.0f32; n], vec![0usize; n]);
        let picks: Vec<i64> = floats(&log_p)
            .chunks_exact(n)
            .zip(floats(&uniform))
            .map(|(row, &u)| inverse_cdf_row(row, u, (&mut cdf, &mut open)) as i64)
            .collect();
        let layout = Layout::contiguous([picks.len(), 1].into());
        FlexTensor::new(Bytes::from_elems(picks), layout, DType::I64)
    }
}
