//! REINFORCE baselines as one trait (Kool's `reinforce_baselines.py`): the value of every
//! sampled tour, what happens at the end of an epoch, and the state a checkpoint keeps.
//! The step never asks which baseline it has; `reinforce::baseline_for_run` is the one
//! place that does.

use std::ops::Range;
use std::path::Path;

use burn::tensor::{Int, Tensor};
use routeburn_data::Batch;
use routeburn_model::{AttentionModel, DeviceBatch};

use crate::error::TrainError;
use crate::run::checkpoint::BaselineState;

/// A sampled decode's tours, downloaded: `[rows, steps]` row-major, instance-major rows.
pub(crate) struct Tours<'a> {
    pub(crate) actions: &'a [i64],
    pub(crate) steps: usize,
    pub(crate) rows_per_instance: usize,
}

pub(crate) trait Baseline: Send + Sync {
    /// Whether training samples one tour per first customer (POMO) rather than one per
    /// instance.
    fn multi_start(&self) -> bool {
        false
    }

    /// Before an epoch's first batch.
    fn begin_epoch(&mut self, _epoch: usize) {}

    /// Device work for this batch, queued before the step's one download (the rollout
    /// baseline's greedy decode), one `[rows, steps]` part per shard of `problem` (the
    /// device copy of `batch`); the parts come back in [`Baseline::values`].
    fn decode(
        &mut self,
        _batch: &Batch,
        _problem: &DeviceBatch,
        _shards: &[Range<usize>],
    ) -> Result<Vec<Tensor<2, Int>>, TrainError> {
        Ok(Vec::new())
    }

    /// The baseline value of every sampled tour, from the tours' `costs` (instance-major,
    /// `rows_per_instance` each) and the download of [`Baseline::decode`]'s tours.
    fn values(
        &mut self,
        batch: &Batch,
        costs: &[f64],
        rows_per_instance: usize,
        decoded: Option<Tours>,
    ) -> Result<Vec<f64>, TrainError>;

    /// Each tour's advantage, which the loss multiplies by its log-likelihood: its cost
    /// less its baseline value.
    fn advantages(
        &self,
        costs: &[f64],
        values: &[f64],
        _log_likelihoods: &[f32],
        _rows_per_instance: usize,
    ) -> Vec<f64> {
        cost_less_value(costs, values)
    }

    /// Kool's `epoch_callback`, with an inference copy of the trained model: whether the
    /// baseline changed.
    fn end_epoch(&mut self, _model: &AttentionModel, _verbose: bool) -> Result<bool, TrainError> {
        Ok(false)
    }

    /// Writes the baseline's tensors into a checkpoint directory and its fields of `state`.
    fn save(&self, _dir: &Path, _state: &mut BaselineState) -> Result<(), TrainError> {
        Ok(())
    }
}

/// Each tour's cost less its baseline value: REINFORCE's advantage.
pub(crate) fn cost_less_value(costs: &[f64], values: &[f64]) -> Vec<f64> {
    costs.iter().zip(values).map(|(c, b)| c - b).collect()
}
