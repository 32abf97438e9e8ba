//! The encoder's attention core, `softmax(q·kᵀ / √dk)·v` for every head, as one
//! differentiable operation on flex and CubeCL devices, from the attention's projection
//! `[B, N, 3d]` straight to the heads' outputs side by side `[B, N, d]`.
//!
//! Composed from Burn's tensor ops it is a split into heads (a transposed copy), two
//! batched products of `[N, dk]` blocks, a softmax that autodiff turns into 5–6 tracked
//! operations, and a transposed copy back; and as many again in the backward. At CVRP10's
//! 11 nodes those are thousands of tiny matrix products per call on flex, and ~25 kernel
//! launches a layer on CubeCL. As one operation it is one pass over the instances each
//! way: split across cores by instance on flex ([`flex_kernel`]), a kernel each way on
//! CubeCL ([`cube_kernel`]).
//!
//! Elsewhere (ndarray, and with `model.encoder_attention = "op-by-op"`) the op-by-op form
//! runs, [`op_by_op`], which the tests compare against.

#[cfg(any(feature = "cuda", feature = "cpu"))]
mod cube_kernel;
#[cfg(feature = "flex")]
mod flex_kernel;

use burn::tensor::activation::softmax;
use burn::tensor::{Device, Tensor};

use crate::matmul::{product, MatmulPrecision};

/// Every head's attention from one `[B, N, 3d]` projection (queries, keys, values, each
/// head-major), with Burn's tensor operations (the reference), products at `precision`.
///
/// # Shapes
/// - `qkv`: `[B, N, 3d]` → `[B, N, d]`
pub(crate) fn op_by_op(qkv: Tensor<3>, heads: usize, precision: MatmulPrecision) -> Tensor<3> {
    let [b, n, three_d] = qkv.dims();
    let d = three_d / 3;
    let dk = d / heads;
    // Heads split by views only: squeezing a permuted [3, B, H, N, dk] would copy it.
    let qkv = qkv.reshape([b, n, 3 * heads, dk]).swap_dims(1, 2); // [B, 3H, N, dk]
    let q = qkv.clone().slice_dim(1, 0..heads); // [B, H, N, dk]
    let k = qkv.clone().slice_dim(1, heads..2 * heads);
    let v = qkv.slice_dim(1, 2 * heads..3 * heads);
    let compatibility = product(q, k.swap_dims(2, 3), precision) / (dk as f64).sqrt(); // [B, H, N, N]
    let attended = product(softmax(compatibility, 3), v, precision); // [B, H, N, dk]
    attended.swap_dims(1, 2).reshape([b, n, d]) // [B, N, d]
}

/// Whether the fused form runs on `device` (with or without autodiff) for instances of
/// `nodes` nodes: on flex, and on CubeCL devices up to the backward's shared memory.
pub(crate) fn fused_on(device: &Device, nodes: usize) -> bool {
    use burn::backend::DispatchDevice;
    fn has_kernel(device: &DispatchDevice, nodes: usize) -> bool {
        let _ = nodes;
        match device {
            #[cfg(feature = "flex")]
            DispatchDevice::Flex(_) => true,
            #[cfg(any(feature = "cuda", feature = "cpu"))]
            DispatchDevice::Cube(_) => cube_kernel::fits(nodes),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
    match device.as_dispatch() {
        #[cfg(feature = "autodiff")]
        DispatchDevice::Autodiff(inner) => has_kernel(inner, nodes),
        other => has_kernel(other, nodes),
    }
}

/// The fused form of [`op_by_op`], its sums in f32 (exact at every precision); call it
/// only where [`fused_on`] holds.
///
/// # Shapes
/// - `qkv`: `[B, N, 3d]` → `[B, N, d]`
#[cfg(any(feature = "flex", feature = "cuda", feature = "cpu"))]
pub(crate) fn fused(qkv: Tensor<3>, heads: usize) -> Tensor<3> {
    use burn::backend::Dispatch;
    let out = <Dispatch as SelfAttentionBackend>::self_attention(qkv.into_dispatch(), heads);
    Tensor::from_dispatch(out)
}

#[cfg(not(any(feature = "flex", feature = "cuda", feature = "cpu")))]
pub(crate) fn fused(_qkv: Tensor<3>, _heads: usize) -> Tensor<3> {
    unreachable!("no backend with a fused self-attention is compiled in; check `fused_on` first")
}

#[cfg(any(feature = "flex", feature = "cuda", feature = "cpu"))]
pub(crate) use extension::SelfAttentionBackend;

#[cfg(any(feature = "flex", feature = "cuda", feature = "cpu"))]
mod extension {
    use burn::backend::backend_extension;
    use burn::backend::tensor::FloatTensor;
    #[allow(unused_imports)] // in the Fusion metadata, when a CubeCL backend is compiled in
    use burn::tensor::Shape;

    /// The encoder's attention core as a backend operation.
    #[backend_extension(
        Autodiff: cfg(feature = "autodiff"),
        Flex: cfg(feature = "flex"),
        Cube: cfg(any(feature = "cuda", feature = "cpu")),
        Fusion: cfg(any(feature = "cuda", feature = "cpu"))
    )]
    pub trait SelfAttentionBackend: burn::backend::Backend {
        /// See [`super::fused`].
        #[fusion(dtype = qkv, shape = Shape::new([qkv[0], qkv[1], qkv[2] / 3]))]
        fn self_attention(qkv: FloatTensor<Self>, heads: usize) -> FloatTensor<Self>;
    }
}

#[cfg(any(feature = "cuda", feature = "cpu"))]
mod cube_impl {
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
        use burn::backend::autodiff::checkpoint::{
            base::Checkpointer, strategy::CheckpointStrategy,
        };
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
}

#[cfg(feature = "flex")]
mod flex_impl {
    use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::autodiff::Autodiff;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::Flex;
    use burn_flex::FlexTensor;

    use super::flex_kernel::{self, Dims};
    use super::SelfAttentionBackend;
    use crate::row_kernels::{floats, tensor};

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
                    let mut weights =
                        vec![0.0; flex_kernel::weights_len(dims(&qkv, heads), instances)];
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
}

#[cfg(all(test, any(feature = "flex", feature = "cpu")))]
mod tests {
    use burn::tensor::{Device, TensorData};

    use super::*;
    use crate::backend::Backend;
    use crate::test_values::{assert_close, pseudo_random, read, weighted_loss_grads};

    /// The output and the projection's gradient under a loss that weighs every output
    /// entry differently, fused or op by op, on the same inputs.
    fn output_and_grad(device: &Device, size: [usize; 4], fused: bool) -> [Vec<f32>; 2] {
        let [b, n, heads, dk] = size;
        let d = heads * dk;
        // Scale 3 gives scores of up to ~dk·9/√dk: peaked softmaxes as well as flat ones.
        let data = TensorData::new(pseudo_random(b * n * 3 * d, 1, 3.0), [b, n, 3 * d]);
        let qkv = Tensor::<3>::from_data(data, device).require_grad();
        let out = if fused {
            self::fused(qkv.clone(), heads)
        } else {
            op_by_op(qkv.clone(), heads, MatmulPrecision::High)
        };
        let grads = weighted_loss_grads(&out, 2);
        let grad = qkv.grad(&grads).expect("the projection is tracked");
        [read(out), read(grad)]
    }

    /// Within 1e-5 of the op-by-op form on `device` relative to each tensor's largest
    /// entry, on sizes with and without node padding, one and several heads, head sizes
    /// that are and are not whole 8-lane vectors, the shipped models' (8 × 16) at CVRP10
    /// and CVRP100 (more rows than a cube has units), a single node.
    fn assert_fused_matches_op_by_op(device: &Device) {
        assert!(
            fused_on(device, 101),
            "the test runs where the fused form exists"
        );
        for size in [
            [3, 11, 8, 16],
            [2, 8, 1, 8],
            [4, 5, 2, 6],
            [2, 101, 8, 16],
            [1, 1, 4, 4],
        ] {
            let fused = output_and_grad(device, size, true);
            let reference = output_and_grad(device, size, false);
            for (what, theirs) in ["output", "gradient"].iter().zip(&reference) {
                assert!(
                    theirs.iter().any(|&x| x != 0.0),
                    "{size:?} {what}: the reference is all zero"
                );
            }
            let names = ["output", "gradient"];
            assert_close(&fused, &reference, &names, &format!("{size:?}"), 1e-5);
        }
    }

    #[cfg(feature = "flex")]
    #[test]
    fn fused_self_attention_matches_op_by_op() {
        let device = Backend::Flex.device().unwrap().autodiff();
        assert_fused_matches_op_by_op(&device);
    }

    #[cfg(feature = "cpu")]
    crate::cube_launch::for_tests::test_with_64_bit_offsets!(cube_self_attention_matches_op_by_op);

    /// The CubeCL kernels on CubeCL's CPU runtime, against the op-by-op form on the same
    /// device. Runs where the `cpu` feature is built (`cargo xtask test-cpu cube_`).
    #[cfg(feature = "cpu")]
    #[test]
    fn cube_self_attention_matches_op_by_op() {
        let _alone = crate::test_values::one_cube_test_at_a_time();
        let device = Backend::Cpu.device().unwrap().autodiff();
        assert_fused_matches_op_by_op(&device);
    }

    /// Without autodiff the CubeCL kernel gives the same output as with it, and the same
    /// output on every run.
    #[cfg(feature = "cpu")]
    #[test]
    fn cube_self_attention_runs_without_autodiff() {
        let _alone = crate::test_values::one_cube_test_at_a_time();
        let device = Backend::Cpu.device().unwrap();
        assert_same_without_autodiff(&device);
    }

    /// Work is split by instance and every sum taken in one order: one thread and three
    /// give the same output and gradient, bit for bit.
    #[cfg(feature = "flex")]
    #[test]
    fn fused_self_attention_does_not_depend_on_the_thread_count() {
        let device = Backend::first_on_host()
            .unwrap()
            .device()
            .unwrap()
            .autodiff();
        let on = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool");
            pool.install(|| output_and_grad(&device, [7, 13, 4, 8], true))
        };
        assert_eq!(on(1), on(3));
    }

    /// Without autodiff the fused form gives the same output as with it.
    #[cfg(feature = "flex")]
    #[test]
    fn fused_self_attention_runs_without_autodiff() {
        let device = Backend::Flex.device().unwrap();
        assert_same_without_autodiff(&device);
    }

    fn assert_same_without_autodiff(device: &Device) {
        assert!(fused_on(device, 9));
        let (b, n, heads, dk) = (2, 9, 4, 8);
        let values = pseudo_random(b * n * 3 * heads * dk, 3, 1.0);
        let on = |device: &Device| {
            let data = TensorData::new(values.clone(), [b, n, 3 * heads * dk]);
            let qkv = Tensor::<3>::from_data(data, device);
            let out = fused(qkv, heads).into_data();
            out.try_to_vec::<f32>().expect("f32")
        };
        let plain = on(device);
        assert_eq!(plain, on(&device.clone().autodiff()));
        assert_eq!(plain, on(device));
    }
}
