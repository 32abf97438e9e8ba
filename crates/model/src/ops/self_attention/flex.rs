use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::Autodiff;
use burn::backend::tensor::FloatTensor;
use burn::backend::Flex;
use burn_flex::FlexTensor;

use super::flex_kernel::{self, Dims};
use super::SelfAttentionBackend;
use crate::ops::row_kernels::{floats, tensor};

/// The sizes of a contiguous `[B, N, 3d]` projection split into `heads`.
fn dims(qkv: &FlexTensor, heads: usize) -> Dims {
    let shape = qkv.layout().shape();
    Dims {
        nodes: shape[1],
        heads,
        head_dim: shape[2] / 3 / heads,
    }
}

/// The output, and the attention weights kept in `weights` if given.
fn forward(qkv: &FlexTensor, heads: usize, weights: Option<&mut [f32]>) -> FlexTensor {
    let dims = dims(qkv, heads);
    let shape = qkv.layout().shape();
    let shape = [shape[0], shape[1], heads * dims.head_dim];
    tensor(flex_kernel::forward(dims, floats(qkv), weights), shape)
}

impl SelfAttentionBackend for Flex {
    fn self_attention(qkv: FloatTensor<Self>, heads: usize) -> FloatTensor<Self> {
        forward(&qkv.to_contiguous(), heads, None)
    }
}

/// What the backward reads: the (contiguous) projection, the forward's attention
/// weights (recomputing them cost as much as the rest of the backward) and the heads.
#[derive(Debug, Clone)]
struct Saved {
    qkv: FlexTensor,
    weights: Vec<f32>,
    heads: usize,
}

#[derive(Debug)]
struct SelfAttentionBackward;

impl Backward<Flex, 1> for SelfAttentionBackward {
    type State = Saved;

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let Saved {
            qkv,
            weights,
            heads,
        } = ops.state;
        let grad_out = grads.consume::<Flex>(&ops.node).to_contiguous();
        let [parent] = ops.parents;
        if let Some(node) = parent {
            let dims = dims(&qkv, heads);
            let grad = flex_kernel::backward(dims, floats(&qkv), &weights, floats(&grad_out));
            let shape = qkv.layout().shape().clone();
            grads.register::<Flex>(node.id, tensor(grad, shape));
        }
    }
}

impl<C: CheckpointStrategy> SelfAttentionBackend for Autodiff<Flex, C> {
    fn self_attention(qkv: FloatTensor<Self>, heads: usize) -> FloatTensor<Self> {
        let node = qkv.node();
        let qkv = qkv.into_primitive().to_contiguous();
        match SelfAttentionBackward
            .prepare::<C>([node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let instances = qkv.layout().shape()[0];
                let mut weights = vec![0.0; flex_kernel::weights_len(dims(&qkv, heads), instances)];
                let out = forward(&qkv, heads, Some(&mut weights));
                let saved = Saved {
                    qkv,
                    weights,
                    heads,
                };
                prep.finish(saved, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(forward(&qkv, heads, None)),
        }
    }
}
