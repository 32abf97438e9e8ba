//! Supervised training of the pointer network on heuristic labels, by teacher forcing.
//!
//! 1. **Labels, ahead of training** (`labels`): computed once, kept as a JSONL dataset.
//! 2. **Batching beside training.** Each epoch shuffles the labels; a second thread builds
//!    the batches (instances and target tours) a few ahead of the training loop.
//! 3. **Per batch:** one upload (instances, targets and their valid mask in one buffer),
//!    the teacher-forced forward and the masked NLL loss; the previous step's loss and
//!    gradient norm are the step's only download.
//!
//! Dropout draws from Burn's global RNG; the run reseeds it at the start of every epoch,
//! so a run resumed between epochs continues exactly as if it had never stopped.

pub(crate) mod labels;

use std::ops::Range;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

use burn::tensor::Device;
use routeburn_data::Batch;
use routeburn_model::{pointer_network_nll_sum, DeviceBatch, PointerNetwork};

use crate::config::{Config, ModelConfig, SupervisedConfig};
use crate::error::TrainError;
use crate::run::method::{RunRngs, Setup, StepContext, StepLoss, TrainingMethod};
use crate::run::metrics::{EpochMetrics, Phase};
use crate::run::skeleton::seeded;
use crate::shards::{backward_in_parallel, in_parallel, shard_model, Shards};
use crate::supervised::labels::{load_or_make_labels, Example};

/// Batches the loader may build ahead of the training loop.
const PREFETCH: usize = 4;

pub(crate) struct Supervised {
    examples: Arc<Vec<Example>>,
    settings: SupervisedConfig,
    seed: u64,
    batch_size: usize,
    batches_per_epoch: usize,
    /// The device whose global RNG dropout draws from.
    train_device: Device,
    /// This epoch's teacher-forcing ratio and its batches, built by the loader thread.
    teacher_forcing: f64,
    batches: Option<Receiver<Result<LabelledBatch, TrainError>>>,
    shards: Shards,
    /// Whether the forward pass draws random numbers (dropout).
    draws_randomness: bool,
}

/// A batch ready to upload.
struct LabelledBatch {
    batch: Batch,
    targets: Vec<Vec<i64>>,
    label_cost: f64,
}

impl TrainingMethod for Supervised {
    type Model = PointerNetwork;

    fn init_model(config: &Config, device: &Device) -> Result<PointerNetwork, TrainError> {
        match &config.model {
            ModelConfig::Pointer(p) => Ok(p.model_config().init(device)),
            other => Err(TrainError::Input(format!(
                "supervised training is for the pointer network, not the {} model",
                other.kind()
            ))),
        }
    }

    fn start(setup: Setup, _model: &PointerNetwork) -> Result<Self, TrainError> {
        let examples = load_or_make_labels(&setup)?;
        let t = &setup.config.training;
        let full_pass = examples.len().div_ceil(t.batch_size);
        let cap = setup.config.supervised.max_batches_per_epoch;
        Ok(Self {
            examples: Arc::new(examples),
            settings: setup.config.supervised.clone(),
            seed: t.seed,
            batch_size: t.batch_size,
            batches_per_epoch: if cap == 0 {
                full_pass
            } else {
                cap.min(full_pass)
            },
            train_device: setup.device.clone().autodiff(),
            teacher_forcing: 1.0,
            batches: None,
            shards: Shards::of(t),
            draws_randomness: match &setup.config.model {
                ModelConfig::Pointer(p) => p.dropout > 0.0,
                ModelConfig::Attention(_) => false,
            },
        })
    }

    fn steps_per_epoch(&self) -> usize {
        self.batches_per_epoch
    }

    /// Reseeds dropout, shuffles the labels and starts the loader thread.
    fn begin_epoch(&mut self, epoch: usize, rngs: &mut RunRngs) {
        let seed = self.seed ^ (epoch as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        seeded(&self.train_device, Some(seed), || {});
        self.teacher_forcing = self.settings.teacher_forcing_at(epoch);
        let mut order: Vec<usize> = (0..self.examples.len()).collect();
        rngs.train.shuffle(&mut order);
        let (sender, receiver) = sync_channel(PREFETCH);
        let (examples, batch_size, count) = (
            self.examples.clone(),
            self.batch_size,
            self.batches_per_epoch,
        );
        std::thread::spawn(move || {
            for chunk in order.chunks(batch_size).take(count) {
                let picked: Vec<&Example> = chunk.iter().map(|&i| &examples[i]).collect();
                if sender.send(labelled_batch(&picked)).is_err() {
                    break; // the run stopped early (an error); nothing more to build
                }
            }
        });
        self.batches = Some(receiver);
    }

    fn step(&mut self, model: &PointerNetwork, ctx: StepContext) -> Result<StepLoss, TrainError> {
        let StepContext { times, rngs, .. } = ctx;
        let labelled = times.time(Phase::Generate, || {
            self.batches
                .as_ref()
                .and_then(|b| b.recv().ok())
                .expect("the batch loader sends every batch of the epoch")
        })?;
        let (problem, targets) = times.time(Phase::Upload, || {
            DeviceBatch::upload_with_targets(&labelled.batch, &labelled.targets, ctx.device)
        });
        let [_, steps] = targets.targets.dims();
        let teacher: Vec<bool> = (0..steps)
            .map(|_| rngs.train.unit() < self.teacher_forcing)
            .collect();
        let size = labelled.batch.size;
        let ranges = self.shards.ranges(size);
        let shards = ranges.len();
        let tokens: usize = labelled.targets.iter().map(Vec::len).sum();
        let forward = |range: Range<usize>| {
            let model = shard_model(model, shards);
            let shard_targets = targets.targets.clone().slice_dim(0, range.clone());
            let log_probs = model.teacher_forced(
                &problem.shard(range.clone()),
                shard_targets.clone(),
                &teacher,
            );
            let valid = targets.valid.clone().slice_dim(0, range);
            let loss = pointer_network_nll_sum(log_probs, shard_targets, valid) / tokens as f64;
            (model, loss)
        };
        let losses = times.time(Phase::Forward, || {
            // Dropout draws from the device's one RNG: shards that draw take their turns in
            // shard order, so the draws do not depend on the threads.
            if self.draws_randomness {
                ranges.into_iter().map(forward).collect()
            } else {
                in_parallel(ranges, forward)
            }
        });
        times.time(Phase::DownloadCost, || {
            ctx.stats.flush(ctx.epoch, ctx.step.saturating_sub(1))
        })?;
        let learned = times.time(Phase::Backward, || backward_in_parallel(model, losses));
        Ok(StepLoss {
            learned,
            // A supervised step samples no tours: cost and baseline are the labels'.
            cost_sum: labelled.label_cost,
            baseline_sum: labelled.label_cost,
            rows: size,
            instances: size,
        })
    }

    fn describe_costs(m: &EpochMetrics) -> String {
        format!("labels {:.4}", m.train_cost)
    }
}

fn labelled_batch(picked: &[&Example]) -> Result<LabelledBatch, TrainError> {
    let batch = Batch::from_instances(picked.iter().map(|e| &e.record.instance))
        .map_err(|e| TrainError::Input(e.to_string()))?;
    Ok(LabelledBatch {
        batch,
        targets: picked.iter().map(|e| e.target.clone()).collect(),
        label_cost: picked
            .iter()
            .map(|e| e.record.reference_cost.unwrap_or(f64::NAN))
            .sum(),
    })
}
