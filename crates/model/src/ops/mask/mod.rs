//! [`crate::model::state::CvrpState::mask`] as one flex operation: one pass over the rows.
//!
//! Composed from Burn's tensor operations the mask is ten operations on `[R, N]` tensors
//! at every decode step, and on flex half of their time went to a `bool_not` of a strided
//! slice (flex's element-by-element path) and a `cat`. In all it was ~5% of a POMO step's
//! CPU time.
//!
//! Only flex has it; elsewhere the op-by-op form ([`op_by_op`]) runs, which the tests
//! compare against. The rule is the same comparison in the same float order, so the masks
//! are the same bit for bit.

use burn::tensor::{Bool, Int, Tensor};

/// What the mask is computed from: the state's tensors.
///
/// # Shapes
/// - `demands`, `visited`: `[R, N]`; `used_capacity`, `capacity`, `last_node`: `[R, 1]`
pub(crate) struct MaskInputs {
    pub demands: Tensor<2>,
    pub used_capacity: Tensor<2>,
    pub capacity: Tensor<2>,
    pub visited: Tensor<2, Bool>,
    pub last_node: Tensor<2, Int>,
    pub tolerance: f32,
}

/// The decoder's mask, `[R, N]`, true where a node may not be chosen next (the rules in
/// `crate::model::state`): one operation on flex, Burn's tensor operations elsewhere.
pub(crate) fn mask(inputs: MaskInputs) -> Tensor<2, Bool> {
    match crate::runtime::device::runs_on_flex(&inputs.demands.device()) {
        true => fused(inputs),
        false => op_by_op(inputs),
    }
}

/// [`mask`] in Burn's tensor operations: what backends other than flex run, and the
/// reference the fused form is tested against.
pub(crate) fn op_by_op(inputs: MaskInputs) -> Tensor<2, Bool> {
    let MaskInputs {
        demands,
        used_capacity,
        capacity,
        visited,
        last_node,
        tolerance,
    } = inputs;
    let [b, n] = demands.dims();
    // `demand + load > capacity`, added in this order: Kool's float32 test exactly.
    let too_heavy = (demands + used_capacity.expand([b, n]))
        .greater(capacity.add_scalar(tolerance).expand([b, n])); // [B, N]
    let customer_mask = visited.bool_or(too_heavy).slice([0..b, 1..n]); // [B, n]
    let any_customer_feasible = customer_mask.clone().bool_not().any_dim(1); // [B, 1]
    let at_depot = last_node.equal_elem(0); // [B, 1]
    let depot_mask = at_depot.bool_and(any_customer_feasible); // [B, 1]
    Tensor::cat(vec![depot_mask, customer_mask], 1)
}

/// The fused form of [`mask`]; call it only on flex.
#[cfg(feature = "flex")]
fn fused(inputs: MaskInputs) -> Tensor<2, Bool> {
    use burn::backend::Dispatch;
    let out = <Dispatch as MaskBackend>::node_mask(
        inputs.demands.into_dispatch(),
        inputs.used_capacity.into_dispatch(),
        inputs.capacity.into_dispatch(),
        inputs.visited.into_dispatch(),
        inputs.last_node.into_dispatch(),
        inputs.tolerance,
    );
    Tensor::from_dispatch(out)
}

#[cfg(not(feature = "flex"))]
fn fused(_inputs: MaskInputs) -> Tensor<2, Bool> {
    unreachable!("flex is not compiled in; check `runs_on_flex` first")
}

#[cfg(feature = "flex")]
use extension::MaskBackend;

#[cfg(feature = "flex")]
mod extension {
    use burn::backend::backend_extension;
    use burn::backend::tensor::{BoolTensor, FloatTensor, IntTensor};

    /// The decoder's mask as a backend operation (no gradient: its inputs are the state).
    #[backend_extension(Autodiff: cfg(feature = "autodiff"), Flex: cfg(feature = "flex"))]
    pub trait MaskBackend: burn::backend::Backend {
        /// See [`super::fused`].
        fn node_mask(
            demands: FloatTensor<Self>,
            used_capacity: FloatTensor<Self>,
            capacity: FloatTensor<Self>,
            visited: BoolTensor<Self>,
            last_node: IntTensor<Self>,
            tolerance: f32,
        ) -> BoolTensor<Self>;
    }
}

#[cfg(feature = "flex")]
mod flex;
#[cfg(feature = "flex")]
pub(crate) use flex::{node_masks, MaskIn};
