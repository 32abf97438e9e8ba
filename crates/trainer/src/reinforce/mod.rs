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
    /// The step's one device read (every shard's sampled tours and summed
    /// log-likelihood, the baseline's tours, the previous step's statistics), then costs
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
                .register(s.log_likelihood.clone().without_autodiff().sum());
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
        let mut tours = Vec::with_capacity(sampled.len());
        let mut ll_sum = 0.0f32;
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
            ll_sum += ll[0];
        }
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
        let baselines = self.baseline.values(batch, &costs, rows, decoded)?;
        let advantages = self.baseline.advantages(&costs, &baselines, rows);
        Ok(Valued {
            costs,
            baselines,
            advantages,
        })
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
        }),
        BaselineKind::Rollout => Box::new(RolloutBaseline::for_run(setup, generator, model)?),
    })
}
