//! Kool's rollout baseline: the greedy cost of a frozen copy of the policy, replaced when
//! the current policy is significantly better on a held-out evaluation set (a one-sided
//! paired t-test at the end of every epoch). For the first `warmup_epochs` epochs the
//! exponential baseline stands in (Kool's `WarmupBaseline`).

use std::ops::Range;
use std::path::Path;

use burn::module::Module;
use burn::tensor::{Device, Int, Tensor};
use routeburn_data::{Batch, Generator, InstanceRng};
use routeburn_model::{AttentionModel, DecodeOptions, DeviceBatch};
use statrs::distribution::{ContinuousCDF, StudentsT};

use crate::error::TrainError;
use crate::evaluate::{decode_costs, mean, validated_costs};
use crate::reinforce::baseline::{Baseline, Tours};
use crate::reinforce::exponential::ExponentialBaseline;
use crate::reinforce::recorded_rollout::RecordedRollout;
use crate::run::checkpoint::{record_error, save_module, BaselineState, BASELINE_FILE};
use crate::run::method::Setup;
use crate::shards::{in_parallel, Shards};

/// Draws the seed of the first evaluation set, from `training.seed`.
const BASELINE_STREAM: u64 = 0x6261_7365;

/// The held-out instances of the t-test.
struct EvalSet {
    generator: Generator,
    size: usize,
    batch_size: usize,
    options: DecodeOptions,
    device: Device,
    shards: Shards,
}

pub(crate) struct RolloutBaseline {
    /// The frozen policy, an inference copy.
    model: AttentionModel,
    /// Draws the seeds of evaluation sets.
    rng: InstanceRng,
    /// Seed of the current evaluation set (regenerated from it after a resume).
    eval_seed: u64,
    eval: EvalSet,
    eval_batches: Vec<Batch>,
    /// The frozen policy's greedy costs on the evaluation set.
    eval_costs: Vec<f64>,
    alpha: f64,
    warmup: ExponentialBaseline,
    warmup_epochs: usize,
    /// Whether the warm-up is over this epoch.
    active: bool,
    /// The frozen policy's greedy decode of a training batch, as a device graph.
    graph: RecordedRollout,
}

impl RolloutBaseline {
    /// Fresh from the initial `model`, or the frozen model and evaluation set of the
    /// checkpoint the run resumes from.
    pub(crate) fn for_run(
        setup: &Setup,
        generator: &Generator,
        model: &AttentionModel,
    ) -> Result<Self, TrainError> {
        let r = &setup.config.reinforce;
        let eval = EvalSet {
            generator: generator.clone(),
            size: r.baseline_eval_size,
            batch_size: setup.config.validation.batch_size,
            options: DecodeOptions::greedy()
                .without_log_likelihood()
                .with_check_every(setup.config.training.decode_check_every),
            device: setup.device.clone(),
            shards: Shards::of(&setup.config.training),
        };
        let (frozen, rng, eval_seed, warmup_value) = match setup.resume {
            None => {
                let mut rng = InstanceRng::new(setup.config.training.seed ^ BASELINE_STREAM);
                let seed = rng.next_u64();
                (model.valid(), rng, seed, None)
            }
            Some((dir, state)) => {
                let path = dir.join(BASELINE_FILE);
                let frozen = model
                    .valid()
                    .try_load_file(&path)
                    .map_err(|e| record_error(&path, "baseline model", e))?;
                let s = &state.baseline;
                let (Some(rng), Some(seed)) = (s.rollout_rng.clone(), s.rollout_eval_seed) else {
                    return Err(TrainError::checkpoint(
                        dir,
                        "rollout baseline state missing",
                    ));
                };
                (frozen, rng, seed, s.exponential_value)
            }
        };
        let eval_batches = eval.batches(eval_seed);
        let eval_costs = decode_costs(
            &frozen,
            &eval_batches,
            &eval.options,
            &eval.device,
            eval.shards,
        )?;
        Ok(Self {
            model: frozen,
            rng,
            eval_seed,
            eval,
            eval_batches,
            eval_costs,
            alpha: r.baseline_alpha,
            warmup: ExponentialBaseline {
                beta: r.exp_beta,
                value: warmup_value,
            },
            warmup_epochs: r.warmup_epochs,
            active: false,
            graph: RecordedRollout::new(r.baseline_graph, setup.device),
        })
    }

    /// The one-sided paired t-test of `candidate` against the frozen policy; on success
    /// the candidate becomes the baseline and a fresh evaluation set is drawn.
    fn test(&mut self, candidate: &AttentionModel) -> Result<RolloutTest, TrainError> {
        let e = &self.eval;
        let candidate_costs = decode_costs(
            candidate,
            &self.eval_batches,
            &e.options,
            &e.device,
            e.shards,
        )?;
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
            if p < self.alpha {
                test.replaced = true;
                self.model = candidate.clone();
                self.graph.forget();
                self.eval_seed = self.rng.next_u64();
                self.eval_batches = e.batches(self.eval_seed);
                self.eval_costs = decode_costs(
                    &self.model,
                    &self.eval_batches,
                    &e.options,
                    &e.device,
                    e.shards,
                )?;
            }
        }
        Ok(test)
    }
}

impl Baseline for RolloutBaseline {
    fn begin_epoch(&mut self, epoch: usize) {
        self.active = epoch >= self.warmup_epochs;
    }

    fn decode(
        &mut self,
        batch: &Batch,
        problem: &DeviceBatch,
        shards: &[Range<usize>],
    ) -> Result<Vec<Tensor<2, Int>>, TrainError> {
        if !self.active {
            return Ok(Vec::new());
        }
        let (model, options, device) = (&self.model, &self.eval.options, &self.eval.device);
        if shards.len() == 1 {
            if let Some(actions) = self.graph.decode(model, batch, options, device)? {
                return Ok(vec![actions]);
            }
        }
        Ok(in_parallel(shards.to_vec(), |range| {
            model
                .decode(&problem.shard(range).without_autodiff(), options)
                .actions
        }))
    }

    fn values(
        &mut self,
        batch: &Batch,
        costs: &[f64],
        rows_per_instance: usize,
        decoded: Option<Tours>,
    ) -> Result<Vec<f64>, TrainError> {
        match decoded {
            Some(t) => validated_costs(batch, t.actions, t.steps, t.rows_per_instance),
            None => self.warmup.values(batch, costs, rows_per_instance, None),
        }
    }

    fn end_epoch(&mut self, model: &AttentionModel, verbose: bool) -> Result<bool, TrainError> {
        let test = self.test(model)?;
        if verbose {
            eprintln!(
                "  rollout baseline: candidate {:.4} vs baseline {:.4}, p = {}{}",
                test.candidate_mean,
                test.baseline_mean,
                test.p_value.map_or("-".into(), |p| format!("{p:.4}")),
                if test.replaced { " -> replaced" } else { "" }
            );
        }
        Ok(test.replaced)
    }

    fn save(&self, dir: &Path, state: &mut BaselineState) -> Result<(), TrainError> {
        state.exponential_value = self.warmup.value;
        state.rollout_rng = Some(self.rng.clone());
        state.rollout_eval_seed = Some(self.eval_seed);
        save_module(&self.model, &dir.join(BASELINE_FILE), "baseline")
    }
}

/// The outcome of the end-of-epoch test.
#[derive(Debug, Clone, Copy, PartialEq)]
struct RolloutTest {
    candidate_mean: f64,
    baseline_mean: f64,
    /// One-sided p-value (None when the candidate was not better on average).
    p_value: Option<f64>,
    replaced: bool,
}

impl EvalSet {
    fn batches(&self, seed: u64) -> Vec<Batch> {
        let mut rng = InstanceRng::new(seed);
        let mut left = self.size;
        let mut batches = vec![];
        while left > 0 {
            let b = left.min(self.batch_size);
            batches.push(self.generator.sample_batch(&mut rng, b));
            left -= b;
        }
        batches
    }
}

/// One-sided p-value that `a` is smaller than `b` on average, by a paired t-test
/// (scipy's `ttest_rel` p-value halved, as in Kool et al.). Identical samples give 1.
pub(crate) fn paired_t_test_less(a: &[f64], b: &[f64]) -> f64 {
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
