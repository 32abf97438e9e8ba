use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::Autodiff;
use burn::backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn::backend::{Bytes, Flex};
use burn_flex::{FlexTensor, Layout};

use super::MaskBackend;
use crate::ops::row_kernels::floats;

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
/// [`crate::model::state::CvrpState::mask`]: a customer is masked when visited or when
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
        // `|`, not `||`: without a branch on `visited` (as unpredictable as the tours
        // are) the loop vectorises; a CVRP100 POMO step spent ~5% of its time here.
        let masked = (visited != 0) | (demand + used > limit);
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
