//! REINFORCE baselines: exponential moving average, Kool's greedy rollout with a paired
//! t-test, and POMO's shared multi-start mean.

use burn::tensor::Device;
use routeburn_data::{Batch, Generator, InstanceRng};
use routeburn_model::{AttentionModel, DecodeOptions};
use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, StudentsT};

use crate::error::CliError;
use crate::evaluate::{decode_costs, mean};

/// Exponential moving average of the batches' mean cost (Kool's `ExponentialBaseline`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExponentialBaseline {
    pub beta: f64,
    pub value: Option<f64>,
}

impl ExponentialBaseline {
    pub fn new(beta: f64) -> Self {
        Self { beta, value: None }
    }

    /// Folds in this batch's mean cost and returns the baseline for this batch.
    pub fn update(&mut self, batch_mean_cost: f64) -> f64 {
        let v = match self.value {
            None => batch_mean_cost,
            Some(v) => self.beta * v + (1.0 - self.beta) * batch_mean_cost,
        };
        self.value = Some(v);
        v
    }
}

/// Kool's rollout baseline: the greedy cost of a frozen copy of the policy, replaced when
/// the current policy is significantly better on a held-out evaluation set.
#[derive(Debug)]
pub struct RolloutBaseline {
    /// The frozen policy, an inference copy.
    pub model: AttentionModel,
    /// Draws the seeds of evaluation sets.
    pub rng: InstanceRng,
    /// Seed of the current evaluation set (regenerated from it after a resume).
    pub eval_seed: u64,
    eval_batches: Vec<Batch>,
    /// The frozen policy's greedy costs on the evaluation set.
    eval_costs: Vec<f64>,
}

/// The outcome of the end-of-epoch test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RolloutTest {
    pub candidate_mean: f64,
    pub baseline_mean: f64,
    /// One-sided p-value (None when the candidate was not better on average).
    pub p_value: Option<f64>,
    pub replaced: bool,
}

pub struct EvalSetSpec<'a> {
    pub generator: &'a Generator,
    pub size: usize,
    pub batch_size: usize,
    pub options: DecodeOptions,
    pub device: &'a Device,
}

impl RolloutBaseline {
    /// A baseline from a frozen `model`, with an evaluation set drawn from `eval_seed`.
    pub fn new(
        model: AttentionModel,
        rng: InstanceRng,
        eval_seed: u64,
        spec: &EvalSetSpec,
    ) -> Result<Self, CliError> {
        let eval_batches = eval_set(spec, eval_seed);
        let eval_costs = decode_costs(&model, &eval_batches, &spec.options, spec.device)?;
        Ok(Self {
            model,
            rng,
            eval_seed,
            eval_batches,
            eval_costs,
        })
    }

    /// One-sided paired t-test (α = `alpha`) of `candidate` against the frozen policy on
    /// the evaluation set; on success the candidate becomes the baseline and a fresh
    /// evaluation set is drawn.
    pub fn epoch_end(
        &mut self,
        candidate: &AttentionModel,
        alpha: f64,
        spec: &EvalSetSpec,
    ) -> Result<RolloutTest, CliError> {
        let candidate_costs =
            decode_costs(candidate, &self.eval_batches, &spec.options, spec.device)?;
        let (candidate_mean, baseline_mean) = (mean(&candidate_costs), mean(&self.eval_costs));
        let mut test = RolloutTest {
            candidate_mean,
            baseline_mean,
            p_value: None,
            replaced: false,
        };
        if candidate_mean < baseline_mean {
            let p = paired_t_test_less(&candidate_costs, &self.eval_costs);
            test.p_value = Some(p);
            if p < alpha {
                test.replaced = true;
                self.model = candidate.clone();
                self.eval_seed = self.rng.next_u64();
                self.eval_batches = eval_set(spec, self.eval_seed);
                self.eval_costs =
                    decode_costs(&self.model, &self.eval_batches, &spec.options, spec.device)?;
            }
        }
        Ok(test)
    }
}

fn eval_set(spec: &EvalSetSpec, seed: u64) -> Vec<Batch> {
    let mut rng = InstanceRng::new(seed);
    let mut left = spec.size;
    let mut batches = vec![];
    while left > 0 {
        let b = left.min(spec.batch_size);
        batches.push(spec.generator.sample_batch(&mut rng, b));
        left -= b;
    }
    batches
}

/// One-sided p-value that `a` is smaller than `b` on average, by a paired t-test
/// (scipy's `ttest_rel` p-value halved, as in Kool et al.). Identical samples give 1.
pub fn paired_t_test_less(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let n = a.len() as f64;
    if a.len() < 2 {
        return 1.0;
    }
    let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
    let m = d.iter().sum::<f64>() / n;
    let var = d.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0);
    if var <= 0.0 {
        return if m < 0.0 { 0.0 } else { 1.0 };
    }
    let t = m / (var / n).sqrt();
    StudentsT::new(0.0, 1.0, n - 1.0)
        .map(|dist| dist.cdf(t))
        .unwrap_or(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_baseline_by_hand() {
        let mut b = ExponentialBaseline::new(0.8);
        assert_eq!(b.update(10.0), 10.0);
        assert!((b.update(5.0) - 9.0).abs() < 1e-12);
    }

    /// By hand: differences [-1, -0.5, -0.5, 0, -0.5], mean -0.5, sample variance 0.125,
    /// t = -0.5 / sqrt(0.125 / 5) = -3.1623 with 4 degrees of freedom; the Student-t CDF
    /// there (numerical integration of the density) is 0.017055.
    #[test]
    fn paired_t_test_matches_scipy() {
        let p = paired_t_test_less(&[1.0, 2.0, 3.0, 4.0, 5.5], &[2.0, 2.5, 3.5, 4.0, 6.0]);
        assert!((p - 0.017055).abs() < 1e-5, "{p}");
        assert_eq!(paired_t_test_less(&[1.0, 2.0], &[1.0, 2.0]), 1.0);
        assert!(paired_t_test_less(&[3.0, 4.0, 5.0], &[1.0, 2.0, 3.5]) > 0.9);
    }
}
