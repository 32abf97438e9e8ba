use burn::backend::backend_extension;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;

use super::cube_kernel as norm_kernel;
use super::NormBackend;

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
        let [x_grad, gamma_grad, beta_grad] = norm_kernel::backward(inputs, epsilon, group_rows);
        (x_grad, gamma_grad, beta_grad)
    }
}

#[cfg(feature = "autodiff")]
mod autodiff {
    use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
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

        fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
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
