//! The encoder's node embedding on CubeCL devices as one operation each way: the depot's
//! `Linear(2, d)` on its [x, y] and each customer's `Linear(3, d)` on its [x, y, demand
//! fraction], written as the rows `[B × N, d]` the layers read.
//!
//! In Burn's operations that was eleven launches forward (the demand fraction's division,
//! three slices, a `cat` of the customers' features, two products, two bias additions fused
//! with nothing, the depot's and customers' `cat`) and five or six backward (the weights'
//! products with their transposed copies, the biases' sums). Here it is one kernel forward,
//! a unit an output entry, and one backward, a cube a feature whose units walk the rows
//! (its partial sums added in unit order: the same numbers on every run). A product's two
//! or three terms are fused multiply-adds in f32 (whatever the tensors' type) in feature
//! order, then the bias is added, as flex's and the CPU runtime's matmuls make them (on
//! the stand-in two epochs' costs are unchanged, and losses and gradient norms move by
//! ~1e-6 relative: the weight gradients sum in another order); CUDA's matmul ran them on
//! TF32 tensor cores. flex and ndarray keep Burn's operations, which the tests compare
//! against.

use burn::nn::Linear;
use burn::tensor::{Device, Tensor};

use crate::ops::linear::per_node;
use crate::ops::matmul::MatmulPrecision;

/// Every node's embedding as a row: one operation each way on CubeCL devices, Burn's
/// linear layers elsewhere ([`embed_op_by_op`]), products at `p`.
///
/// # Shapes
/// - `coords`: `[B, N, 2]` (depot first), `demands`: `[B, N]`, `capacity`: `[B, 1]` →
///   `[B × N, d]`
pub(crate) fn embed_rows(
    depot: &Linear,
    customer: &Linear,
    coords: Tensor<3>,
    [demands, capacity]: [Tensor<2>; 2],
    p: MatmulPrecision,
) -> Tensor<2> {
    match fused_on(&coords.device(), depot, customer) {
        true => embed(depot, customer, coords, [demands, capacity]),
        // The demand fraction as `DeviceBatch::demand_fraction` makes it.
        false => embed_op_by_op(depot, customer, coords, demands / capacity, p),
    }
}

/// Whether [`embed`] runs on `device` (with or without autodiff): CubeCL devices, for
/// layers with biases (Kool's and rl4co's).
pub(crate) fn fused_on(device: &Device, depot: &Linear, customer: &Linear) -> bool {
    crate::runtime::device::runs_through_cubecl(device)
        && depot.bias.is_some()
        && customer.bias.is_some()
}

/// Every node's embedding as a row: `depot` on the depot's [x, y], `customer` on each
/// customer's [x, y, demand / capacity] (the fraction divided in the kernel, as a
/// division of the tensors rounds it); call it only where [`fused_on`] holds.
///
/// # Shapes
/// - `coords`: `[B, N, 2]` (depot first), `demands`: `[B, N]`, `capacity`: `[B, 1]` →
///   `[B × N, d]`
pub(crate) fn embed(
    depot: &Linear,
    customer: &Linear,
    coords: Tensor<3>,
    [demands, capacity]: [Tensor<2>; 2],
) -> Tensor<2> {
    #[cfg(feature = "cube")]
    {
        use burn::backend::Dispatch;
        let bias = |linear: &Linear| {
            let bias = linear.bias.as_ref().expect("`fused_on` checks the biases");
            bias.val().into_dispatch()
        };
        let out = <Dispatch as cube::NodeEmbeddingBackend>::embed_nodes(
            coords.into_dispatch(),
            demands.into_dispatch(),
            capacity.into_dispatch(),
            depot.weight.val().into_dispatch(),
            bias(depot),
            customer.weight.val().into_dispatch(),
            bias(customer),
        );
        Tensor::from_dispatch(out)
    }
    #[cfg(not(feature = "cube"))]
    {
        let _ = (depot, customer, coords, demands, capacity);
        unreachable!("no CubeCL backend is compiled in; check `fused_on` first")
    }
}

#[cfg(feature = "cube")]
mod cube;

/// The CubeCL kernels.
#[cfg(feature = "cube")]
mod cube_kernel;

#[cfg(all(test, feature = "cpu"))]
mod tests;

/// The node embedding in Burn's operations, the products at `p`: the reference, and what
/// flex and ndarray run.
///
/// # Shapes
/// - `coords`: `[B, N, 2]` (depot first), `demand_fraction`: `[B, N]` → `[B × N, d]`
pub(crate) fn embed_op_by_op(
    depot: &Linear,
    customer: &Linear,
    coords: Tensor<3>,
    demand_fraction: Tensor<2>,
    p: MatmulPrecision,
) -> Tensor<2> {
    let [b, n, _] = coords.dims();
    let depot = per_node(depot, coords.clone().slice([0..b, 0..1]), p); // [B, 1, d]
    let customer_features = Tensor::cat(
        vec![
            coords.slice([0..b, 1..n]),
            demand_fraction.slice([0..b, 1..n]).unsqueeze_dim::<3>(2),
        ],
        2,
    ); // [B, n, 3]
    let customers = per_node(customer, customer_features, p); // [B, n, d]
    let h = Tensor::cat(vec![depot, customers], 1); // [B, N, d]
    let [_, _, d] = h.dims();
    h.reshape([b * n, d])
}
