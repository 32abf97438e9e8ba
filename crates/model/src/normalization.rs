//! Batch normalisation in training and instance normalisation of node embeddings, over
//! the rows of `[R, d]` as one operation on flex, forward and backward.
//!
//! Burn 0.22.1's batch norm in training is a default method of its backend trait, written
//! for `[B, C, ...]` inputs: it swaps the channel axis to the front for every statistic,
//! and flex copies each swapped view (`copy_2d_tiled`), twice in the forward and twice in
//! the backward, around ~15 elementwise passes. That was ~6% of a `tiny_1` epoch. Its
//! instance norm is group norm over `[B, C, ...]` too: the encoder swaps the features to
//! axis 1 (a view the group norm's reshape copies), ~8 tracked elementwise operations
//! follow, and the output is swapped back (copied again by the next linear layer); ~5% of
//! a POMO step.
//!
//! Over rows the statistics are column sums of a row-major matrix: batch norm takes them
//! over all rows, instance norm over each instance's N rows (its nodes), with gamma and
//! beta shared. The forward is three passes (mean, variance, output), the backward two.
//!
//! flex runs it in plain Rust ([`kernel`]), CubeCL devices as a kernel each way
//! (`crate::norm_kernel`), each norm of `x + skip`, the skip connection before it; batch
//! norm only in training (with running statistics). Inference is a per-feature scale and
//! shift, Burn's broadcast pass with its parameters reshaped ahead ([`BatchNormRun`]).
//! Elsewhere (ndarray) Burn's modules run, which the tests compare against.

use burn::nn::{BatchNorm, InstanceNorm};
use burn::tensor::{Device, Tensor};

/// A batch norm as one forward pass runs it. Both fused forms keep work on CubeCL from
/// splitting into extra kernels (a reshape there ends a fused chain), and neither changes
/// a number:
/// - in training, the fused norm, whose batch statistics are folded into the running
///   statistics only at [`RunningUpdates::finish`], after the encoder's last layer: the
///   folds are then one fused kernel, not one a norm (6 launches for 3 layers);
/// - in inference, the parameters and running statistics reshaped to `[1, d]` when the
///   run is made, which the encoder does at the start of the norm's layer, so that the
///   norm's operations fuse with the additions before it (Burn's `batch_norm` reshapes
///   them between: 6 more launches for 3 layers);
/// - elsewhere (ndarray), Burn's.
#[allow(
    clippy::large_enum_variant,
    reason = "two a layer, moved straight into the layer's norms: boxing would buy nothing"
)]
pub(crate) enum BatchNormRun<'a> {
    Training(&'a BatchNorm),
    Inference(InferenceForm<'a>),
    Burns(&'a BatchNorm),
}

impl<'a> BatchNormRun<'a> {
    /// How `norm` runs on `device`.
    pub(crate) fn new(norm: &'a BatchNorm, device: &Device) -> Self {
        match (in_training(norm, device), fused_on(device)) {
            (false, _) => Self::Inference(InferenceForm::new(norm, device)),
            (true, true) => Self::Training(norm),
            (true, false) => Self::Burns(norm),
        }
    }

    /// The norm over the rows of `x + skip`, its running statistics updated in training as
    /// Burn's does (at `updates`' [`RunningUpdates::finish`]).
    ///
    /// # Shapes
    /// - `x`, `skip`: `[R, d]` → `[R, d]`
    pub(crate) fn forward(
        self,
        x: Tensor<2>,
        skip: Tensor<2>,
        updates: &mut RunningUpdates<'a>,
    ) -> Tensor<2> {
        let norm = match self {
            Self::Inference(form) => return form.apply(x + skip),
            Self::Burns(norm) => return norm.forward(x + skip),
            Self::Training(norm) => norm,
        };
        let [rows, d] = x.dims();
        let (gamma, beta) = (norm.gamma.val(), norm.beta.val());
        let (out, mean, variance) = fused([x, skip], gamma, beta, norm.epsilon, rows);
        // Reshaped here, ahead of the folds, which then fuse into one kernel.
        let [mean, variance] = [mean, variance].map(|batch| batch.reshape([d]));
        updates.0.push(RunningUpdate {
            norm,
            mean,
            variance,
        });
        out
    }
}

/// The training batches' statistics of one forward pass's batch norms, not yet folded
/// into their running statistics.
#[derive(Default)]
pub(crate) struct RunningUpdates<'a>(Vec<RunningUpdate<'a>>);

impl RunningUpdates<'_> {
    /// Folds the statistics into the running statistics.
    pub(crate) fn finish(self) {
        self.0.into_iter().for_each(RunningUpdate::apply);
    }
}

fn in_training(norm: &BatchNorm, device: &Device) -> bool {
    device.is_autodiff() && norm.training.is_enabled()
}

/// A batch norm's inference form with its parameters and running statistics as `[1, d]`:
/// the operations of Burn's default `batch_norm`, in its order.
pub(crate) struct InferenceForm<'a> {
    norm: &'a BatchNorm,
    /// Gamma, beta, the running mean and the running variance.
    rows: [Tensor<2>; 4],
}

impl<'a> InferenceForm<'a> {
    fn new(norm: &'a BatchNorm, device: &Device) -> Self {
        let row = |t: Tensor<1>| t.to_device(device).unsqueeze_dim::<2>(0); // [1, d]
        let rows = [
            row(norm.gamma.val()),
            row(norm.beta.val()),
            row(norm.running_mean.value()),
            row(norm.running_var.value()),
        ];
        Self { norm, rows }
    }

    /// # Shapes
    /// - `x`: `[R, d]` → `[R, d]`
    fn apply(self, x: Tensor<2>) -> Tensor<2> {
        let [gamma, beta, mean, variance] = self.rows;
        let std = variance.add_scalar(self.norm.epsilon).sqrt(); // [1, d]
        x.sub(mean).div(std).mul(gamma).add(beta)
    }
}

/// A training batch's mean and variance per feature, not yet folded into its batch norm's
/// running statistics.
struct RunningUpdate<'a> {
    norm: &'a BatchNorm,
    mean: Tensor<1>,
    variance: Tensor<1>,
}

impl RunningUpdate<'_> {
    /// The same update as `BatchNorm::forward_train`.
    fn apply(self) {
        let Self {
            norm,
            mean,
            variance,
        } = self;
        let device = mean.device();
        let [running_mean, running_var] = [&norm.running_mean, &norm.running_var]
            .map(|running| running.value_sync().to_device(&device));
        let momentum = norm.momentum;
        let update = |running: Tensor<1>, batch: Tensor<1>| {
            let running = running.mul_scalar(1.0 - momentum);
            running.add(batch.mul_scalar(momentum)).detach()
        };
        norm.running_mean.update(update(running_mean, mean));
        norm.running_var.update(update(running_var, variance));
    }
}

/// `norm` of `x + skip` over each instance's `nodes` rows, in training and inference
/// alike (it keeps no running statistics).
///
/// # Shapes
/// - `x`, `skip`: `[B × N, d]` → `[B × N, d]`
pub(crate) fn instance_norm(
    norm: &InstanceNorm,
    x: Tensor<2>,
    skip: Tensor<2>,
    nodes: usize,
) -> Tensor<2> {
    let [rows, d] = x.dims();
    match (&norm.gamma, &norm.beta) {
        (Some(gamma), Some(beta)) if fused_on(&x.device()) => {
            let (out, _, _) = fused([x, skip], gamma.val(), beta.val(), norm.epsilon, nodes);
            out
        }
        // Burn's takes the features on axis 1.
        _ => {
            let x = (x + skip).reshape([rows / nodes, nodes, d]).swap_dims(1, 2); // [B, d, N]
            norm.forward(x).swap_dims(1, 2).reshape([rows, d])
        }
    }
}

/// Whether the fused normalisation runs on `device` (with or without autodiff): flex, and
/// CubeCL devices (cuda, cpu).
fn fused_on(device: &burn::tensor::Device) -> bool {
    crate::backend::runs_on_flex(device) || crate::backend::runs_through_cubecl(device)
}

/// The rows of `x + skip` normalised in groups of `group_rows` consecutive rows, and each
/// group's mean and (biased) variance per feature, untracked; call it only where
/// [`fused_on`] holds.
///
/// The skip connection's addition is the operation's own: on CubeCL it would otherwise be
/// a launch of its own before each attention's norm (a product without bias comes before).
///
/// # Shapes
/// - `x`, `skip`: `[R, d]`, `gamma`, `beta`: `[d]` → `[R, d]`, `[G, d]`, `[G, d]`
///   (G = R / group_rows)
#[cfg(any(feature = "flex", feature = "cuda", feature = "cpu"))]
fn fused(
    [x, skip]: [Tensor<2>; 2],
    gamma: Tensor<1>,
    beta: Tensor<1>,
    epsilon: f64,
    group_rows: usize,
) -> (Tensor<2>, Tensor<2>, Tensor<2>) {
    use burn::backend::Dispatch;
    let (out, mean, variance) = <Dispatch as NormBackend>::norm_rows(
        x.into_dispatch(),
        skip.into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        epsilon,
        group_rows,
    );
    (
        Tensor::from_dispatch(out),
        Tensor::from_dispatch(mean),
        Tensor::from_dispatch(variance),
    )
}

#[cfg(not(any(feature = "flex", feature = "cuda", feature = "cpu")))]
fn fused(
    _x_and_skip: [Tensor<2>; 2],
    _gamma: Tensor<1>,
    _beta: Tensor<1>,
    _epsilon: f64,
    _group_rows: usize,
) -> (Tensor<2>, Tensor<2>, Tensor<2>) {
    unreachable!("no backend with fused normalisation is compiled in; check `fused_on` first")
}

#[cfg(any(feature = "flex", feature = "cuda", feature = "cpu"))]
use extension::NormBackend;

#[cfg(any(feature = "flex", feature = "cuda", feature = "cpu"))]
mod extension {
    use burn::backend::backend_extension;
    use burn::backend::tensor::FloatTensor;

    /// Normalisation over groups of rows, as a backend operation.
    #[backend_extension(
        Autodiff: cfg(feature = "autodiff"),
        Flex: cfg(feature = "flex"),
        Cube: cfg(any(feature = "cuda", feature = "cpu")),
        Fusion: cfg(any(feature = "cuda", feature = "cpu"))
    )]
    pub trait NormBackend: burn::backend::Backend {
        /// See [`super::fused`].
        #[fusion(meta = super::cube_impl::norm_metadata)]
        fn norm_rows(
            x: FloatTensor<Self>,
            skip: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            beta: FloatTensor<Self>,
            epsilon: f64,
            group_rows: usize,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
    }
}

#[cfg(any(feature = "cuda", feature = "cpu"))]
mod cube_impl {
    use burn::backend::backend_extension;
    use burn::backend::fusion::custom::TensorSpec;
    use burn::backend::tensor::FloatTensor;
    use burn::tensor::Shape;
    use burn_cubecl::CubeBackend;

    use super::NormBackend;
    use crate::norm_kernel;

    /// The output `[R, d]` and the groups' statistics `[G, d]`, for Fusion.
    pub(super) fn norm_metadata(
        x: &TensorSpec,
        _skip: &TensorSpec,
        _gamma: &TensorSpec,
        _beta: &TensorSpec,
        _epsilon: &f64,
        group_rows: &usize,
    ) -> (TensorSpec, TensorSpec, TensorSpec) {
        let [rows, d] = x.shape.dims::<2>();
        let (groups, _) = norm_kernel::group_sizes(rows, *group_rows);
        let stats = || TensorSpec::new(Shape::new([groups, d]), x.dtype);
        (TensorSpec::new(x.shape.clone(), x.dtype), stats(), stats())
    }

    /// The input's gradient `[R, d]` and the groups' shares of gamma's and beta's `[G, d]`.
    #[allow(clippy::too_many_arguments)]
    fn grads_metadata(
        x: &TensorSpec,
        _skip: &TensorSpec,
        _gamma: &TensorSpec,
        mean: &TensorSpec,
        _variance: &TensorSpec,
        _grad_out: &TensorSpec,
        _epsilon: &f32,
        _group_rows: &usize,
    ) -> (TensorSpec, TensorSpec, TensorSpec) {
        let stats = || TensorSpec::new(mean.shape.clone(), x.dtype);
        (TensorSpec::new(x.shape.clone(), x.dtype), stats(), stats())
    }

    /// The normalisation's backward pass on CubeCL, as its own operation: what the
    /// autodiff backward of [`NormBackend::norm_rows`] runs there.
    #[backend_extension(Cube, Fusion)]
    pub trait NormGradsBackend: burn::backend::Backend {
        /// The gradient of the input `x + skip` and each group's share of gamma's and
        /// beta's, from the output's `grad_out` and the forward's `mean` and `variance`.
        #[allow(clippy::too_many_arguments)]
        #[fusion(meta = grads_metadata)]
        fn norm_rows_grads(
            x: FloatTensor<Self>,
            skip: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            mean: FloatTensor<Self>,
            variance: FloatTensor<Self>,
            grad_out: FloatTensor<Self>,
            epsilon: f32,
            group_rows: usize,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
    }

    impl NormBackend for CubeBackend {
        fn norm_rows(
            x: FloatTensor<Self>,
            skip: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            beta: FloatTensor<Self>,
            epsilon: f64,
            group_rows: usize,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
            let [out, mean, variance] =
                norm_kernel::forward([x, skip, gamma, beta], epsilon as f32, group_rows);
            (out, mean, variance)
        }
    }

    impl NormGradsBackend for CubeBackend {
        fn norm_rows_grads(
            x: FloatTensor<Self>,
            skip: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            mean: FloatTensor<Self>,
            variance: FloatTensor<Self>,
            grad_out: FloatTensor<Self>,
            epsilon: f32,
            group_rows: usize,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
            let inputs = [x, skip, gamma, mean, variance, grad_out];
            let [x_grad, gamma_grad, beta_grad] =
                norm_kernel::backward(inputs, epsilon, group_rows);
            (x_grad, gamma_grad, beta_grad)
        }
    }

    #[cfg(feature = "autodiff")]
    mod autodiff {
        use burn::backend::autodiff::checkpoint::{
            base::Checkpointer, strategy::CheckpointStrategy,
        };
        use burn::backend::autodiff::grads::Gradients;
        use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
        use burn::backend::autodiff::Autodiff;
        use burn::backend::ops::FloatTensorOps;
        use burn::backend::tensor::FloatTensor;
        use burn::backend::{AutodiffBackend, Cube, TensorMetadata};
        use burn::tensor::Shape;

        use super::{NormBackend, NormGradsBackend};

        #[derive(Debug)]
        struct CubeNormBackward;

        impl Backward<Cube, 4> for CubeNormBackward {
            /// The input and the skip, gamma, the groups' mean and variance, epsilon and the
            /// group size.
            type State = ([FloatTensor<Cube>; 5], f32, usize);

            fn backward(
                self,
                ops: Ops<Self::State, 4>,
                grads: &mut Gradients,
                _: &mut Checkpointer,
            ) {
                let ([x, skip, gamma, mean, variance], epsilon, group_rows) = ops.state;
                let grad_out = grads.consume::<Cube>(&ops.node);
                let (x_grad, gamma_grads, beta_grads) = Cube::norm_rows_grads(
                    x, skip, gamma, mean, variance, grad_out, epsilon, group_rows,
                );
                // The groups' shares summed; batch norm's one group needs no launch for it.
                let features = |per_group: FloatTensor<Cube>| {
                    let [groups, d] = per_group.shape().dims::<2>();
                    let total = match groups {
                        1 => per_group,
                        _ => Cube::float_sum_dim(per_group, 0),
                    };
                    Cube::float_reshape(total, Shape::from([d]))
                };
                // The sum's gradient is each addend's.
                let [x_node, skip_node, gamma_node, beta_node] = ops.parents;
                let per_parent = [
                    (x_node, x_grad.clone()),
                    (skip_node, x_grad),
                    (gamma_node, features(gamma_grads)),
                    (beta_node, features(beta_grads)),
                ];
                for (node, grad) in per_parent {
                    if let Some(node) = node {
                        grads.register::<Cube>(node.id, grad);
                    }
                }
            }
        }

        impl<C: CheckpointStrategy> NormBackend for Autodiff<Cube, C> {
            fn norm_rows(
                x: FloatTensor<Self>,
                skip: FloatTensor<Self>,
                gamma: FloatTensor<Self>,
                beta: FloatTensor<Self>,
                epsilon: f64,
                group_rows: usize,
            ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
                let nodes = [x.node(), skip.node(), gamma.node(), beta.node()];
                let (x, skip) = (x.into_primitive(), skip.into_primitive());
                let gamma = gamma.into_primitive();
                let (out, mean, variance) = Cube::norm_rows(
                    x.clone(),
                    skip.clone(),
                    gamma.clone(),
                    beta.into_primitive(),
                    epsilon,
                    group_rows,
                );
                let untracked = |t: FloatTensor<Cube>| <Self as AutodiffBackend>::from_inner(t);
                let state = (
                    [x, skip, gamma, mean.clone(), variance.clone()],
                    epsilon as f32,
                    group_rows,
                );
                let out = match CubeNormBackward
                    .prepare::<C>(nodes)
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(prep) => prep.finish(state, out),
                    OpsKind::UnTracked(prep) => prep.finish(out),
                };
                (out, untracked(mean), untracked(variance))
            }
        }
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

    /// `(x − mean) · gamma / std + beta`, row by row, appended to `out`.
    pub(super) fn normalise(x: &[f32], stats: [&[f32]; 4], out: &mut Vec<f32>) {
        let [mean, inv_std, gamma, beta] = stats;
        let d = mean.len();
        let scale: Vec<f32> = gamma.iter().zip(inv_std).map(|(g, s)| g * s).collect();
        for row in x.chunks_exact(d) {
            let row = row.iter().zip(mean).zip(&scale).zip(beta);
            out.extend(row.map(|(((&v, &m), &s), &b)| (v - m) * s + b));
        }
    }

    /// One group's input gradient, appended to `x_grad`, given the output's; its sums of
    /// `∂y·x̂` and `∂y` per feature (its share of gamma's and beta's gradients) are added
    /// to `sums`.
    pub(super) fn backward(
        x: &[f32],
        grad_out: &[f32],
        [mean, inv_std, gamma]: [&[f32]; 3],
        x_grad: &mut Vec<f32>,
        sums: &mut [Vec<f64>; 2],
    ) {
        let d = mean.len();
        let rows = (x.len() / d).max(1) as f64;
        let (mut beta_sums, mut gamma_sums) = (vec![0.0f64; d], vec![0.0f64; d]);
        for (row, grad) in x.chunks_exact(d).zip(grad_out.chunks_exact(d)) {
            let group_sums = beta_sums.iter_mut().zip(gamma_sums.iter_mut());
            let stats = mean.iter().zip(inv_std);
            for (((beta_sum, gamma_sum), (&v, &g)), (&m, &s)) in
                group_sums.zip(row.iter().zip(grad)).zip(stats)
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
        for (total, group) in [gamma_sums, beta_sums].iter().enumerate() {
            for (t, g) in sums[total].iter_mut().zip(group) {
                *t += g;
            }
        }
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
    use super::NormBackend;
    use crate::row_kernels::{floats, tensor};

    /// What the backward reads besides the input and gamma: each group's mean (the
    /// forward's output) and inverse standard deviation, `[G, d]`, and its rows.
    #[derive(Debug, Clone)]
    struct Groups {
        mean: FlexTensor,
        inv_std: Vec<f32>,
        rows: usize,
    }

    /// The input `x + skip` (what the backward reads), the output and each group's mean
    /// and variance.
    fn forward(
        [x, skip]: [FlexTensor; 2],
        [gamma, beta]: [&FlexTensor; 2],
        epsilon: f64,
        group_rows: usize,
    ) -> (FlexTensor, [FlexTensor; 3], Groups) {
        let shape = x.layout().shape().clone();
        let (x, skip) = (x.to_contiguous(), skip.to_contiguous());
        let sum = floats(&x).iter().zip(floats(&skip)).map(|(a, b)| a + b);
        let x = tensor(sum.collect(), shape.clone());
        let (rows, d) = (shape[0], shape[1]);
        let group_rows = group_rows.clamp(1, rows.max(1));
        assert_eq!(
            rows % group_rows,
            0,
            "{rows} rows in groups of {group_rows}"
        );
        let mut out = Vec::with_capacity(rows * d);
        let (mut mean, mut variance, mut inv_std) = (vec![], vec![], vec![]);
        for group in floats(&x).chunks_exact(group_rows * d) {
            let (group_mean, group_variance) = kernel::moments(group, d);
            let group_inv_std = kernel::inverse_std(&group_variance, epsilon);
            let affine = [&group_mean[..], &group_inv_std, floats(gamma), floats(beta)];
            kernel::normalise(group, affine, &mut out);
            mean.extend(group_mean);
            variance.extend(group_variance);
            inv_std.extend(group_inv_std);
        }
        let groups = rows / group_rows;
        let mean = tensor(mean, [groups, d]);
        let stats = Groups {
            mean: mean.clone(),
            inv_std,
            rows: group_rows,
        };
        let outputs = [tensor(out, shape), mean, tensor(variance, [groups, d])];
        (x, outputs, stats)
    }

    impl NormBackend for Flex {
        fn norm_rows(
            x: FloatTensor<Self>,
            skip: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            beta: FloatTensor<Self>,
            epsilon: f64,
            group_rows: usize,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
            let affine = [gamma.to_contiguous(), beta.to_contiguous()];
            let (_, [out, mean, variance], _) =
                forward([x, skip], [&affine[0], &affine[1]], epsilon, group_rows);
            (out, mean, variance)
        }
    }

    #[derive(Debug)]
    struct NormBackward;

    impl Backward<Flex, 4> for NormBackward {
        /// The (contiguous) input `x + skip` and gamma, and the groups' statistics.
        type State = (FlexTensor, FlexTensor, Groups);

        fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
            let (x, gamma, groups) = ops.state;
            let grad_out = grads.consume::<Flex>(&ops.node).to_contiguous();
            let shape = x.layout().shape().clone();
            let d = shape[1];
            let mut x_grad = Vec::with_capacity(shape[0] * d);
            let mut sums = [vec![0.0f64; d], vec![0.0f64; d]];
            let chunk = groups.rows * d;
            let rows = floats(&x)
                .chunks_exact(chunk)
                .zip(floats(&grad_out).chunks_exact(chunk));
            for (g, (x, grad)) in rows.enumerate() {
                let stats = [
                    &floats(&groups.mean)[g * d..][..d],
                    &groups.inv_std[g * d..][..d],
                ];
                let stats = [stats[0], stats[1], floats(&gamma)];
                kernel::backward(x, grad, stats, &mut x_grad, &mut sums);
            }
            let [gamma_grad, beta_grad] = sums.map(|s| s.into_iter().map(|t| t as f32).collect());
            let features = Shape::from([d]);
            // The sum's gradient is each addend's.
            let [x_node, skip_node, gamma_node, beta_node] = ops.parents;
            let x_grad = tensor(x_grad, shape);
            if let Some(node) = skip_node {
                grads.register::<Flex>(node.id, x_grad.clone());
            }
            if let Some(node) = x_node {
                grads.register::<Flex>(node.id, x_grad);
            }
            for (node, grad, shape) in [
                (gamma_node, gamma_grad, features.clone()),
                (beta_node, beta_grad, features),
            ] {
                if let Some(node) = node {
                    grads.register::<Flex>(node.id, tensor(grad, shape));
                }
            }
        }
    }

    impl<C: CheckpointStrategy> NormBackend for Autodiff<Flex, C> {
        fn norm_rows(
            x: FloatTensor<Self>,
            skip: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            beta: FloatTensor<Self>,
            epsilon: f64,
            group_rows: usize,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
            let nodes = [x.node(), skip.node(), gamma.node(), beta.node()];
            let [x, skip] = [x, skip].map(|t| t.into_primitive());
            let gamma = gamma.into_primitive().to_contiguous();
            let beta = beta.into_primitive().to_contiguous();
            let (x, [out, mean, variance], groups) =
                forward([x, skip], [&gamma, &beta], epsilon, group_rows);

            let untracked = |t: FlexTensor| <Self as AutodiffBackend>::from_inner(t);
            let out = match NormBackward.prepare::<C>(nodes).compute_bound().stateful() {
                OpsKind::Tracked(prep) => prep.finish((x, gamma, groups), out),
                OpsKind::UnTracked(prep) => prep.finish(out),
            };
            (out, untracked(mean), untracked(variance))
        }
    }
}

#[cfg(all(test, any(feature = "flex", feature = "cpu")))]
mod tests {
    use burn::module::Param;
    use burn::nn::{BatchNorm, BatchNormConfig, InstanceNormConfig};
    use burn::tensor::{Device, TensorData};

    use super::*;
    use crate::backend::Backend;
    use crate::test_values::{assert_close, pseudo_random, read, weighted_loss_grads};

    /// `backend`'s device with autodiff, where the fused forms run in training.
    fn training_device(backend: Backend) -> Device {
        let device = backend.device().unwrap();
        assert!(fused_on(&device));
        device.autodiff()
    }

    /// `outputs` of the fused form within `tolerance` of Burn's (relative to each tensor's
    /// largest entry) at every size, on `backend`'s training device.
    fn assert_fused_matches_burns<const S: usize, const K: usize>(
        backend: Backend,
        sizes: &[[usize; S]],
        names: &[&str; K],
        outputs: fn(&Device, [usize; S], bool) -> [Vec<f32>; K],
    ) {
        let device = training_device(backend);
        for &size in sizes {
            let ours = outputs(&device, size, true);
            let reference = outputs(&device, size, false);
            assert_close(&ours, &reference, names, &format!("{size:?}"), 1e-5);
        }
    }

    /// Features of different offsets and spreads, as after a skip connection.
    fn features(rows: usize, d: usize) -> Vec<f32> {
        pseudo_random(rows * d, 13, 2.0)
            .iter()
            .enumerate()
            .map(|(i, v)| v * (1 + i % d % 3) as f32 + (i % d) as f32 * 0.25)
            .collect()
    }

    /// Gamma and beta of `d` features, neither ones nor zeros.
    fn affine(d: usize, device: &Device) -> [Param<Tensor<1>>; 2] {
        [11, 12].map(|seed| {
            let values = TensorData::new(pseudo_random(d, seed, 1.0), [d]);
            Param::from_tensor(Tensor::from_data(values, device))
        })
    }

    /// A skip connection's rows for `features`' rows, tracked.
    fn skip(rows: usize, d: usize, device: &Device) -> Tensor<2> {
        let values = TensorData::new(pseudo_random(rows * d, 15, 1.0), [rows, d]);
        Tensor::<2>::from_data(values, device).require_grad()
    }

    /// The output; the gradients of the input, the skip, gamma and beta under a loss that
    /// weighs every output entry differently; and the running mean and variance after the
    /// step.
    fn outputs(device: &Device, [rows, d]: [usize; 2], fused: bool) -> [Vec<f32>; 7] {
        let mut norm = BatchNormConfig::new(d).init(device);
        [norm.gamma, norm.beta] = affine(d, device);
        let x = Tensor::<2>::from_data(TensorData::new(features(rows, d), [rows, d]), device)
            .require_grad();
        let skip = skip(rows, d, device);
        let out = if fused {
            let mut updates = RunningUpdates::default();
            let out =
                BatchNormRun::new(&norm, device).forward(x.clone(), skip.clone(), &mut updates);
            updates.finish();
            out
        } else {
            norm.forward(x.clone() + skip.clone())
        };
        let grads = weighted_loss_grads(&out, 14);
        [
            read(out),
            read(x.grad(&grads).expect("the input is tracked")),
            read(skip.grad(&grads).expect("the skip is tracked")),
            read(norm.gamma.grad(&grads).expect("gamma is tracked")),
            read(norm.beta.grad(&grads).expect("beta is tracked")),
            read(norm.running_mean.value_sync()),
            read(norm.running_var.value_sync()),
        ]
    }

    const BATCH_NORM_OUTPUTS: [&str; 7] = [
        "output",
        "input gradient",
        "skip gradient",
        "gamma gradient",
        "beta gradient",
        "running mean",
        "running variance",
    ];

    /// The encoder's shapes, sizes that are not whole vectors, and one row (zero variance).
    const BATCH_NORM_SIZES: [[usize; 2]; 4] = [[33, 128], [7, 5], [1408, 16], [1, 4]];

    /// Within 1e-5 of Burn's batch norm relative to each tensor's largest entry: output,
    /// every gradient, and the running statistics.
    #[cfg(feature = "flex")]
    #[test]
    fn fused_batch_norm_matches_burns_with_gradients_and_running_statistics() {
        let (sizes, names) = (&BATCH_NORM_SIZES, &BATCH_NORM_OUTPUTS);
        assert_fused_matches_burns(Backend::Flex, sizes, names, outputs);
    }

    #[cfg(feature = "cpu")]
    crate::cube_launch::for_tests::test_with_64_bit_offsets!(
        cube_batch_norm_matches_burns_with_gradients_and_running_statistics
    );

    /// The CubeCL kernels on CubeCL's CPU runtime, against Burn's batch norm there.
    #[cfg(feature = "cpu")]
    #[test]
    fn cube_batch_norm_matches_burns_with_gradients_and_running_statistics() {
        let _alone = crate::test_values::one_cube_test_at_a_time();
        let (sizes, names) = (&BATCH_NORM_SIZES, &BATCH_NORM_OUTPUTS);
        assert_fused_matches_burns(Backend::Cpu, sizes, names, outputs);
    }

    /// Outside training (no autodiff) Burn's inference form runs, on the running statistics.
    #[cfg(feature = "flex")]
    #[test]
    fn without_autodiff_the_running_statistics_are_used() {
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let norm = BatchNormConfig::new(3).init(&device);
        let x = Tensor::<2>::from_data(TensorData::new(vec![1.0f32, 2.0, 3.0], [1, 3]), &device);
        // Running mean 0 and variance 1: the output is the input, up to epsilon.
        let skip = Tensor::zeros([1, 3], &device);
        let run = BatchNormRun::new(&norm, &device);
        let out = run.forward(x, skip, &mut RunningUpdates::default());
        for (a, r) in read(out).iter().zip([1.0, 2.0, 3.0]) {
            assert!((a - r).abs() < 1e-4, "{a} vs {r}");
        }
    }

    /// The inference form, its parameters reshaped before the input comes, gives Burn's
    /// `BatchNorm::forward` bit for bit: every parameter and statistic set, one norm after
    /// another on the same rows as in the encoder.
    fn assert_inference_form_is_burns(backend: Backend) {
        let device = backend.device().unwrap();
        let (rows, d) = (33, 128);
        let norms: Vec<BatchNorm> = (0..2u64)
            .map(|i| {
                let mut norm = BatchNormConfig::new(d).init(&device);
                [norm.gamma, norm.beta] = affine(d, &device);
                let stat = |seed: u64, shift: f32| {
                    let values = pseudo_random(d, 20 + 2 * i + seed, 1.0);
                    let values = values.iter().map(|v| v + shift).collect::<Vec<_>>();
                    Tensor::<1>::from_data(TensorData::new(values, [d]), &device)
                };
                norm.running_mean.update(stat(0, 0.0));
                norm.running_var.update(stat(1, 1.5));
                norm
            })
            .collect();
        let x = Tensor::<2>::from_data(TensorData::new(features(rows, d), [rows, d]), &device);
        let skip = x.clone() * 0.5;
        // Made before the first norm runs, as the encoder makes a layer's two.
        let runs: Vec<_> = norms
            .iter()
            .map(|n| BatchNormRun::new(n, &device))
            .collect();
        let mut updates = RunningUpdates::default();
        let mut ours = x.clone();
        let mut burns = x;
        for (run, norm) in runs.into_iter().zip(&norms) {
            ours = run.forward(ours, skip.clone(), &mut updates);
            burns = norm.forward(burns + skip.clone());
        }
        updates.finish();
        assert_eq!(read(ours), read(burns));
    }

    #[cfg(feature = "flex")]
    #[test]
    fn batch_norm_inference_form_is_burns() {
        assert_inference_form_is_burns(Backend::Flex);
    }

    /// On CubeCL the operations fuse differently from Burn's (that is the point): the same
    /// numbers still.
    #[cfg(feature = "cpu")]
    #[test]
    fn cube_batch_norm_inference_form_is_burns() {
        let _alone = crate::test_values::one_cube_test_at_a_time();
        assert_inference_form_is_burns(Backend::Cpu);
    }

    /// Instance norm of `d` features with [`affine`]'s gamma and beta.
    fn instance_norm_of(d: usize, device: &Device) -> InstanceNorm {
        let mut norm = InstanceNormConfig::new(d).init(device);
        let [gamma, beta] = affine(d, device);
        (norm.gamma, norm.beta) = (Some(gamma), Some(beta));
        norm
    }

    /// The output and the gradients of the input, the skip, gamma and beta, as in
    /// [`outputs`], for instance norm over `[B, N, d]`.
    fn instance_outputs(device: &Device, [b, n, d]: [usize; 3], fused: bool) -> [Vec<f32>; 5] {
        let norm = instance_norm_of(d, device);
        let x = Tensor::<3>::from_data(TensorData::new(features(b * n, d), [b, n, d]), device)
            .require_grad();
        let skip = skip(b * n, d, device);
        // Burn's reference normalises the sum as a tensor of its own, whose gradient is
        // then both addends': with the addition in the same stream, CubeCL's fusion of it
        // into the group norm's reduction fails to expand ("Cast element count must
        // match") in Burn 0.22.1.
        let sum = (x.clone() + skip.clone().reshape([b, n, d])).into_data();
        let sum = Tensor::<3>::from_data(sum, device).require_grad();
        let out = if fused {
            let rows = x.clone().reshape([b * n, d]);
            instance_norm(&norm, rows, skip.clone(), n).reshape([b, n, d])
        } else {
            norm.forward(sum.clone().swap_dims(1, 2)).swap_dims(1, 2)
        };
        let grads = weighted_loss_grads(&out, 14);
        let param_grad = |p: &Option<Param<Tensor<1>>>| {
            read(p.as_ref().expect("affine").grad(&grads).expect("tracked"))
        };
        let sum_grad = || read(sum.grad(&grads).expect("the sum is tracked"));
        let [x_grad, skip_grad] = match fused {
            true => [
                read(x.grad(&grads).expect("the input is tracked")),
                read(skip.grad(&grads).expect("the skip is tracked")),
            ],
            false => [sum_grad(), sum_grad()],
        };
        [
            read(out),
            x_grad,
            skip_grad,
            param_grad(&norm.gamma),
            param_grad(&norm.beta),
        ]
    }

    const INSTANCE_NORM_OUTPUTS: [&str; 5] = [
        "output",
        "input gradient",
        "skip gradient",
        "gamma gradient",
        "beta gradient",
    ];

    /// POMO's shapes (CVRP20, CVRP100), odd sizes, and one node per instance (zero
    /// variance).
    const INSTANCE_NORM_SIZES: [[usize; 3]; 4] = [[4, 21, 128], [2, 101, 16], [3, 7, 5], [5, 1, 4]];

    /// Within 1e-5 of Burn's instance norm relative to each tensor's largest entry: output
    /// and every gradient.
    #[cfg(feature = "flex")]
    #[test]
    fn fused_instance_norm_matches_burns_with_gradients() {
        let (sizes, names) = (&INSTANCE_NORM_SIZES, &INSTANCE_NORM_OUTPUTS);
        assert_fused_matches_burns(Backend::Flex, sizes, names, instance_outputs);
    }

    #[cfg(feature = "cpu")]
    crate::cube_launch::for_tests::test_with_64_bit_offsets!(
        cube_instance_norm_matches_burns_with_gradients
    );

    /// The CubeCL kernels on CubeCL's CPU runtime, against Burn's instance norm there.
    #[cfg(feature = "cpu")]
    #[test]
    fn cube_instance_norm_matches_burns_with_gradients() {
        let _alone = crate::test_values::one_cube_test_at_a_time();
        let (sizes, names) = (&INSTANCE_NORM_SIZES, &INSTANCE_NORM_OUTPUTS);
        assert_fused_matches_burns(Backend::Cpu, sizes, names, instance_outputs);
    }

    /// Without autodiff (inference) the fused instance norm gives the output it gives in
    /// training.
    fn assert_instance_norm_same_without_autodiff(backend: Backend) {
        let device = backend.device().unwrap();
        let [b, n, d] = [3, 9, 8];
        let on = |device: &Device| {
            let x = TensorData::new(features(b * n, d), [b * n, d]);
            let x = Tensor::<2>::from_data(x, device);
            let skip = Tensor::<2>::from_data(
                TensorData::new(pseudo_random(b * n * d, 15, 1.0), [b * n, d]),
                device,
            );
            read(instance_norm(&instance_norm_of(d, device), x, skip, n))
        };
        assert_eq!(on(&device), on(&device.clone().autodiff()));
    }

    #[cfg(feature = "flex")]
    #[test]
    fn fused_instance_norm_runs_without_autodiff() {
        assert_instance_norm_same_without_autodiff(Backend::Flex);
    }

    #[cfg(feature = "cpu")]
    #[test]
    fn cube_instance_norm_runs_without_autodiff() {
        let _alone = crate::test_values::one_cube_test_at_a_time();
        assert_instance_norm_same_without_autodiff(Backend::Cpu);
    }
}
