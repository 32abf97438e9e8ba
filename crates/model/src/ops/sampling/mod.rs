//! A sampled decode step's choice, the inverse of each row's CDF at a uniform, as one flex
//! operation: one pass over the rows.
//!
//! Composed from Burn's tensor operations it is nine operations at every step (`exp`,
//! `cumsum`, `lower`, a cast and a sum over `[R, N]`, each writing its own result; a slice,
//! a product, an `expand` and a clamp), and flex's `exp` calls `expf` for every node,
//! masked ones included: in all 6.8% of a POMO CVRP100 step. The fused form calls the same
//! `expf` on the open nodes alone (a masked node's `exp(−∞)` is +0, and adding +0 changes
//! no sum) and sums in the same order, so it picks the same node, bit for bit the same CDF.
//!
//! Only flex has it; elsewhere the op-by-op form ([`op_by_op`]) runs, which the tests
//! compare against. CubeCL devices choose inside their state kernel
//! (`crate::ops::state_step`), tested against the same reference.

use burn::tensor::{Int, Tensor};

/// Samples one node per row by inverting the cumulative distribution at a uniform from the
/// batch's noise: one operation on flex, Burn's tensor operations elsewhere. Masked nodes
/// have probability exactly 0 (exp(−∞)), so they occupy no interval of the CDF and can
/// never be selected; deterministic for a given noise.
///
/// # Shapes
/// - `log_p`: `[R, N]`, `uniform`: `[R, 1]` in (0, 1) → `[R, 1]`
pub(crate) fn sample(log_p: Tensor<2>, uniform: Tensor<2>) -> Tensor<2, Int> {
    match crate::runtime::device::runs_on_flex(&log_p.device()) {
        true => fused(log_p, uniform),
        false => op_by_op(log_p, uniform),
    }
}

/// [`sample`] in Burn's tensor operations: what backends other than flex run, and the
/// reference the fused forms (flex's, and CubeCL's state kernel) are tested against.
///
/// # Shapes
/// - `log_p`: `[R, N]`, `uniform`: `[R, 1]` → `[R, 1]`
pub(crate) fn op_by_op(log_p: Tensor<2>, uniform: Tensor<2>) -> Tensor<2, Int> {
    let [r, n] = log_p.dims();
    let cdf = log_p.exp().cumsum(1); // [R, N]
    let total = cdf.clone().slice_dim(1, n - 1..n); // [R, 1]
    let below = cdf.lower((uniform * total).expand([r, n])).int(); // [R, N]
    below.sum_dim(1).clamp_max((n - 1) as i64) // [R, 1]
}

/// The fused form of [`sample`]; call it only on flex. The choice carries no gradient, so
/// it runs on the tensors outside autodiff.
#[cfg(feature = "flex")]
fn fused(log_p: Tensor<2>, uniform: Tensor<2>) -> Tensor<2, Int> {
    use burn::backend::Dispatch;
    use burn::tensor::IntDType;
    let ints = log_p.device().settings().int_dtype;
    let picks: Tensor<2, Int> = Tensor::from_dispatch(<Dispatch as SamplingBackend>::inverse_cdf(
        log_p.without_autodiff().into_dispatch(),
        uniform.without_autodiff().into_dispatch(),
    ));
    match ints {
        IntDType::I64 => picks,
        other => picks.cast(other),
    }
}

#[cfg(not(feature = "flex"))]
fn fused(_log_p: Tensor<2>, _uniform: Tensor<2>) -> Tensor<2, Int> {
    unreachable!("flex is not compiled in; check `runs_on_flex` first")
}

#[cfg(feature = "flex")]
use extension::SamplingBackend;

#[cfg(feature = "flex")]
mod extension {
    use burn::backend::backend_extension;
    use burn::backend::tensor::{FloatTensor, IntTensor};

    /// The inverse CDF's choice as a backend operation (no gradient).
    #[backend_extension(Flex: cfg(feature = "flex"))]
    pub trait SamplingBackend: burn::backend::Backend {
        /// See [`super::sample`]; the `[R, 1]` choices as i64.
        fn inverse_cdf(log_p: FloatTensor<Self>, uniform: FloatTensor<Self>) -> IntTensor<Self>;
    }
}

#[cfg(feature = "flex")]
mod flex;
#[cfg(feature = "flex")]
pub(crate) use flex::inverse_cdf_picks;
#[cfg(test)]
mod tests;
