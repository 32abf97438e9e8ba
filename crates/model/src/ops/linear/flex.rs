use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, NodeGuard, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::backend::tensor::FloatTensor;
use burn::backend::Flex;
use burn_flex::FlexTensor;

use super::flex_kernel::{column_sums, product, Strided};
use super::LinearBackend;
use crate::ops::row_kernels::{floats, tensor};

fn sizes(x: &FlexTensor, weight: &FlexTensor) -> [usize; 3] {
    let (x, w) = (x.layout().shape(), weight.layout().shape());
    assert_eq!(
        x[1], w[0],
        "linear: {} input features, weight of {}",
        x[1], w[0]
    );
    [x[0], w[0], w[1]]
}

fn forward(x: &FlexTensor, weight: &FlexTensor, bias: Option<&FlexTensor>) -> FlexTensor {
    let [rows, d_in, d_out] = sizes(x, weight);
    let out = product(
        [rows, d_out, d_in],
        bias.map(floats),
        Strided::rows(floats(x), d_in),
        Strided::rows(floats(weight), d_out),
    );
    tensor(out, [rows, d_out])
}

impl LinearBackend for Flex {
    fn linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let bias = bias.to_contiguous();
        forward(&x.to_contiguous(), &weight.to_contiguous(), Some(&bias))
    }

    fn linear_without_bias(x: FloatTensor<Self>, weight: FloatTensor<Self>) -> FloatTensor<Self> {
        forward(&x.to_contiguous(), &weight.to_contiguous(), None)
    }
}

/// The gradients of `x·W (+ b)` for the parents that are tracked.
/// `parents`: the input's, the weight's and the bias's (if any) node ids.
fn register_grads(
    (x, weight): &(FlexTensor, FlexTensor),
    grad_out: FlexTensor,
    parents: [Option<NodeId>; 3],
    grads: &mut Gradients,
) {
    let [rows, d_in, d_out] = sizes(x, weight);
    let grad_out = grad_out.to_contiguous();
    let grad_out = floats(&grad_out);
    let [x_id, weight_id, bias_id] = parents;
    let mut register = |id: Option<NodeId>, values: Vec<f32>, shape: Vec<usize>| {
        if let Some(id) = id {
            grads.register::<Flex>(id, tensor(values, shape));
        }
    };
    if x_id.is_some() {
        let w_t = Strided::transposed(floats(weight), d_out); // [out, in]
        let grad = product(
            [rows, d_in, d_out],
            None,
            Strided::rows(grad_out, d_out),
            w_t,
        );
        register(x_id, grad, vec![rows, d_in]);
    }
    if weight_id.is_some() {
        let x_t = Strided::transposed(floats(x), d_in); // [in, R]
        let grad = product(
            [d_in, d_out, rows],
            None,
            x_t,
            Strided::rows(grad_out, d_out),
        );
        register(weight_id, grad, vec![d_in, d_out]);
    }
    if bias_id.is_some() {
        register(bias_id, column_sums(grad_out, d_out), vec![d_out]);
    }
}

/// The backward of `x·W (+ b)`, for N = 3 parents (input, weight, bias) or 2 (no bias).
#[derive(Debug)]
struct LinearBackward<const N: usize>;

impl<const N: usize> Backward<Flex, N> for LinearBackward<N> {
    /// The (contiguous) input and weight.
    type State = (FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad_out = grads.consume::<Flex>(&ops.node);
        let mut parents = [None; 3];
        for (id, parent) in parents.iter_mut().zip(&ops.parents) {
            *id = parent.as_ref().map(|node| node.id);
        }
        register_grads(&ops.state, grad_out, parents, grads);
    }
}

/// The product, recorded for the backward when any of `nodes` (the input's, the
/// weight's and, with a bias, the bias's) is tracked.
fn tracked<C: CheckpointStrategy, const N: usize>(
    nodes: [NodeGuard; N],
    x: FlexTensor,
    weight: FlexTensor,
    bias: Option<FlexTensor>,
) -> FloatTensor<Autodiff<Flex, C>> {
    let (x, weight) = (x.to_contiguous(), weight.to_contiguous());
    let bias = bias.map(|b| b.to_contiguous());
    let out = forward(&x, &weight, bias.as_ref());
    match LinearBackward::<N>
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish((x, weight), out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

impl<C: CheckpointStrategy> LinearBackend for Autodiff<Flex, C> {
    fn linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let nodes = [x.node(), weight.node(), bias.node()];
        let [x, weight, bias] = [x, weight, bias].map(|t| t.into_primitive());
        tracked::<C, 3>(nodes, x, weight, Some(bias))
    }

    fn linear_without_bias(x: FloatTensor<Self>, weight: FloatTensor<Self>) -> FloatTensor<Self> {
        let nodes = [x.node(), weight.node()];
        tracked::<C, 2>(nodes, x.into_primitive(), weight.into_primitive(), None)
    }
}
