use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::Autodiff;
use burn::backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn::backend::{Bytes, Flex};
use burn_flex::{FlexTensor, Layout};

use super::MaskBackend;
use crate::ops::row_kernels::{floats, node_indices, simd_dispatch, MulAdd};

/// Whether each row's vehicle stands at the depot, from contiguous `[R, 1]` node
/// indices.
fn at_depot(last_node: &FlexTensor) -> Vec<bool> {
    node_indices(last_node).iter().map(|&v| v == 0).collect()
}

/// One row's mask over its `N` nodes (written to `out`, 1 = masked), by the rule of
/// [`crate::model::state::CvrpState::mask`]: a customer is masked when visited or when
/// `demand + used > limit` (`limit` = capacity + tolerance, added as the op-by-op form
/// adds them); the depot when the vehicle stands at it and some customer is not masked.
#[inline(always)]
fn mask_row(
    demands: &[f32],
    (used, limit): (f32, f32),
    visited: &[u8],
    at_depot: bool,
    out: &mut [u8],
) {
    let (depot, customers) = out.split_at_mut(1);
    let len = customers.len();
    let (demands, visited) = (&demands[1..=len], &visited[1..=len]);
    // Bytes, not bools, and no branch: the loop vectorises (with `.skip(1)` on a zip and a
    // `bool` accumulator it ran one customer at a time, ~3.6% of a CVRP100 POMO step).
    let mut open = 0u8;
    for c in 0..len {
        let masked = u8::from(visited[c] != 0) | u8::from(demands[c] + used > limit);
        customers[c] = masked;
        open |= masked ^ 1;
    }
    depot[0] = u8::from(at_depot && open != 0);
}

/// Every row's mask `[R, N]`: `demands` and `visited` `[R, N]`, `used` and `capacity` `[R]`.
pub(crate) struct MaskIn<'a> {
    pub nodes: usize,
    pub demands: &'a [f32],
    pub visited: &'a [u8],
    pub used: &'a [f32],
    pub capacity: &'a [f32],
    pub tolerance: f32,
    pub at_depot: &'a [bool],
}

simd_dispatch! {
    /// [`mask_rows`] compiled for the widest vectors the CPU has.
    fn mask_rows_dispatch => mask_rows(x: &MaskIn, out: &mut [u8])
}

/// Every row's mask into `out` (`[R, N]`, 1 = masked): what [`MaskBackend::node_mask`]
/// gives, on slices (flex's whole decode masks its rows with it too).
pub(crate) fn node_masks(x: &MaskIn, out: &mut [u8]) {
    mask_rows_dispatch(x, out);
}

/// Row by row, [`mask_row`]. `M` is unused: what the dispatch gives is the loop compiled
/// with the CPU's vector width (its target features), which LLVM then vectorises.
#[inline(always)]
fn mask_rows<M: MulAdd>(x: &MaskIn, out: &mut [u8]) {
    let n = x.nodes;
    let rows = (out.chunks_exact_mut(n))
        .zip(x.demands.chunks_exact(n))
        .zip(x.visited.chunks_exact(n));
    for (r, ((out, demands), visited)) in rows.enumerate() {
        let limit = (x.used[r], x.capacity[r] + x.tolerance);
        mask_row(demands, limit, visited, x.at_depot[r], out);
    }
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
        let used = floats(&used);
        let (start, end) = visited.layout().contiguous_offsets().expect("contiguous");
        let x = MaskIn {
            nodes: n,
            demands: floats(&demands),
            visited: &visited.storage::<u8>()[start..end],
            used,
            capacity: floats(&capacity),
            tolerance,
            at_depot: &at_depot(&last_node),
        };
        let mut out = vec![0u8; shape.num_elements()];
        mask_rows_dispatch(&x, &mut out);
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
