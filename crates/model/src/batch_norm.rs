//! Batch normalisation in training over the rows of `[R, d]` node embeddings, as one
//! operation on flex, forward and backward.
//!
//! Burn 0.22.1's batch norm in training is a default method of its backend trait, written
//! for `[B, C, ...]` inputs: it swaps the channel axis to the front for every statistic,
//! and flex copies each swapped view (`copy_2d_tiled`), twice in the forward and twice in
//! the backward, around ~15 elementwise passes. That was ~6% of a `tiny_1` epoch. Over rows
//! the statistics are column sums of a row-major matrix: here the forward is three passes
//! (mean, variance, output) and the backward two.
//!
//! Only flex has it, and only in training (with running statistics, inference is a
//! per-feature scale and shift, which Burn does in one broadcast pass); elsewhere Burn's
//! `BatchNorm::forward` runs, which the tests compare against.

use burn::nn::BatchNorm;
use burn::tensor::Tensor;

/// `norm` over the rows of `x`, updating its running statistics as Burn's does.
///
/// # Shapes
/// - `x`: `[R, d]` → `[R, d]`
pub(crate) fn forward(norm: &BatchNorm, x: Tensor<2>) -> Tensor<2> {
    let device = x.device();
    let training = device.is_autodiff() && norm.training.is_enabled();
    if !(training && crate::backend::runs_on_flex(&device)) {
        return norm.forward(x);
    }
    let (out, mean, variance) = fused(x, norm.gamma.val(), norm.beta.val(), norm.epsilon);
    // The same update as `BatchNorm::forward_train`.
    let momentum = norm.momentum;
    let update = |running: Tensor<1>, batch: Tensor<1>| {
        let running = running.to_device(&device).mul_scalar(1.0 - momentum);
        running.add(batch.mul_scalar(momentum)).detach()
    };
    let running_mean = update(norm.running_mean.value_sync(), mean);
    let running_var = update(norm.running_var.value_sync(), variance);
    norm.running_mean.update(running_mean);
    norm.running_var.update(running_var);
    out
}

/// The normalised rows and the batch's mean and (biased) variance per feature, untracked;
/// call it only where [`crate::backend::runs_on_flex`] holds.
///
/// # Shapes
/// - `x`: `[R, d]`, `gamma`, `beta`: `[d]` → `[R, d]`, `[d]`, `[d]`
#[cfg(feature = "flex")]
fn fused(
    x: Tensor<2>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    epsilon: f64,
) -> (Tensor<2>, Tensor<1>, Tensor<1>) {
    use burn::backend::Dispatch;
    let (out, mean, variance) = <Dispatch as BatchNormBackend>::batch_norm_rows(
        x.into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        epsilon,
    );
    (
        Tensor::from_dispatch(out),
        Tensor::from_dispatch(mean),
        Tensor::from_dispatch(variance),
    )
}

#[cfg(not(feature = "flex"))]
fn fused(
    _x: Tensor<2>,
    _gamma: Tensor<1>,
    _beta: Tensor<1>,
    _epsilon: f64,
) -> (Tensor<2>, Tensor<1>, Tensor<1>) {
    unreachable!("flex is not compiled in; check `runs_on_flex` first")
}

#[cfg(feature = "flex")]
use extension::BatchNormBackend;

#[cfg(feature = "flex")]
mod extension {
    use burn::backend::backend_extension;
    use burn::backend::tensor::FloatTensor;

    /// Batch normalisation over rows in training, as a backend operation.
    #[backend_extension(Autodiff: cfg(feature = "autodiff"), Flex: cfg(feature = "flex"))]
    pub trait BatchNormBackend: burn::backend::Backend {
        /// See [`super::fused`].
        fn batch_norm_rows(
            x: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            beta: FloatTensor<Self>,
            epsilon: f64,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
    }
}

/// The loops over a row-major `[R, d]` matrix. Sums are taken row after row in f64, one
/// order whatever the thread count.
#[cfg(feature = "flex")]
mod kernel {
    /// Per feature: the mean and the biased variance.
    pub(super) fn moments(x: &[f32], d: usize) -> (Vec<f32>, Vec<f32>) {
        let rows = (x.len() / d).max(1) as f64;
        let mut sums = vec![0.0f64; d];
        for row in x.chunks_exact(d) {
            for (sum, &v) in sums.iter_mut().zip(row) {
                *sum += f64::from(v);
            }
        }
        let mean: Vec<f32> = sums.iter().map(|s| (s / rows) as f32).collect();
        sums.fill(0.0);
        for row in x.chunks_exact(d) {
            for ((sum, &v), &m) in sums.iter_mut().zip(row).zip(&mean) {
                let c = f64::from(v - m);
                *sum += c * c;
            }
        }
        let variance = sums.iter().map(|s| (s / rows) as f32).collect();
        (mean, variance)
    }

    pub(super) fn inverse_std(variance: &[f32], epsilon: f64) -> Vec<f32> {
        variance
            .iter()
            .map(|&v| (1.0 / (f64::from(v) + epsilon).sqrt()) as f32)
            .collect()
    }

    /// `(x − mean) · gamma / std + beta`, row by row.
    pub(super) fn normalise(x: &[f32], stats: [&[f32]; 4]) -> Vec<f32> {
        let [mean, inv_std, gamma, beta] = stats;
        let d = mean.len();
        let scale: Vec<f32> = gamma.iter().zip(inv_std).map(|(g, s)| g * s).collect();
        let mut out = Vec::with_capacity(x.len());
        for row in x.chunks_exact(d) {
            let row = row.iter().zip(mean).zip(&scale).zip(beta);
            out.extend(row.map(|(((&v, &m), &s), &b)| (v - m) * s + b));
        }
        out
    }

    /// The gradients of the input, `gamma` and `beta`, given the output's.
    pub(super) fn backward(
        x: &[f32],
        grad_out: &[f32],
        [mean, inv_std, gamma]: [&[f32]; 3],
    ) -> [Vec<f32>; 3] {
        let d = mean.len();
        let rows = (x.len() / d).max(1) as f64;
        let (mut beta_sums, mut gamma_sums) = (vec![0.0f64; d], vec![0.0f64; d]);
        for (row, grad) in x.chunks_exact(d).zip(grad_out.chunks_exact(d)) {
            let sums = beta_sums.iter_mut().zip(gamma_sums.iter_mut());
            let stats = mean.iter().zip(inv_std);
            for (((beta_sum, gamma_sum), (&v, &g)), (&m, &s)) in
                sums.zip(row.iter().zip(grad)).zip(stats)
            {
                *beta_sum += f64::from(g);
                *gamma_sum += f64::from(g * ((v - m) * s));
            }
        }
        // Per feature: ∂x = gamma·s·(∂y − mean(∂y) − x̂·mean(∂y·x̂)), x̂ = (x − mean)·s.
        let mean_grad: Vec<f32> = beta_sums.iter().map(|t| (t / rows) as f32).collect();
        let projection: Vec<f32> = (gamma_sums.iter().zip(inv_std))
            .map(|(t, &s)| (t / rows) as f32 * s)
            .collect();
        let scale: Vec<f32> = gamma.iter().zip(inv_std).map(|(g, s)| g * s).collect();
        let mut x_grad = Vec::with_capacity(x.len());
        for (row, grad) in x.chunks_exact(d).zip(grad_out.chunks_exact(d)) {
            let per_feature = mean
                .iter()
                .zip(&mean_grad)
                .zip(projection.iter().zip(&scale));
            x_grad.extend(
                row.iter()
                    .zip(grad)
                    .zip(per_feature)
                    .map(|((&v, &g), ((&m, &mg), (&p, &k)))| k * (g - mg - (v - m) * p)),
            );
        }
        let to_f32 = |sums: Vec<f64>| sums.into_iter().map(|t| t as f32).collect();
        [x_grad, to_f32(gamma_sums), to_f32(beta_sums)]
    }
}

#[cfg(feature = "flex")]
mod flex_impl {
    use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::autodiff::Autodiff;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{AutodiffBackend, Flex};
    use burn::tensor::Shape;
    use burn_flex::FlexTensor;

    use super::kernel;
    use super::BatchNormBackend;
    use crate::row_kernels::{floats, tensor};

    /// The output, mean and variance of contiguous `x`, `gamma`, `beta`, and the inverse
    /// standard deviation the backward reads.
    fn forward(
        x: &FlexTensor,
        gamma: &FlexTensor,
        beta: &FlexTensor,
        epsilon: f64,
    ) -> ([FlexTensor; 3], Vec<f32>) {
        let shape = x.layout().shape().clone();
        let d = shape[1];
        let (mean, variance) = kernel::moments(floats(x), d);
        let inv_std = kernel::inverse_std(&variance, epsilon);
        let out = kernel::normalise(floats(x), [&mean, &inv_std, floats(gamma), floats(beta)]);
        let outputs = [tensor(out, shape), tensor(mean, [d]), tensor(variance, [d])];
        (outputs, inv_std)
    }

    impl BatchNormBackend for Flex {
        fn batch_norm_rows(
            x: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            beta: FloatTensor<Self>,
            epsilon: f64,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
            let ([out, mean, variance], _) = forward(
                &x.to_contiguous(),
                &gamma.to_contiguous(),
                &beta.to_contiguous(),
                epsilon,
            );
            (out, mean, variance)
        }
    }

    #[derive(Debug)]
    struct BatchNormBackward;

    impl Backward<Flex, 3> for BatchNormBackward {
        /// The (contiguous) input, gamma, the batch's mean, and its inverse std.
        type State = (FlexTensor, FlexTensor, FlexTensor, Vec<f32>);

        fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
            let (x, gamma, mean, inv_std) = ops.state;
            let grad_out = grads.consume::<Flex>(&ops.node).to_contiguous();
            let shape = x.layout().shape().clone();
            let stats = [floats(&mean), &inv_std[..], floats(&gamma)];
            let [x_grad, gamma_grad, beta_grad] =
                kernel::backward(floats(&x), floats(&grad_out), stats);
            let features = Shape::from([shape[1]]);
            let [x_node, gamma_node, beta_node] = ops.parents;
            for (node, grad, shape) in [
                (x_node, x_grad, shape),
                (gamma_node, gamma_grad, features.clone()),
                (beta_node, beta_grad, features),
            ] {
                if let Some(node) = node {
                    grads.register::<Flex>(node.id, tensor(grad, shape));
                }
            }
        }
    }

    impl<C: CheckpointStrategy> BatchNormBackend for Autodiff<Flex, C> {
        fn batch_norm_rows(
            x: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            beta: FloatTensor<Self>,
            epsilon: f64,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
            let nodes = [x.node(), gamma.node(), beta.node()];
            let x = x.into_primitive().to_contiguous();
            let gamma = gamma.into_primitive().to_contiguous();
            let beta = beta.into_primitive().to_contiguous();
            let ([out, mean, variance], inv_std) = forward(&x, &gamma, &beta, epsilon);
            let untracked = |t: FlexTensor| <Self as AutodiffBackend>::from_inner(t);
            let out = match BatchNormBackward
                .prepare::<C>(nodes)
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish((x, gamma, mean.clone(), inv_std), out),
                OpsKind::UnTracked(prep) => prep.finish(out),
            };
            (out, untracked(mean), untracked(variance))
        }
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use burn::module::Param;
    use burn::nn::BatchNormConfig;
    use burn::tensor::{Device, TensorData};

    use super::*;
    use crate::backend::Backend;
    use crate::test_values::{assert_close, pseudo_random, read};

    /// The output; the gradients of the input, gamma and beta under a loss that weighs
    /// every output entry differently; and the running mean and variance after the step.
    fn outputs(device: &Device, [rows, d]: [usize; 2], fused: bool) -> [Vec<f32>; 6] {
        let mut norm = BatchNormConfig::new(d).init(device);
        let gamma = TensorData::new(pseudo_random(d, 11, 1.0), [d]);
        let beta = TensorData::new(pseudo_random(d, 12, 1.0), [d]);
        norm.gamma = Param::from_tensor(Tensor::from_data(gamma, device));
        norm.beta = Param::from_tensor(Tensor::from_data(beta, device));
        // Features of different offsets and spreads, as after a skip connection.
        let x: Vec<f32> = pseudo_random(rows * d, 13, 2.0)
            .iter()
            .enumerate()
            .map(|(i, v)| v * (1 + i % d % 3) as f32 + (i % d) as f32 * 0.25)
            .collect();
        let x = Tensor::<2>::from_data(TensorData::new(x, [rows, d]), device).require_grad();
        let out = if fused {
            forward(&norm, x.clone())
        } else {
            norm.forward(x.clone())
        };
        let weights = TensorData::new(pseudo_random(rows * d, 14, 1.0), [rows, d]);
        let grads = (out.clone() * Tensor::<2>::from_data(weights, device))
            .sum()
            .backward();
        [
            read(out),
            read(x.grad(&grads).expect("the input is tracked")),
            read(norm.gamma.grad(&grads).expect("gamma is tracked")),
            read(norm.beta.grad(&grads).expect("beta is tracked")),
            read(norm.running_mean.value_sync()),
            read(norm.running_var.value_sync()),
        ]
    }

    /// Within 1e-5 of Burn's batch norm relative to each tensor's largest entry: output,
    /// every gradient, and the running statistics; for the encoder's shapes, for sizes that
    /// are not whole vectors, and for one row (zero variance).
    #[test]
    fn fused_batch_norm_matches_burns_with_gradients_and_running_statistics() {
        let device = Backend::default_compiled()
            .unwrap()
            .device()
            .unwrap()
            .autodiff();
        assert!(crate::backend::runs_on_flex(&device));
        let names = [
            "output",
            "input gradient",
            "gamma gradient",
            "beta gradient",
            "running mean",
            "running variance",
        ];
        for size in [[33, 128], [7, 5], [1408, 16], [1, 4]] {
            let ours = outputs(&device, size, true);
            let reference = outputs(&device, size, false);
            assert_close(&ours, &reference, &names, &format!("{size:?}"), 1e-5);
        }
    }

    /// Outside training (no autodiff) Burn's inference form runs, on the running statistics.
    #[test]
    fn without_autodiff_the_running_statistics_are_used() {
        let device = Backend::default_compiled().unwrap().device().unwrap();
        let norm = BatchNormConfig::new(3).init(&device);
        let x = Tensor::<2>::from_data(TensorData::new(vec![1.0f32, 2.0, 3.0], [1, 3]), &device);
        // Running mean 0 and variance 1: the output is the input, up to epsilon.
        for (a, r) in read(forward(&norm, x)).iter().zip([1.0, 2.0, 3.0]) {
            assert!((a - r).abs() < 1e-4, "{a} vs {r}");
        }
    }
}
