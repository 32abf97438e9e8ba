//! Exponential moving average of the batches' mean cost (Kool's `ExponentialBaseline`).

use routeburn_data::Batch;

use crate::error::TrainError;
use crate::evaluate::mean;
use crate::reinforce::baseline::{Baseline, Tours};
use crate::run::checkpoint::BaselineState;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ExponentialBaseline {
    pub(crate) beta: f64,
    pub(crate) value: Option<f64>,
}

impl ExponentialBaseline {
    /// With the value of a checkpoint's `state`, if any.
    pub(crate) fn restore(beta: f64, state: Option<&BaselineState>) -> Self {
        Self {
            beta,
            value: state.and_then(|s| s.exponential_value),
        }
    }

    /// Folds in this batch's mean cost and returns the baseline for this batch.
    pub(crate) fn update(&mut self, batch_mean_cost: f64) -> f64 {
        let v = match self.value {
            None => batch_mean_cost,
            Some(v) => self.beta * v + (1.0 - self.beta) * batch_mean_cost,
        };
        self.value = Some(v);
        v
    }
}

impl Baseline for ExponentialBaseline {
    fn values(
        &mut self,
        _batch: &Batch,
        costs: &[f64],
        _rows_per_instance: usize,
        _decoded: Option<Tours>,
    ) -> Result<Vec<f64>, TrainError> {
        Ok(vec![self.update(mean(costs)); costs.len()])
    }

    fn save(&self, _dir: &std::path::Path, state: &mut BaselineState) -> Result<(), TrainError> {
        state.exponential_value = self.value;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_baseline_by_hand() {
        let mut b = ExponentialBaseline::restore(0.8, None);
        assert_eq!(b.update(10.0), 10.0);
        assert!((b.update(5.0) - 9.0).abs() < 1e-12);
    }
}
