//! [`crate::state::CvrpState::mask`] as one flex operation: one pass over the rows.
//!
//! Composed from Burn's tensor operations the mask is ten operations on `[R, N]` tensors
//! at every decode step, and on flex half of their time went to a `bool_not` of a strided
//! slice (flex's element-by-element path) and a `cat`. In all it was ~5% of a POMO step's
//! CPU time.
//!
//! Only flex has it; elsewhere the op-by-op form in `CvrpState` runs, which the tests
//! compare against. The rule is the same comparison in the same float order, so the masks
//! are the same bit for bit.

use burn::tensor::{Bool, Int, Tensor};

/// What the mask is computed from: the state's tensors.
///
/// # Shapes
/// - `demands`, `visited`: `[R, N]`; `used_capacity`, `capacity`, `last_node`: `[R, 1]`
#[cfg_attr(not(feature = "flex"), allow(dead_code))]
pub(crate) struct MaskInputs {
    pub demands: Tensor<2>,
    pub used_capacity: Tensor<2>,
    pub capacity: Tensor<2>,
    pub visited: Tensor<2, Bool>,
    pub last_node: Tensor<2, Int>,
    pub tolerance: f32,
}

/// The decoder's mask, `[R, N]`, true where a node may not be chosen next: see
/// [`crate::state::CvrpState::mask`]. Call it only where [`crate::backend::runs_on_flex`]
/// holds.
#[cfg(feature = "flex")]
pub(crate) fn fused(inputs: MaskInputs) -> Tensor<2, Bool> {
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
pub(crate) fn fused(_inputs: MaskInputs) -> Tensor<2, Bool> {
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
mod flex_impl {
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::Autodiff;
    use burn::backend::tensor::{BoolTensor, FloatTensor, IntTensor};
    use burn::backend::{Bytes, Flex};
    use burn_flex::{FlexTensor, Layout};

    use super::MaskBackend;
    use crate::row_kernels::floats;

    /// Whether each row's vehicle stands at the depot, from contiguous `[R, 1]` node
    /// indices (flex's ints are i64 or i32).
    fn at_depot(last_node: &FlexTensor) -> Vec<bool> {
        if let Some(nodes) = last_node.as_slice::<i64>() {
            return nodes.iter().map(|&v| v == 0).collect();
        }
        let nodes = last_node.as_slice::<i32>();
        nodes
            .expect("contiguous i32 or i64 node indices")
            .iter()
            .map(|&v| v == 0)
            .collect()
    }

    /// One row's mask over its `N` nodes (written to `out`, 1 = masked), by the rule of
    /// [`crate::state::CvrpState::mask`]: a customer is masked when visited or when
    /// `demand + used > limit` (`limit` = capacity + tolerance, added as the op-by-op form
    /// adds them); the depot when the vehicle stands at it and some customer is not masked.
    fn mask_row(
        demands: &[f32],
        (used, limit): (f32, f32),
        visited: &[u8],
        at_depot: bool,
        out: &mut [u8],
    ) {
        let mut any_customer_feasible = false;
        for ((out, &demand), &visited) in out.iter_mut().zip(demands).zip(visited).skip(1) {
            let masked = visited != 0 || demand + used > limit;
            *out = u8::from(masked);
            any_customer_feasible |= !masked;
        }
        out[0] = u8::from(at_depot && any_customer_feasible);
    }

    impl MaskBackend for Flex {
        fn node_mask(
            demands: FloatTensor<Self>,
            used_capacity: FloatTensor<Self>,
            capacity: FloatTensor<Self>,
            visited: BoolTensor<Self>,
            last_node: IntTensor<Self>,
            tolerance: f32,
        ) -> BoolTensor<Self> {
            let shape = demands.layout().shape().clone();
            let n = shape[1];
            let [demands, used, capacity, visited, last_node] =
                [demands, used_capacity, capacity, visited, last_node].map(|t| t.to_contiguous());
            // `storage::<u8>` checks that the booleans are one byte each.
            let bool_dtype = visited.dtype();
            let (used, capacity) = (floats(&used), floats(&capacity));
            let (start, end) = visited.layout().contiguous_offsets().expect("contiguous");
            let visited_rows = visited.storage::<u8>()[start..end].chunks_exact(n);
            let rows = floats(&demands).chunks_exact(n);
            let mut out = vec![0u8; shape.num_elements()];
            let at_depot = at_depot(&last_node);
            for (r, ((out, demands), visited)) in out
                .chunks_exact_mut(n)
                .zip(rows)
                .zip(visited_rows)
                .enumerate()
            {
                let limit = capacity[r] + tolerance;
                mask_row(demands, (used[r], limit), visited, at_depot[r], out);
            }
            FlexTensor::new(
                Bytes::from_elems(out),
                Layout::contiguous(shape),
                bool_dtype,
            )
        }
    }

    impl<C: CheckpointStrategy> MaskBackend for Autodiff<Flex, C> {
        fn node_mask(
            demands: FloatTensor<Self>,
            used_capacity: FloatTensor<Self>,
            capacity: FloatTensor<Self>,
            visited: BoolTensor<Self>,
            last_node: IntTensor<Self>,
            tolerance: f32,
        ) -> BoolTensor<Self> {
            // The state carries no gradient: the inner tensors, untracked.
            <Flex as MaskBackend>::node_mask(
                demands.into_primitive(),
                used_capacity.into_primitive(),
                capacity.into_primitive(),
                visited,
                last_node,
                tolerance,
            )
        }
    }
}
