//! Inputs and checks the unit tests share (compiled for tests only).

// The fused kernels' tests and their helpers exist where a fused kernel does (flex,
// CubeCL); an ndarray-only build compiles the rest.
#![cfg_attr(not(any(feature = "flex", feature = "cpu")), allow(dead_code))]

/// Deterministic values in [-scale, scale] from a small LCG.
pub(crate) fn pseudo_random(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// The gradients of a loss that weighs every entry of `out` differently (weights drawn
/// from `seed`).
pub(crate) fn weighted_loss_grads<const D: usize>(
    out: &burn::tensor::Tensor<D>,
    seed: u64,
) -> burn::tensor::Gradients {
    use burn::tensor::{Tensor, TensorData};
    let shape = out.shape();
    let weights = TensorData::new(pseudo_random(shape.num_elements(), seed, 1.0), shape);
    let weights = Tensor::<D>::from_data(weights, &out.device());
    (out.clone() * weights).sum().backward()
}

/// Collects the gradient of every float parameter that has one in `grads`, in the
/// module's visiting order.
pub(crate) struct GradsOf<'a> {
    grads: &'a burn::tensor::Gradients,
    out: &'a mut Vec<Vec<f32>>,
}

impl<'a> GradsOf<'a> {
    pub(crate) fn new(grads: &'a burn::tensor::Gradients, out: &'a mut Vec<Vec<f32>>) -> Self {
        Self { grads, out }
    }
}

impl burn::module::ModuleVisitor for GradsOf<'_> {
    fn visit_float<const D: usize>(
        &mut self,
        param: &burn::module::Param<burn::tensor::Tensor<D>>,
    ) {
        if let Some(grad) = param.val().grad(self.grads) {
            self.out.push(read(grad));
        }
    }
}

/// An int tensor's values, in order.
pub(crate) fn read_ints<const D: usize>(t: burn::tensor::Tensor<D, burn::tensor::Int>) -> Vec<i64> {
    t.into_data().try_into_vec_as::<i64>().expect("ints")
}

/// A tensor's values, in order.
pub(crate) fn read<const D: usize>(t: burn::tensor::Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().expect("f32")
}

/// Each of `ours` within `relative` of the matching `reference`, relative to that
/// reference's largest entry (exactly equal where it is all zero). `names` names the
/// tensors, `case` the inputs, in the message of the first entry that is not.
pub(crate) fn assert_close(
    ours: &[Vec<f32>],
    reference: &[Vec<f32>],
    names: &[&str],
    case: &str,
    relative: f32,
) {
    assert_eq!(ours.len(), reference.len(), "{case}");
    for ((a, r), what) in ours.iter().zip(reference).zip(names) {
        assert_eq!(a.len(), r.len(), "{case} {what}: lengths");
        let scale = r.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        for (i, (a, r)) in a.iter().zip(r).enumerate() {
            assert!(
                (a - r).abs() <= relative * scale,
                "{case} {what}[{i}]: ours {a} vs the reference {r} (scale {scale})"
            );
        }
    }
}
