//! REINFORCE for the attention model. Per batch the host and the device cross once each
//! way:
//! 1. generate instances on the CPU from the seeded generator;
//! 2. upload coordinates, demands, capacities and sampling noise in one buffer;
//! 3. sample a decode with gradients, and queue the baseline's device work (rollout);
//! 4. download both decodes' actions and the previous step's loss and gradient norm in
//!    one read;
//! 5. validate and cost every tour with the CPU evaluator; the baseline values them;
//! 6. upload the advantages: the loss is their product with the log-likelihoods.

pub(crate) mod baseline;
pub(crate) mod exponential;
pub(crate) mod pomo;
mod recorded_rollout;
pub(crate) mod rollout;

use burn::tensor::{Device, Int, Tensor, TensorData, Transaction};
use routeburn_data::{Batch, Generator};
use routeburn_model::{AttentionModel, DecodeOptions, DecodeOutput, DeviceBatch, NoiseShape};

use crate::config::{BaselineKind, Config, ModelConfig};
use crate::error::TrainError;
use crate::evaluate::{int_data_to_i64, join_rows, read_back, validated_costs};
use crate::reinforce::baseline::{Baseline, Tours};
use crate::reinforce::exponential::ExponentialBaseline;
use crate::reinforce::pomo::SharedBaseline;
use crate::reinforce::rollout::RolloutBaseline;
use crate::run::checkpoint::BaselineState;
use crate::run::method::{RunRngs, Setup, StepContext, StepLoss, StepStats, TrainingMethod};
use crate::run::metrics::{EpochMetrics, Phase};
use crate::shards::{backward_in_parallel, in_parallel, shard_model, Shards};

pub(crate) struct Reinforce {
    generator: Generator,
    batch_size: usize,
    batches_per_epoch: usize,
    sampling: DecodeOptions,
    baseline: Box<dyn Baseline>,
    shards: Shards,
    /// β of maximum-entropy REINFORCE (`reinforce.entropy_weight`; 0: plain).
    entropy_weight: f64,
    /// The fraction of each instance's tours the loss learns from (`reinforce.learn_from`).
    learn_from: Option<f64>,
}

/// The costs of a step's sampled tours, their baseline values and advantages.
struct Valued {
    costs: Vec<f64>,
    baselines: Vec<f64>,
    advantages: Vec<f64>,
}

impl TrainingMethod for Reinforce {
    type Model = AttentionModel;

    /// The random streams, the model, Adam and the baseline's state are all in a
    /// checkpoint; `begin_epoch` only reads the epoch number.
    const RESUMES_MID_EPOCH: bool = true;

    fn init_model(config: &Config, device: &Device) -> Result<AttentionModel, TrainError> {
        match &config.model {
            ModelConfig::Attention(a) => Ok(a.model_config().init(device)),
            other => Err(TrainError::Input(format!(
                "REINFORCE trains the attention model, not the {} model",
                other.kind()
            ))),
        }
    }

    fn start(setup: Setup, model: &AttentionModel) -> Result<Self, TrainError> {
        let config = setup.config;
        let generator = config.generator()?;
        let baseline = baseline_for_run(&setup, &generator, model)?;
        Ok(Self {
            sampling: DecodeOptions::sample(1.0)
                .with_multi_start(baseline.multi_start())
                .with_starts(config.reinforce.starts)
                .with_check_every(config.training.decode_check_every),
            generator,
            batch_size: config.training.batch_size,
            batches_per_epoch: config.reinforce.batches_per_epoch,
            baseline,
            shards: Shards::of(&config.training),
            entropy_weight: config.reinforce.entropy_weight,
            learn_from: config.reinforce.learn_from,
        })
    }

    fn steps_per_epoch(&self) -> usize {
        self.batches_per_epoch
    }

    fn begin_epoch(&mut self, epoch: usize, _rngs: &mut RunRngs) {
        self.baseline.begin_epoch(epoch);
    }

    fn step(&mut self, model: &AttentionModel, ctx: StepContext) -> Result<StepLoss, TrainError> {
        let StepContext { times, rngs, .. } = ctx;
        let batch = times.time(Phase::Generate, || {
            self.generator
                .sample_batch(&mut rngs.train, self.batch_size)
        });
        let noise = NoiseShape {
            rows_per_instance: self.sampling.rows_per_instance(batch.n),
        };
        let problem = times.time(Phase::Upload, || {
            DeviceBatch::upload(&batch, Some((noise, &mut rngs.noise)), ctx.device)
        });
        let ranges = self.shards.ranges(batch.size);
        let shards = ranges.len();
        let sampled = times.time(Phase::Forward, || {
            in_parallel(ranges.clone(), |range| {
                let model = shard_model(model, shards);
                let decoded = model.decode(&problem.shard(range), &self.sampling);
                (model, decoded)
            })
        });
        let baseline_tours = times.time(Phase::Baseline, || {
            self.baseline.decode(&batch, &problem, &ranges)
        })?;
        let decoded: Vec<&DecodeOutput> = sampled.iter().map(|(_, d)| d).collect();
        let valued = times.time(Phase::DownloadCost, || {
            self.download_and_value(
                &batch,
                &decoded,
                baseline_tours,
                ctx.stats,
                ctx.epoch,
                ctx.step,
            )
        })?;
        let learned = times.time(Phase::Backward, || {
            backward_in_parallel(model, shard_losses(sampled, &valued, ctx.device))
        });
        Ok(StepLoss {
            learned,
            cost_sum: valued.costs.iter().sum(),
            baseline_sum: valued.baselines.iter().sum(),
            rows: valued.costs.len(),
            instances: batch.size,
        })
    }

    fn end_epoch(&mut self, model: &AttentionModel, verbose: bool) -> Result<bool, TrainError> {
        self.baseline.end_epoch(model, verbose)
    }

    fn save(&self, dir: &std::path::Path, state: &mut BaselineState) -> Result<(), TrainError> {
        self.baseline.save(dir, state)
    }

    fn describe_costs(m: &EpochMetrics) -> String {
        format!(
            "train {:.4} | baseline {:.4}",
            m.train_cost, m.baseline_cost
        )
    }
}

impl Reinforce {
    /// The step's one device read (every shard's sampled tours and their
    /// log-likelihoods, the baseline's tours, the previous step's statistics), then costs
    /// and baseline values over the whole batch.
    fn download_and_value(
        &mut self,
        batch: &Batch,
        sampled: &[&DecodeOutput],
        baseline_tours: Vec<Tensor<2, Int>>,
        stats: &mut StepStats,
        epoch: usize,
        step: usize,
    ) -> Result<Valued, TrainError> {
        let mut tx = Transaction::default();
        for s in sampled {
            tx = tx
                .register(s.actions.clone().without_autodiff())
                .register(s.log_likelihood.clone().without_autodiff());
        }
        let baseline_dims: Vec<[usize; 2]> = baseline_tours.iter().map(|a| a.dims()).collect();
        for a in baseline_tours {
            tx = tx.register(a);
        }
        let pending = stats.take_pending();
        let has_pending = pending.is_some();
        if let Some(p) = pending {
            tx = tx.register(p);
        }
        let mut data = read_back(tx, "the step's tours and statistics")?.into_iter();
        let (tours, log_likelihoods) = read_sampled(&mut data, sampled)?;
        let ll_sum: f32 = log_likelihoods.iter().sum();
        let baseline_parts: Vec<(Vec<i64>, [usize; 2])> = baseline_dims
            .into_iter()
            .map(|dims| (int_data_to_i64(data.next().expect("baseline")), dims))
            .collect();
        // A policy with non-finite log-probabilities emits garbage; say why first.
        if !ll_sum.is_finite() {
            return Err(stats.non_finite("log-likelihood", ll_sum, epoch, step));
        }
        if has_pending {
            stats.record(data.next().expect("stats"), epoch, step.saturating_sub(1))?;
        }
        let (actions, steps) = join_rows(tours);
        let rows = sampled[0].rows_per_instance;
        let costs = validated_costs(batch, &actions, steps, rows)?;
        let baseline_actions = (!baseline_parts.is_empty()).then(|| join_rows(baseline_parts));
        let decoded = baseline_actions.as_ref().map(|(a, s)| Tours {
            actions: a,
            steps: *s,
            rows_per_instance: 1,
        });
        let values = entropy_valued(&costs, &log_likelihoods, self.entropy_weight);
        let baselines = self.baseline.values(batch, &values, rows, decoded)?;
        let mut advantages = self
            .baseline
            .advantages(&values, &baselines, &log_likelihoods, rows);
        if let Some(fraction) = self.learn_from {
            learn_from_furthest(&mut advantages, rows, fraction);
        }
        Ok(Valued {
            costs,
            baselines,
            advantages,
        })
    }
}

/// Each shard's sampled tours (`[rows, steps]` actions) and the rows' log-likelihoods,
/// in row order, from the step's read.
#[allow(clippy::type_complexity)]
fn read_sampled(
    data: &mut impl Iterator<Item = TensorData>,
    sampled: &[&DecodeOutput],
) -> Result<(Vec<(Vec<i64>, [usize; 2])>, Vec<f32>), TrainError> {
    let mut tours = Vec::with_capacity(sampled.len());
    let mut log_likelihoods = Vec::new();
    for s in sampled {
        tours.push((
            int_data_to_i64(data.next().expect("actions")),
            s.actions.dims(),
        ));
        let ll: Vec<f32> = data
            .next()
            .expect("log-likelihood")
            .try_into_vec_as::<f32>()
            .map_err(|e| TrainError::Input(format!("log-likelihood: {e:?}")))?;
        log_likelihoods.extend(ll);
    }
    Ok((tours, log_likelihoods))
}

/// What each sampled tour is worth to the baseline and the loss: its cost plus β
/// (`reinforce.entropy_weight`) times its log-likelihood. Its expectation is the expected
/// cost less β times the policy's entropy (maximum-entropy REINFORCE), so a tour the policy
/// thought unlikely counts as cheaper than its cost, and the policy stays spread out.
fn entropy_valued(costs: &[f64], log_likelihoods: &[f32], entropy_weight: f64) -> Vec<f64> {
    if entropy_weight == 0.0 {
        return costs.to_vec();
    }
    costs
        .iter()
        .zip(log_likelihoods)
        .map(|(&cost, &ll)| cost + entropy_weight * f64::from(ll))
        .collect()
}

/// Keeps each instance's `fraction` of tours (rounded, at least one) furthest from their
/// baseline, the largest advantages in magnitude (the first of equal ones), and sets the
/// others' advantages to 0: the loss does not learn from them, and flex's backward pass
/// leaves out the rows whose gradient is zero. The tours closest to the baseline carry the
/// least of the gradient (a fifth from half the tours, if advantages were normal).
fn learn_from_furthest(advantages: &mut [f64], rows_per_instance: usize, fraction: f64) {
    let kept = ((rows_per_instance as f64 * fraction).round() as usize).clamp(1, rows_per_instance);
    let mut order = Vec::with_capacity(rows_per_instance);
    for instance in advantages.chunks_mut(rows_per_instance) {
        order.clear();
        order.extend(0..instance.len());
        // A stable sort keeps equal advantages in row order, so a run repeats exactly.
        order.sort_by(|&a, &b| instance[b].abs().total_cmp(&instance[a].abs()));
        for &row in &order[kept..] {
            instance[row] = 0.0;
        }
    }
}

/// Each shard's REINFORCE loss: Σ advantage × log-likelihood over its rows, divided by
/// the whole batch's rows, so that the shards' gradients sum to the batch mean's.
fn shard_losses(
    sampled: Vec<(AttentionModel, DecodeOutput)>,
    valued: &Valued,
    device: &Device,
) -> Vec<(AttentionModel, Tensor<1>)> {
    let total_rows = valued.costs.len();
    let advantage: Vec<f32> = valued.advantages.iter().map(|&a| a as f32).collect();
    // One upload for the batch; each shard takes its rows.
    let advantage = Tensor::<1>::from_data(TensorData::new(advantage, [total_rows]), device);
    let mut first_row = 0;
    sampled
        .into_iter()
        .map(|(model, decoded)| {
            let rows = decoded.log_likelihood.dims()[0];
            let shard_advantage = advantage.clone().slice(first_row..first_row + rows); // [rows]
            first_row += rows;
            let loss = (shard_advantage * decoded.log_likelihood).sum() / total_rows as f64; // [1]
            (model, loss)
        })
        .collect()
}

/// The run's baseline, fresh (from the initial `model`) or restored from its checkpoint.
fn baseline_for_run(
    setup: &Setup,
    generator: &Generator,
    model: &AttentionModel,
) -> Result<Box<dyn Baseline>, TrainError> {
    let r = &setup.config.reinforce;
    let state = setup.resume.map(|(_, s)| &s.baseline);
    Ok(match r.baseline {
        BaselineKind::Exponential => Box::new(ExponentialBaseline::restore(r.exp_beta, state)),
        BaselineKind::Pomo => Box::new(SharedBaseline {
            leader_alpha: r.leader_alpha,
            preference_alpha: r.preference_alpha,
        }),
        BaselineKind::Rollout => Box::new(RolloutBaseline::for_run(setup, generator, model)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reinforce::pomo::SharedBaseline;

    /// By hand: two instances of two tours each. With β = 0.5 instance 0's cheaper but
    /// less likely tour (cost 1, log-likelihood −4) is valued at −1, and its advantage
    /// against the instance's mean value grows from −1 to −1.5; instance 1's tours are
    /// equally likely, so their advantages are POMO's own.
    #[test]
    fn entropy_values_are_costs_plus_beta_times_log_likelihoods() {
        let costs = [3.0, 1.0, 2.0, 6.0];
        let log_likelihoods = [-2.0, -4.0, -1.0, -1.0];
        assert_eq!(
            entropy_valued(&costs, &log_likelihoods, 0.0),
            costs.to_vec()
        );
        let values = entropy_valued(&costs, &log_likelihoods, 0.5);
        assert_eq!(values, vec![2.0, -1.0, 1.5, 5.5]);
        let batch = routeburn_data::Generator::uniform(3)
            .sample_batch(&mut routeburn_data::InstanceRng::new(1), 2);
        let mut pomo = SharedBaseline {
            leader_alpha: 1.0,
            preference_alpha: None,
        };
        let mut advantages = |v: &[f64]| {
            let baselines = pomo.values(&batch, v, 2, None).unwrap();
            pomo.advantages(v, &baselines, &log_likelihoods, 2)
        };
        assert_eq!(advantages(&costs), vec![1.0, -1.0, -2.0, 2.0]);
        assert_eq!(advantages(&values), vec![1.5, -1.5, -2.0, 2.0]);
    }

    /// By hand: two instances of five tours. Half of five rounds to three (2.5 → 3, away
    /// from zero): instance 0 keeps −3, 2 and the first of its two 1.5s; instance 1 keeps
    /// its three non-zero advantages. A tenth of five keeps one; the whole keeps all.
    #[test]
    fn learning_from_the_tours_furthest_from_the_baseline() {
        let advantages = [1.5, -3.0, 0.5, 2.0, -1.5, 0.0, 4.0, -0.0, -1.0, 0.25];
        let with = |fraction| {
            let mut a = advantages;
            learn_from_furthest(&mut a, 5, fraction);
            a
        };
        assert_eq!(
            with(0.5),
            [1.5, -3.0, 0.0, 2.0, 0.0, 0.0, 4.0, 0.0, -1.0, 0.25]
        );
        assert_eq!(
            with(0.1),
            [0.0, -3.0, 0.0, 0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0]
        );
        assert_eq!(with(1.0), advantages);
    }
}
