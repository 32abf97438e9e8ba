//! A decoder step's query from each row's context, and the context's gradients from the
//! query's, on flex: what the step's operation from the context (`ContextStepBackend`)
//! does around the step's kernel.
//!
//! Composed from Burn's operations, a query was a `select` of each row's node context,
//! a broadcast product with the capacity's weight row and two broadcast sums, each
//! writing `[R, d]`, and their backward four more passes and a scatter into zeros, ~7% of
//! a POMO CVRP100 step; here each is one pass.

use rayon::prelude::*;

use crate::ops::row_kernels::unwritten;

/// Sizes: instances, rollouts (starts) per instance, nodes per instance, features.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ContextDims {
    pub(crate) instances: usize,
    pub(crate) starts: usize,
    pub(crate) nodes: usize,
    pub(crate) embed: usize,
}

/// Each row's context: its instance's fixed context, the node it stands at, and its
/// remaining capacity fraction.
pub(crate) struct ContextIn<'a> {
    /// `[B, d]`
    pub(crate) fixed: &'a [f32],
    /// `[B, N, d]` each node's context row (its embedding through the last-node weights).
    pub(crate) nodes: &'a [f32],
    /// `[d]` the remaining capacity's weight row.
    pub(crate) capacity: &'a [f32],
    /// `[R]` the node each row stands at, within its instance.
    pub(crate) last_node: &'a [usize],
    /// `[R]`
    pub(crate) remaining: &'a [f32],
}

/// Every row's query `[R, d]`: fixed + (node row + remaining · capacity row), rounded in
/// the order the op-by-op form rounds it (`AttentionModel`'s `query_at`), so the same bits.
pub(crate) fn queries(dims: ContextDims, x: &ContextIn) -> Vec<f32> {
    let (s, n, d) = (dims.starts, dims.nodes, dims.embed);
    let mut query = unwritten(dims.instances * s * d);
    query
        .par_chunks_mut(s * d)
        .enumerate()
        .for_each(|(i, rows)| {
            let fixed = &x.fixed[i * d..(i + 1) * d];
            for (k, row) in rows.chunks_exact_mut(d).enumerate() {
                let r = i * s + k;
                let node = &x.nodes[(i * n + x.last_node[r]) * d..][..d];
                let remaining = x.remaining[r];
                for (f, q) in row.iter_mut().enumerate() {
                    *q = fixed[f] + (node[f] + remaining * x.capacity[f]);
                }
            }
        });
    query
}

/// Gradients of the context's three float tensors.
pub(crate) struct ContextGrads {
    /// `[B, d]`
    pub(crate) fixed: Vec<f32>,
    /// `[B, N, d]`: each row's query gradient added at the node it stands at.
    pub(crate) nodes: Vec<f32>,
    /// `[d]`
    pub(crate) capacity: Vec<f32>,
}

/// The context's gradients from the queries' `d_query` (`[R, d]`), for rows standing at
/// `last_node` with `remaining` capacity fractions (`[R]` each): per instance, its rows'
/// sum and their scatter onto their nodes, each in row order; the capacity row's, the
/// products' sum over instances for each rollout, then over rollouts. Each in the order
/// Burn's backward of the composed queries adds them (its broadcast sums reduce one
/// dimension at a time), so the same bits.
pub(crate) fn context_grads(
    dims: ContextDims,
    (last_node, remaining): (&[usize], &[f32]),
    d_query: &[f32],
) -> ContextGrads {
    let (b, s, n, d) = (dims.instances, dims.starts, dims.nodes, dims.embed);
    let mut fixed = unwritten(b * d);
    let mut nodes = unwritten(b * n * d);
    let outputs = fixed.par_chunks_mut(d).zip(nodes.par_chunks_mut(n * d));
    outputs.enumerate().for_each(|(i, (fixed, nodes))| {
        fixed.fill(0.0);
        nodes.fill(0.0);
        for r in i * s..(i + 1) * s {
            let grad = &d_query[r * d..(r + 1) * d];
            let node = &mut nodes[last_node[r] * d..][..d];
            for f in 0..d {
                fixed[f] += grad[f];
                node[f] += grad[f];
            }
        }
    });
    let mut by_start = unwritten(s * d);
    by_start.par_chunks_mut(d).enumerate().for_each(|(k, sum)| {
        sum.fill(0.0);
        for r in (0..b).map(|i| i * s + k) {
            let grad = &d_query[r * d..(r + 1) * d];
            for (sum, &g) in sum.iter_mut().zip(grad) {
                *sum += g * remaining[r];
            }
        }
    });
    let mut capacity = vec![0.0f32; d];
    for start in by_start.chunks_exact(d) {
        for (sum, &v) in capacity.iter_mut().zip(start) {
            *sum += v;
        }
    }
    ContextGrads {
        fixed,
        nodes,
        capacity,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two instances of two rollouts over three nodes, two features: each value by hand.
    #[test]
    fn queries_and_their_gradients_by_hand() {
        let dims = ContextDims {
            instances: 2,
            starts: 2,
            nodes: 3,
            embed: 2,
        };
        let nodes: Vec<f32> = (0..12).map(|v| v as f32).collect(); // instance 1 from 6
        let x = ContextIn {
            fixed: &[100.0, 200.0, 300.0, 400.0],
            nodes: &nodes,
            capacity: &[1.0, -1.0],
            last_node: &[0, 2, 2, 2],
            remaining: &[0.5, 0.25, 1.0, 0.0],
        };
        let q = queries(dims, &x);
        #[rustfmt::skip]
        let want = [
            100.5, 200.5,   // 100 + (0 + 0.5), 200 + (1 - 0.5)
            104.25, 204.75, // node 2 of instance 0: (4, 5)
            311.0, 410.0,   // node 2 of instance 1: (10, 11), + (1, -1)
            310.0, 411.0,
        ];
        assert_eq!(q, want);
        let d_query = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let g = context_grads(dims, (x.last_node, x.remaining), &d_query);
        assert_eq!(g.fixed, [4.0, 6.0, 12.0, 14.0]);
        #[rustfmt::skip]
        assert_eq!(g.nodes, [
            1.0, 2.0, 0.0, 0.0, 3.0, 4.0,   // instance 0: row 0 at node 0, row 1 at node 2
            0.0, 0.0, 0.0, 0.0, 12.0, 14.0, // instance 1: both rows at node 2
        ]);
        // 0.5·(1, 2) + 0.25·(3, 4) + 1·(5, 6) + 0·(7, 8)
        assert_eq!(g.capacity, [6.25, 8.0]);
    }
}
