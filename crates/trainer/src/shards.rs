//! Data-parallel shards of a batch: each shard's decode and backward run on a thread of
//! its own with an autodiff graph of its own, and the gradients are summed in shard order
//! before one optimiser step.
//!
//! The shard count is part of the config (`training.shards`), not the machine: the same
//! config, seed and shard count give the same numbers on any number of threads, because
//! each shard computes the same thing wherever it runs and the sums are taken in a fixed
//! order.
//!
//! A shard runs on a forked copy of the model (`Module::fork`): a plain clone shares the
//! parameters' autodiff nodes, and the graphs of threads that share a node merge and
//! serialise. The loop is generic over where a shard runs; here all shards share the one
//! CPU device and rayon's pool (the fused decoder step's own rayon work steals from the
//! same pool). Several GPUs would give each shard its own device and sum with an
//! all-reduce instead of [`sum_gradients`].

use std::ops::Range;

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::Tensor;

use crate::config::TrainingConfig;

/// How a batch is split: `count` shards of consecutive instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shards {
    count: usize,
}

impl Shards {
    pub(crate) fn new(count: usize) -> Self {
        Self {
            count: count.max(1),
        }
    }

    /// The run's shards (the skeleton has resolved `training.shards` before any method
    /// starts; unset only means one for code that runs outside a run).
    pub(crate) fn of(training: &TrainingConfig) -> Self {
        Self::new(training.shards.unwrap_or(1))
    }

    /// The instance ranges of a batch of `instances`: as even as possible, the larger
    /// shards first, and never an empty one.
    pub(crate) fn ranges(&self, instances: usize) -> Vec<Range<usize>> {
        let count = self.count.min(instances).max(1);
        let (base, extra) = (instances / count, instances % count);
        let mut start = 0;
        (0..count)
            .map(|k| {
                let len = base + usize::from(k < extra);
                let range = start..start + len;
                start += len;
                range
            })
            .collect()
    }
}

/// Runs `work` on every input, in parallel on rayon's pool, and returns the results in
/// input (shard) order.
pub(crate) fn in_parallel<I: Send, T: Send>(
    inputs: Vec<I>,
    work: impl Fn(I) -> T + Sync,
) -> Vec<T> {
    if inputs.len() == 1 {
        return inputs.into_iter().map(work).collect();
    }
    let mut results: Vec<Option<T>> = inputs.iter().map(|_| None).collect();
    rayon::scope(|scope| {
        for (input, slot) in inputs.into_iter().zip(results.iter_mut()) {
            let work = &work;
            scope.spawn(move |_| *slot = Some(work(input)));
        }
    });
    results
        .into_iter()
        .map(|r| r.expect("every shard ran"))
        .collect()
}

/// The model a shard trains: the model itself when there is one shard, else a copy with
/// its own autodiff leaves (the same parameter ids) and its own running statistics.
///
/// `fork` alone would detach the parameters but keep batch norm's running statistics
/// shared, and Burn averages updates made on several threads by thread, so they would
/// depend on the threads; each shard updates its own, and [`RunningStats`] merges them.
pub(crate) fn shard_model<M: Module>(model: &M, shards: usize) -> M {
    if shards == 1 {
        model.clone()
    } else {
        model.valid().train()
    }
}

/// Batch norm's running statistics after a sharded step: the mean of the shards' own,
/// summed in shard order (as Burn's data-parallel training averages them per device).
#[derive(Default)]
pub(crate) struct RunningStats {
    /// Flattened values by id.
    merged: HashMap<ParamId, Tensor<1>>,
}

impl RunningStats {
    /// The shards' statistics merged; none with one shard, whose statistics are the
    /// model's own and already updated.
    pub(crate) fn merge<M: Module>(shard_models: &[M]) -> Self {
        if shard_models.len() < 2 {
            return Self::default();
        }
        let mut sums: Vec<(ParamId, Tensor<1>)> = Vec::new();
        for model in shard_models {
            let mut ids = RunningIds(Vec::new());
            model.visit(&mut ids);
            // `valid` folds in the update this shard's thread made.
            let mut values = Collect {
                wanted: ids.0,
                found: Vec::new(),
            };
            model.valid().visit(&mut values);
            if sums.is_empty() {
                sums = values.found;
            } else {
                for ((_, sum), (_, value)) in sums.iter_mut().zip(values.found) {
                    *sum = sum.clone() + value;
                }
            }
        }
        let k = shard_models.len() as f64;
        Self {
            merged: sums.into_iter().map(|(id, sum)| (id, sum / k)).collect(),
        }
    }

    /// `model` with these statistics in place of its own.
    pub(crate) fn apply<M: Module>(self, model: M) -> M {
        if self.merged.is_empty() {
            return model;
        }
        model.map(&mut Replace(self.merged))
    }
}

/// Ids of a training model's running statistics: its float tensors without gradients.
struct RunningIds(Vec<ParamId>);

impl ModuleVisitor for RunningIds {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if !param.val().is_require_grad() {
            self.0.push(param.id);
        }
    }
}

/// The flattened values of the `wanted` ids, in visiting order.
struct Collect {
    wanted: Vec<ParamId>,
    found: Vec<(ParamId, Tensor<1>)>,
}

impl ModuleVisitor for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if self.wanted.contains(&param.id) {
            let value = param.val();
            let len = value.shape().num_elements();
            self.found.push((param.id, value.reshape([len])));
        }
    }
}

struct Replace(HashMap<ParamId, Tensor<1>>);

impl ModuleMapper for Replace {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        match self.0.remove(&param.id) {
            Some(merged) => {
                let value = param.val();
                let merged = merged.reshape(value.dims());
                let merged = if value.is_autodiff() {
                    Tensor::from_inner(merged)
                } else {
                    merged
                };
                Param::initialized(param.id, merged)
            }
            None => param,
        }
    }
}

/// The gradients of one shard's loss with respect to its model's parameters.
fn gradients<M: Module>(loss: Tensor<1>, model: &M) -> GradientsParams {
    GradientsParams::from_grads(loss.backward(), model)
}

/// What a sharded step hands the optimiser: the losses' sum (without autodiff), the
/// gradients summed in shard order, and the merged running statistics.
pub(crate) struct ShardedStep {
    pub(crate) loss: Tensor<1>,
    pub(crate) grads: GradientsParams,
    pub(crate) running: RunningStats,
}

/// Each shard's loss differentiated on its own thread against its own model.
pub(crate) fn backward_in_parallel<M: Module>(
    model: &M,
    shards: Vec<(M, Tensor<1>)>,
) -> ShardedStep {
    let parts = in_parallel(shards, |(model, loss)| {
        let value = loss.clone().without_autodiff();
        let grads = gradients(loss, &model);
        (value, grads, model)
    });
    let mut losses = Vec::with_capacity(parts.len());
    let mut grads = Vec::with_capacity(parts.len());
    let mut models = Vec::with_capacity(parts.len());
    for (l, g, m) in parts {
        losses.push(l);
        grads.push(g);
        models.push(m);
    }
    ShardedStep {
        loss: losses
            .into_iter()
            .reduce(|a, b| a + b)
            .expect("at least one shard"),
        grads: sum_gradients(model, grads),
        running: RunningStats::merge(&models),
    }
}

/// The shards' gradients summed in shard order (the sum every thread count agrees on).
fn sum_gradients<M: Module>(model: &M, parts: Vec<GradientsParams>) -> GradientsParams {
    if parts.len() == 1 {
        return parts.into_iter().next().expect("one part");
    }
    let mut accumulator = GradientsAccumulator::<M>::new();
    for part in parts {
        accumulator.accumulate(model, part);
    }
    accumulator.grads()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_the_batch_in_order() {
        assert_eq!(Shards::new(2).ranges(5), vec![0..3, 3..5]);
        assert_eq!(Shards::new(3).ranges(9), vec![0..3, 3..6, 6..9]);
        assert_eq!(Shards::new(4).ranges(2), vec![0..1, 1..2]);
        assert_eq!(Shards::new(1).ranges(7), vec![0..7]);
    }

    #[test]
    fn results_come_back_in_shard_order() {
        let ranges = Shards::new(4).ranges(10);
        let out = in_parallel(ranges, |r| (r.start, r.len()));
        assert_eq!(out, vec![(0, 3), (3, 3), (6, 2), (8, 2)]);
    }
}
