use burn::backend::backend_extension;
use burn::backend::tensor::FloatTensor;
#[allow(unused_imports)] // in the Fusion metadata
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;

use super::{cube_kernel, SelfAttentionBackend};

/// The attention core's backward pass on CubeCL, as its own operation: what the
/// autodiff backward of [`SelfAttentionBackend::self_attention`] runs there.
#[backend_extension(Cube, Fusion)]
pub trait SelfAttentionGradsBackend: burn::backend::Backend {
    /// The projection's gradient `[B, N, 3d]` from the output's `grad_out` `[B, N, d]`.
    #[fusion(dtype = qkv, shape = Shape::new([qkv[0], qkv[1], qkv[2]]))]
    fn self_attention_grads(
        qkv: FloatTensor<Self>,
        grad_out: FloatTensor<Self>,
        heads: usize,
    ) -> FloatTensor<Self>;
}

impl SelfAttentionBackend for CubeBackend {
    fn self_attention(qkv: FloatTensor<Self>, heads: usize) -> FloatTensor<Self> {
        cube_kernel::forward(qkv, heads)
    }
}

impl SelfAttentionGradsBackend for CubeBackend {
    fn self_attention_grads(
        qkv: FloatTensor<Self>,
        grad_out: FloatTensor<Self>,
        heads: usize,
    ) -> FloatTensor<Self> {
        cube_kernel::backward(qkv, grad_out, heads)
    }
}

#[cfg(feature = "autodiff")]
mod autodiff {
    use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::autodiff::Autodiff;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::Cube;

    use super::{SelfAttentionBackend, SelfAttentionGradsBackend};

    #[derive(Debug)]
    struct CubeSelfAttentionBackward;

    impl Backward<Cube, 1> for CubeSelfAttentionBackward {
        /// The projection and the head count.
        type State = (FloatTensor<Cube>, usize);

        fn backward(
            self,
            ops: Ops<Self::State, 1>,
            grads: &mut Gradients,
            _checkpointer: &mut Checkpointer,
        ) {
            let (qkv, heads) = ops.state;
            let grad_out = grads.consume::<Cube>(&ops.node);
            let [parent] = ops.parents;
            if let Some(node) = parent {
                let grad = Cube::self_attention_grads(qkv, grad_out, heads);
                grads.register::<Cube>(node.id, grad);
            }
        }
    }

    impl<C: CheckpointStrategy> SelfAttentionBackend for Autodiff<Cube, C> {
        fn self_attention(qkv: FloatTensor<Self>, heads: usize) -> FloatTensor<Self> {
            let node = qkv.node();
            let qkv = qkv.into_primitive();
            let out = Cube::self_attention(qkv.clone(), heads);
            match CubeSelfAttentionBackward
                .prepare::<C>([node])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish((qkv, heads), out),
                OpsKind::UnTracked(prep) => prep.finish(out),
            }
        }
    }
}
