//! Fixtures shared by the benches.

use routeburn_data::{Batch, Generator, InstanceRng};

/// A generated batch and, for each instance, the padded action sequence of a feasible
/// solution (customers in index order, a new route whenever the next one does not fit), as
/// a decoder would emit it: `[B, 2n]`.
pub fn batch_with_actions(size: usize, n: usize, seed: u64) -> (Batch, Vec<i64>, usize) {
    let batch = Generator::uniform(n).sample_batch(&mut InstanceRng::new(seed), size);
    let steps = 2 * n;
    let nodes = n + 1;
    let mut actions = Vec::with_capacity(size * steps);
    for i in 0..size {
        let demands = &batch.node_demands[i * nodes..(i + 1) * nodes];
        let capacity = batch.capacities[i];
        let start = actions.len();
        let mut load = 0;
        for (c, &demand) in demands.iter().enumerate().skip(1) {
            if load + demand > capacity {
                actions.push(0);
                load = 0;
            }
            actions.push(c as i64);
            load += demand;
        }
        actions.resize(start + steps, 0);
    }
    (batch, actions, steps)
}
