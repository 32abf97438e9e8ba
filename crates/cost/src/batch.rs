//! Costing and validating a whole decoded batch: the `[B, T]` action array a decoder
//! returns, with the batch's coordinates `[B, N, 2]` (N = n + 1 nodes, depot first).

use rayon::prelude::*;
use thiserror::Error;

use crate::action::ActionIndex;
use crate::error::SolutionError;
use crate::validate::validate_actions_with;

/// Below this many edges (B × T) a batch is costed on the calling thread: spawning rayon
/// work costs more than it saves. Chosen from the `cost` bench (see README).
pub const PARALLEL_MIN_EDGES: usize = 1 << 15;

/// A batch entry that could not be costed or validated.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BatchError {
    #[error("batch shape mismatch: {0}")]
    Shape(String),
    #[error("instance {instance} of the batch: {error}")]
    Invalid {
        instance: usize,
        error: SolutionError,
    },
}

fn check_shape(
    actions_len: usize,
    steps: usize,
    coords_or_demands_len: usize,
    per_node: usize,
    num_nodes: usize,
) -> Result<usize, BatchError> {
    if steps == 0 || !actions_len.is_multiple_of(steps) {
        return Err(BatchError::Shape(format!(
            "{actions_len} actions are not a whole number of rows of {steps} steps"
        )));
    }
    let b = actions_len / steps;
    if coords_or_demands_len != b * num_nodes * per_node {
        return Err(BatchError::Shape(format!(
            "expected {} node values for {b} instances of {num_nodes} nodes, got {coords_or_demands_len}",
            b * num_nodes * per_node
        )));
    }
    Ok(b)
}

/// Exact Euclidean cost of each row of `actions` (`[B, steps]`, row-major) against `coords`
/// (`[B, num_nodes, 2]` f32, row-major), written to a new `Vec` of `B` costs.
///
/// Only indices are checked here (an index outside `0..num_nodes` is an error); feasibility
/// is [`validate_batch`]'s job. Padding (depot to depot) costs nothing.
pub fn batch_costs<A: ActionIndex>(
    actions: &[A],
    steps: usize,
    coords: &[f32],
    num_nodes: usize,
) -> Result<Vec<f64>, BatchError> {
    let b = check_shape(actions.len(), steps, coords.len(), 2, num_nodes)?;
    let row_cost = |i: usize| -> Result<f64, BatchError> {
        let xy = &coords[i * num_nodes * 2..(i + 1) * num_nodes * 2];
        let row = &actions[i * steps..(i + 1) * steps];
        route_row_cost(row, xy, num_nodes).map_err(|(position, index)| BatchError::Invalid {
            instance: i,
            error: SolutionError::IndexOutOfRange {
                route: 0,
                position,
                index,
                n: num_nodes - 1,
            },
        })
    };
    if b * steps >= PARALLEL_MIN_EDGES {
        (0..b).into_par_iter().map(row_cost).collect()
    } else {
        (0..b).map(row_cost).collect()
    }
}

/// Cost of one action row; on a bad index returns `(position, index)`.
#[inline]
fn route_row_cost<A: ActionIndex>(
    row: &[A],
    xy: &[f32],
    num_nodes: usize,
) -> Result<f64, (usize, i64)> {
    let (mut px, mut py) = (xy[0] as f64, xy[1] as f64);
    let mut total = 0.0f64;
    // Trailing padding (depot to depot) costs nothing: stop at the last customer visit.
    let end = row
        .iter()
        .rposition(|a| a.to_i64() != 0)
        .map_or(0, |p| p + 1);
    for (position, &a) in row[..end].iter().enumerate() {
        let index = a.to_i64();
        if index as u64 >= num_nodes as u64 {
            return Err((position, index));
        }
        let k = index as usize * 2;
        let (x, y) = (xy[k] as f64, xy[k + 1] as f64);
        let (dx, dy) = (x - px, y - py);
        // sqrt(dx²+dy²) rather than hypot: hypot's overflow care costs 5–10× here and
        // coordinates are O(1).
        total += (dx * dx + dy * dy).sqrt();
        (px, py) = (x, y);
    }
    // Back to the depot from the last customer.
    let (dx, dy) = (xy[0] as f64 - px, xy[1] as f64 - py);
    Ok(total + (dx * dx + dy * dy).sqrt())
}

/// Validates every row of `actions` (`[B, steps]`) against per-instance node demands
/// (`[B, num_nodes]`, depot first) and capacities (`[B]`). Returns the first infeasible
/// instance.
pub fn validate_batch<A: ActionIndex>(
    actions: &[A],
    steps: usize,
    node_demands: &[u32],
    capacities: &[u32],
    num_nodes: usize,
) -> Result<(), BatchError> {
    let b = check_shape(actions.len(), steps, node_demands.len(), 1, num_nodes)?;
    if capacities.len() != b {
        return Err(BatchError::Shape(format!(
            "expected {b} capacities, got {}",
            capacities.len()
        )));
    }
    let mut seen = Vec::with_capacity(num_nodes);
    for i in 0..b {
        let row = &actions[i * steps..(i + 1) * steps];
        let demands = &node_demands[i * num_nodes..(i + 1) * num_nodes];
        validate_actions_with(row, demands, capacities[i], &mut seen)
            .map_err(|error| BatchError::Invalid { instance: i, error })?;
    }
    Ok(())
}
