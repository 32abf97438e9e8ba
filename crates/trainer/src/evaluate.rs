//! Decoding whole datasets with a model and costing the results on the CPU. Shared by
//! validation, the rollout baseline's t-test and `routeburn eval`.

use burn::tensor::{Device, Int, Tensor, TensorData, Transaction};
use routeburn_cost::{batch_costs, validate_batch, ActionIndex};
use routeburn_data::Batch;
use routeburn_model::{
    decode_chunk, decode_in_chunks, DecodeOptions, DeviceBatch, DeviceTraits, Policy,
};

use crate::error::TrainError;
use crate::shards::{in_parallel, Shards};

/// Reads int tensor data of either int width as i64.
pub(crate) fn int_data_to_i64(data: TensorData) -> Vec<i64> {
    data.try_into_vec_as::<i64>()
        .expect("int tensor data converts to i64")
}

/// Downloaded `[rows, steps]` int tensors: each one's values, row-major, and its dims.
pub(crate) type Downloaded = Vec<(Vec<i64>, [usize; 2])>;

/// A transaction's device reads, or where the device fails (a CUDA kernel's fault
/// surfaces at the read after it) a [`TrainError::Device`] naming `what` was read.
pub(crate) fn read_back(tx: Transaction, what: &str) -> Result<Vec<TensorData>, TrainError> {
    tx.try_execute().map_err(|e| TrainError::device(what, e))
}

/// Downloads several int tensors (`what` they are, for a failed read) in one device read.
pub(crate) fn download_ints(
    tensors: Vec<Tensor<2, Int>>,
    what: &str,
) -> Result<Downloaded, TrainError> {
    let dims: Vec<[usize; 2]> = tensors.iter().map(|t| t.dims()).collect();
    let mut tx = Transaction::default();
    for t in tensors {
        tx = tx.register(t);
    }
    Ok(read_back(tx, what)?
        .into_iter()
        .zip(dims)
        .map(|(d, dims)| (int_data_to_i64(d), dims))
        .collect())
}

/// Per-row costs of a decode of `batch`, after validating every row with the cost crate.
/// Rows are instance-major (`rows_per_instance` per instance); an infeasible row is an
/// error, never silently costed.
pub(crate) fn validated_costs<A: ActionIndex>(
    batch: &Batch,
    actions: &[A],
    steps: usize,
    rows_per_instance: usize,
) -> Result<Vec<f64>, TrainError> {
    let nodes = batch.num_nodes();
    let invalid = |e: routeburn_cost::BatchError| TrainError::Infeasible(e.to_string());
    if rows_per_instance == 1 {
        validate_batch(
            actions,
            steps,
            &batch.node_demands,
            &batch.capacities,
            nodes,
        )
        .map_err(invalid)?;
        return batch_costs(actions, steps, &batch.coords, nodes).map_err(invalid);
    }
    let repeat = |v: &[u32], per: usize| -> Vec<u32> {
        v.chunks(per)
            .flat_map(|c| std::iter::repeat_n(c, rows_per_instance).flatten().copied())
            .collect()
    };
    let demands = repeat(&batch.node_demands, nodes);
    let capacities = repeat(&batch.capacities, 1);
    let coords: Vec<f32> = batch
        .coords
        .chunks(nodes * 2)
        .flat_map(|c| std::iter::repeat_n(c, rows_per_instance).flatten().copied())
        .collect();
    validate_batch(actions, steps, &demands, &capacities, nodes).map_err(invalid)?;
    batch_costs(actions, steps, &coords, nodes).map_err(invalid)
}

/// The best cost per instance out of its rows.
pub(crate) fn best_per_instance(costs: &[f64], rows_per_instance: usize) -> Vec<f64> {
    costs
        .chunks(rows_per_instance)
        .map(|c| c.iter().copied().fold(f64::INFINITY, f64::min))
        .collect()
}

/// Decodes every batch with `model` (an inference copy, see `Module::valid`), each batch
/// split into `shards` decoded side by side, and returns each instance's best validated
/// cost. On CubeCL devices a batch smaller than the first (the last) is decoded padded to
/// the first's size, as `eval` does (`inference::padded_batch`: a new size has new shapes,
/// explored and autotuned again); the copies' costs are dropped.
pub(crate) fn decode_costs(
    model: &(impl Policy + Sync),
    batches: &[Batch],
    options: &DecodeOptions,
    device: &Device,
    shards: Shards,
) -> Result<Vec<f64>, TrainError> {
    let full = match DeviceTraits::of(device).keeps_batch_shapes {
        true => batches.first().map_or(0, |b| b.size),
        false => 0,
    };
    let mut costs = Vec::new();
    for batch in batches {
        let padded = (batch.size < full).then(|| batch.padded(full));
        let decoded = padded.as_ref().unwrap_or(batch);
        let problem = DeviceBatch::upload(decoded, None, device);
        let chunk = decode_chunk(device, decoded.n + 1);
        let parts = in_parallel(shards.ranges(decoded.size), |range| {
            decode_in_chunks(model, &problem, range, options, chunk)
        });
        let rows = options.rows_per_instance(decoded.n);
        let (actions, steps) = join_rows(download_ints(
            parts.into_iter().flatten().collect(),
            "the decoded tours",
        )?);
        let row_costs = validated_costs(decoded, &actions, steps, rows)?;
        let best = best_per_instance(&row_costs, rows);
        costs.extend_from_slice(&best[..batch.size]);
    }
    Ok(costs)
}

/// Shards' `[rows, steps]` action blocks stacked into one, each row padded with depot
/// visits (0) to the longest decode's steps.
pub(crate) fn join_rows(parts: Downloaded) -> (Vec<i64>, usize) {
    let steps = parts.iter().map(|(_, [_, t])| *t).max().unwrap_or(0);
    if parts.len() == 1 {
        return (parts.into_iter().next().expect("one part").0, steps);
    }
    let mut joined = Vec::with_capacity(parts.iter().map(|(_, [r, _])| r * steps).sum());
    for (actions, [_, t]) in parts {
        for row in actions.chunks(t.max(1)) {
            joined.extend_from_slice(row);
            joined.extend(std::iter::repeat_n(0, steps - row.len()));
        }
    }
    (joined, steps)
}

/// Splits instances into batches of at most `batch_size`.
pub(crate) fn batches_of(
    instances: &[routeburn_data::Instance],
    batch_size: usize,
) -> Result<Vec<Batch>, TrainError> {
    instances
        .chunks(batch_size.max(1))
        .map(|c| Batch::from_instances(c).map_err(|e| TrainError::Input(e.to_string())))
        .collect()
}

pub(crate) fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joined_rows_are_padded_with_depot_visits() {
        let parts = vec![(vec![1, 0, 2, 0], [2, 2]), (vec![3, 4, 0], [1, 3])];
        assert_eq!(join_rows(parts), (vec![1, 0, 0, 2, 0, 0, 3, 4, 0], 3));
    }
}
