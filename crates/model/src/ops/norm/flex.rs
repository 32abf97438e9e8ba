use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::Autodiff;
use burn::backend::tensor::FloatTensor;
use burn::backend::{AutodiffBackend, Flex};
use burn::tensor::Shape;
use burn_flex::FlexTensor;

use super::flex_kernel;
use super::NormBackend;
use crate::ops::row_kernels::{floats, tensor};

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
        let (group_mean, group_variance) = flex_kernel::moments(group, d);
        let group_inv_std = flex_kernel::inverse_std(&group_variance, epsilon);
        let affine = [&group_mean[..], &group_inv_std, floats(gamma), floats(beta)];
        flex_kernel::normalise(group, affine, &mut out);
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
            flex_kernel::backward(x, grad, stats, &mut x_grad, &mut sums);
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
