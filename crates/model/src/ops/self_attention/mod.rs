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

#[cfg(feature = "cube")]
mod cube_kernel;
#[cfg(feature = "flex")]
mod flex_kernel;

use burn::tensor::activation::softmax;
use burn::tensor::{Device, Tensor};

use crate::ops::matmul::{product, MatmulPrecision};
use crate::ops::StepKernel;

/// Every head's attention from one `[B, N, 3d]` projection, in `kernel`'s form where the
/// device runs it, products at `p`.
///
/// # Shapes
/// - `qkv`: `[B, N, 3d]` → `[B, N, d]`
pub(crate) fn attend(
    qkv: Tensor<3>,
    heads: usize,
    kernel: StepKernel,
    p: MatmulPrecision,
) -> Tensor<3> {
    let [_, nodes, _] = qkv.dims();
    let device = qkv.device();
    let fuses = kernel == StepKernel::Fused && fused_on(&device, nodes);
    // Both fused cores are exact f32, which `highest` asks of CubeCL's tensor cores; on
    // flex, products are split only where a test asks for `highest` there.
    let exact_enough =
        p == MatmulPrecision::High || crate::runtime::device::runs_through_cubecl(&device);
    match fuses && exact_enough {
        true => fused(qkv, heads),
        false => op_by_op(qkv, heads, p),
    }
}

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
            #[cfg(feature = "cube")]
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
#[cfg(any(feature = "flex", feature = "cube"))]
pub(crate) fn fused(qkv: Tensor<3>, heads: usize) -> Tensor<3> {
    use burn::backend::Dispatch;
    let out = <Dispatch as SelfAttentionBackend>::self_attention(qkv.into_dispatch(), heads);
    Tensor::from_dispatch(out)
}

#[cfg(not(any(feature = "flex", feature = "cube")))]
pub(crate) fn fused(_qkv: Tensor<3>, _heads: usize) -> Tensor<3> {
    unreachable!("no backend with a fused self-attention is compiled in; check `fused_on` first")
}

#[cfg(any(feature = "flex", feature = "cube"))]
pub(crate) use extension::SelfAttentionBackend;

#[cfg(any(feature = "flex", feature = "cube"))]
mod extension {
    use burn::backend::backend_extension;
    use burn::backend::tensor::FloatTensor;
    #[allow(unused_imports)] // in the Fusion metadata, when a CubeCL backend is compiled in
    use burn::tensor::Shape;

    /// The encoder's attention core as a backend operation.
    #[backend_extension(
        Autodiff: cfg(feature = "autodiff"),
        Flex: cfg(feature = "flex"),
        Cube: cfg(feature = "cube"),
        Fusion: cfg(feature = "cube")
    )]
    pub trait SelfAttentionBackend: burn::backend::Backend {
        /// See [`super::fused`].
        #[fusion(dtype = qkv, shape = Shape::new([qkv[0], qkv[1], qkv[2] / 3]))]
        fn self_attention(qkv: FloatTensor<Self>, heads: usize) -> FloatTensor<Self>;
    }
}

#[cfg(feature = "cube")]
mod cube;

#[cfg(feature = "flex")]
mod flex;

#[cfg(all(test, any(feature = "flex", feature = "cpu")))]
mod tests;
