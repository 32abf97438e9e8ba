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
//! (`crate::ops::norm::cube_kernel`), each norm of `x + skip`, the skip connection before it; batch
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
    crate::runtime::device::runs_on_flex(device)
        || crate::runtime::device::runs_through_cubecl(device)
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
#[cfg(any(feature = "flex", feature = "cube"))]
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

#[cfg(not(any(feature = "flex", feature = "cube")))]
fn fused(
    _x_and_skip: [Tensor<2>; 2],
    _gamma: Tensor<1>,
    _beta: Tensor<1>,
    _epsilon: f64,
    _group_rows: usize,
) -> (Tensor<2>, Tensor<2>, Tensor<2>) {
    unreachable!("no backend with fused normalisation is compiled in; check `fused_on` first")
}

#[cfg(any(feature = "flex", feature = "cube"))]
use extension::NormBackend;

#[cfg(any(feature = "flex", feature = "cube"))]
mod extension {
    use burn::backend::backend_extension;
    use burn::backend::tensor::FloatTensor;

    /// Normalisation over groups of rows, as a backend operation.
    #[backend_extension(
        Autodiff: cfg(feature = "autodiff"),
        Flex: cfg(feature = "flex"),
        Cube: cfg(feature = "cube"),
        Fusion: cfg(feature = "cube")
    )]
    pub trait NormBackend: burn::backend::Backend {
        /// See [`super::fused`].
        #[fusion(meta = super::cube::norm_metadata)]
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

#[cfg(feature = "cube")]
mod cube;
#[cfg(feature = "cube")]
mod cube_kernel;

/// The loops over a row-major `[R, d]` matrix. Sums are taken row after row in f64, one
/// order whatever the thread count.
#[cfg(feature = "flex")]
mod flex_kernel;

#[cfg(feature = "flex")]
mod flex;

#[cfg(all(test, any(feature = "flex", feature = "cpu")))]
mod tests;
