//! The REINFORCE training loop for the attention model.
//!
//! Per batch the host and the device cross once each way:
//! 1. generate instances on the CPU from the seeded generator;
//! 2. upload coordinates, demands, capacities and sampling noise in one buffer;
//! 3. sample a decode with gradients, and the baseline's greedy decode without;
//! 4. download both decodes' actions (and the previous step's loss and gradient norm) in
//!    one read;
//! 5. validate and cost every solution with the CPU evaluator;
//! 6. upload the advantages;
//! 7. loss, backward, global-norm clip, Adam step.
//!
//! The loss of step k is read with the download of step k+1 (and at the end of the epoch),
//! so the NaN guard costs no extra sync; a NaN stops the run before the next checkpoint,
//! so the last good one stays intact.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::{Device, DeviceConfig, FloatDType, Tensor, TensorData, Transaction};
use indicatif::{ProgressBar, ProgressStyle};
use routeburn_data::{read_jsonl, Batch, Generator, InstanceRng};
use routeburn_model::{AttentionModel, Backend, DecodeOptions, DeviceBatch, NoiseShape, Policy};

use crate::baseline::{EvalSetSpec, ExponentialBaseline, RolloutBaseline};
use crate::checkpoint::{
    record_error, save_module, BaselineState, Checkpoints, TrainState, BASELINE_FILE, MODEL_FILE,
    OPTIMIZER_FILE,
};
use crate::clip::clip_global_norm;
use crate::config::{BaselineKind, Config, ModelKind, Precision, ValidationStrategy};
use crate::error::CliError;
use crate::evaluate::{batches_of, decode_costs, int_data_to_i64, mean, validated_costs};
use crate::metrics::{append_metrics, truncate_metrics, EpochMetrics, Phase, PhaseTimes};

pub(crate) static INIT_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Seeds of the independent random streams, derived from `training.seed`.
pub(crate) const TRAIN_STREAM: u64 = 0x7261_696e;
pub(crate) const NOISE_STREAM: u64 = 0x6e6f_6973;
const BASELINE_STREAM: u64 = 0x6261_7365;

pub struct TrainOptions {
    pub config: Config,
    pub run_dir: PathBuf,
    pub backend: Backend,
    /// Continue from the run directory's latest checkpoint.
    pub resume: bool,
    /// Stop (as if killed) after this many epochs in total; for tests of resuming.
    pub stop_after_epochs: Option<usize>,
    /// Print progress and summaries.
    pub verbose: bool,
    /// Base directory for relative dataset paths in the config (the config's directory).
    pub config_dir: Option<PathBuf>,
    /// Start a fresh attention-model run from these weights (a burnpack file) instead of
    /// the seeded initialisation: `compare-backends` gives every backend the same start.
    pub init_weights: Option<PathBuf>,
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct TrainSummary {
    pub run_dir: PathBuf,
    pub epochs: Vec<EpochMetrics>,
}

/// The validation set: batches, and reference costs per instance when the file has them.
pub(crate) struct ValidationSet {
    batches: Vec<Batch>,
    references: Option<Vec<f64>>,
}

pub(crate) fn load_validation(
    config: &Config,
    generator: &Generator,
    config_dir: Option<&Path>,
) -> Result<ValidationSet, CliError> {
    let v = &config.validation;
    match &v.file {
        Some(file) => {
            let path = resolve(file, config_dir);
            let records = read_jsonl(&path)?;
            if records.is_empty() {
                return Err(CliError::Input(format!(
                    "validation.file {}: no instances",
                    path.display()
                )));
            }
            let n = config.problem.n;
            if let Some(r) = records.iter().find(|r| r.instance.n() != n) {
                return Err(CliError::Input(format!(
                    "validation.file {}: instance `{}` has {} customers, but problem.n is {n}",
                    path.display(),
                    r.instance.name(),
                    r.instance.n()
                )));
            }
            let references: Option<Vec<f64>> = records.iter().map(|r| r.reference_cost).collect();
            let instances: Vec<_> = records.into_iter().map(|r| r.instance).collect();
            Ok(ValidationSet {
                batches: batches_of(&instances, v.batch_size)?,
                references,
            })
        }
        None => {
            let instances = generator.sample_many(&mut InstanceRng::new(v.seed), v.size, "val");
            Ok(ValidationSet {
                batches: batches_of(&instances, v.batch_size)?,
                references: None,
            })
        }
    }
}

/// The end of an epoch, the same for every trainer: the summary, the metrics row, then (at
/// the checkpoint cadence and after the last epoch) a checkpoint whose tensors
/// `write_tensors` writes. Metrics come first: a resume drops rows past its checkpoint.
pub(crate) fn end_epoch(
    opts: &TrainOptions,
    checkpoints: &Checkpoints,
    metrics_path: &Path,
    metrics: &EpochMetrics,
    state: &TrainState,
    write_tensors: impl FnOnce(&Path) -> Result<(), CliError>,
) -> Result<(), CliError> {
    let config = &opts.config;
    if opts.verbose && config.logging.summary {
        print_summary(metrics, config.training.epochs, config.model.kind);
    }
    append_metrics(metrics_path, metrics)?;
    let is_last = metrics.epoch == config.training.epochs;
    if metrics
        .epoch
        .is_multiple_of(config.checkpointing.every_epochs)
        || is_last
    {
        checkpoints.save(state, config.checkpointing.keep_last, write_tensors)?;
    }
    Ok(())
}

/// The run's latest checkpoint, checked to be of the config's model.
pub(crate) fn latest_checkpoint(
    checkpoints: &Checkpoints,
    config: &Config,
) -> Result<(PathBuf, TrainState), CliError> {
    let (dir, state) = checkpoints.latest()?;
    if state.model_kind != config.model.kind {
        return Err(CliError::Input(format!(
            "{}: checkpoint is of model `{}`, the run's config says `{}`",
            dir.display(),
            state.model_kind,
            config.model.kind
        )));
    }
    Ok((dir, state))
}

/// Drops metrics rows past the checkpoint a run resumes from, and says so.
pub(crate) fn announce_resume(
    opts: &TrainOptions,
    metrics_path: &Path,
    start_epoch: usize,
) -> Result<(), CliError> {
    truncate_metrics(metrics_path, start_epoch)?;
    if opts.verbose {
        eprintln!(
            "resuming {} at epoch {}",
            opts.run_dir.display(),
            start_epoch + 1
        );
    }
    Ok(())
}

/// A fresh run directory: the resolved config, and no metrics of an earlier run.
pub(crate) fn start_run_dir(
    run_dir: &Path,
    config: &Config,
    metrics_path: &Path,
) -> Result<(), CliError> {
    std::fs::create_dir_all(run_dir).map_err(|e| CliError::io(run_dir, e))?;
    crate::checkpoint::write_atomic(&run_dir.join("config.toml"), config.to_toml().as_bytes())?;
    if metrics_path.exists() {
        std::fs::remove_file(metrics_path).map_err(|e| CliError::io(metrics_path, e))?;
    }
    Ok(())
}

/// The device of a run, with its float type set by `training.precision`.
pub(crate) fn training_device(backend: Backend, precision: Precision) -> Result<Device, CliError> {
    let mut device = backend.device()?;
    if precision != Precision::F32 {
        if backend != Backend::Cuda {
            return Err(CliError::Input(format!(
                "training.precision = {precision:?} needs the cuda backend (this run uses {backend})"
            )));
        }
        let dtype = if precision == Precision::Bf16 {
            FloatDType::BF16
        } else {
            FloatDType::F16
        };
        device
            .configure(DeviceConfig::default().float_dtype(dtype))
            .map_err(|e| CliError::Input(format!("training.precision: {e:?}")))?;
    }
    Ok(device)
}

impl ValidationSet {
    /// Mean validated cost of `model`'s decodes, and the mean gap to the reference costs
    /// in percent when the set has them.
    pub(crate) fn evaluate(
        &self,
        model: &impl Policy,
        options: &DecodeOptions,
        device: &Device,
    ) -> Result<(f64, Option<f64>), CliError> {
        let costs = decode_costs(model, &self.batches, options, device)?;
        let gap = self.references.as_ref().map(|refs| {
            100.0
                * mean(
                    &costs
                        .iter()
                        .zip(refs)
                        .map(|(c, r)| c / r - 1.0)
                        .collect::<Vec<_>>(),
                )
        });
        Ok((mean(&costs), gap))
    }
}

/// `path` as given if it exists, else relative to the config's directory or one of its
/// parents (the shipped configs in `configs/` name files from the repository root, so they
/// work from any working directory).
pub fn resolve(path: &Path, config_dir: Option<&Path>) -> PathBuf {
    if path.is_absolute() || path.exists() {
        return path.to_path_buf();
    }
    config_dir
        .into_iter()
        .flat_map(Path::ancestors)
        .map(|d| d.join(path))
        .find(|p| p.exists())
        .unwrap_or_else(|| path.to_path_buf())
}

enum BaselineRuntime {
    Exponential(ExponentialBaseline),
    /// Rollout after `warmup_epochs` of exponential warm-up.
    Rollout {
        rollout: Box<RolloutBaseline>,
        warmup: ExponentialBaseline,
    },
    Pomo,
}

/// Runs (or resumes) a training run to completion.
pub fn train(opts: TrainOptions) -> Result<TrainSummary, CliError> {
    let config = opts.config.clone();
    if config.model.kind == ModelKind::PtrNet {
        return crate::supervised::train_supervised(opts);
    }
    let t = &config.training;
    let device = training_device(opts.backend, t.precision)?;
    let train_device = device.clone().autodiff();
    let generator = config.generator().map_err(CliError::Input)?;
    let checkpoints = Checkpoints::new(opts.run_dir.join(&config.checkpointing.dir));
    let metrics_path = opts.run_dir.join("metrics.csv");
    let pomo = t.baseline == BaselineKind::Pomo;
    let greedy = DecodeOptions::greedy().with_check_every(t.decode_check_every);
    let validation_options =
        greedy.with_multi_start(config.validation.strategy == ValidationStrategy::Multistart);
    let eval_spec = EvalSetSpec {
        generator: &generator,
        size: t.baseline_eval_size,
        batch_size: config.validation.batch_size,
        options: greedy,
        device: &device,
    };

    // Model, optimizer, baseline and random streams: fresh or from the latest checkpoint.
    // Burn's seed is global per backend: hold a lock from seeding to the end of
    // initialisation, so runs in one process (tests) cannot interleave their draws.
    let mut model: AttentionModel = {
        let _guard = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        train_device.seed(t.seed);
        config.model.attention_model().init(&train_device)
    };
    let mut optimizer = AdamConfig::new().with_epsilon(1e-8).init();
    let mut train_rng = InstanceRng::new(t.seed ^ TRAIN_STREAM);
    let mut noise_rng = InstanceRng::new(t.seed ^ NOISE_STREAM);
    let mut start_epoch = 0;
    let mut elapsed_before = 0.0;
    let mut baseline;
    if opts.resume {
        let (dir, state) = latest_checkpoint(&checkpoints, &config)?;
        let model_path = dir.join(MODEL_FILE);
        model = model
            .try_load_file(&model_path)
            .map_err(|e| record_error(&model_path, "model", e))?;
        let opt_path = dir.join(OPTIMIZER_FILE);
        optimizer = optimizer
            .load(&opt_path)
            .map_err(|e| record_error(&opt_path, "optimizer state", e))?;
        train_rng = state.train_rng.clone();
        noise_rng = state.noise_rng.clone();
        start_epoch = state.epochs_completed;
        elapsed_before = state.elapsed_seconds;
        baseline = match t.baseline {
            BaselineKind::Exponential => BaselineRuntime::Exponential(ExponentialBaseline {
                beta: t.exp_beta,
                value: state.baseline.exponential_value,
            }),
            BaselineKind::Pomo => BaselineRuntime::Pomo,
            BaselineKind::Rollout => {
                let bl_path = dir.join(BASELINE_FILE);
                let frozen = {
                    // Initialising draws from Burn's global RNG too (see INIT_LOCK).
                    let _guard = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
                    config.model.attention_model().init(&device)
                }
                .try_load_file(&bl_path)
                .map_err(|e| record_error(&bl_path, "baseline model", e))?;
                let (Some(rng), Some(seed)) = (
                    state.baseline.rollout_rng.clone(),
                    state.baseline.rollout_eval_seed,
                ) else {
                    return Err(CliError::Input(format!(
                        "{}: rollout baseline state missing",
                        dir.display()
                    )));
                };
                BaselineRuntime::Rollout {
                    rollout: Box::new(RolloutBaseline::new(frozen, rng, seed, &eval_spec)?),
                    warmup: ExponentialBaseline {
                        beta: t.exp_beta,
                        value: state.baseline.exponential_value,
                    },
                }
            }
        };
        announce_resume(&opts, &metrics_path, start_epoch)?;
    } else {
        if let Some(path) = &opts.init_weights {
            model = model
                .try_load_file(path)
                .map_err(|e| record_error(path, "initial weights", e))?;
        }
        start_run_dir(&opts.run_dir, &config, &metrics_path)?;
        baseline = match t.baseline {
            BaselineKind::Exponential => {
                BaselineRuntime::Exponential(ExponentialBaseline::new(t.exp_beta))
            }
            BaselineKind::Pomo => BaselineRuntime::Pomo,
            BaselineKind::Rollout => {
                let mut rng = InstanceRng::new(t.seed ^ BASELINE_STREAM);
                let seed = rng.next_u64();
                BaselineRuntime::Rollout {
                    rollout: Box::new(RolloutBaseline::new(model.valid(), rng, seed, &eval_spec)?),
                    warmup: ExponentialBaseline::new(t.exp_beta),
                }
            }
        };
    }

    let validation = load_validation(&config, &generator, opts.config_dir.as_deref())?;
    let mut history = Vec::new();
    let run_start = Instant::now();
    let last_epoch = opts.stop_after_epochs.map_or(t.epochs, |s| s.min(t.epochs));

    for epoch in start_epoch..last_epoch {
        let epoch_start = Instant::now();
        let lr = t.lr * t.lr_decay.powi(epoch as i32);
        let mut times = PhaseTimes::default();
        let (mut cost_sum, mut baseline_sum, mut rows_seen) = (0.0, 0.0, 0usize);
        let mut loss_sum = 0.0;
        let mut grad_norm_sum = 0.0;
        let mut stats_seen = 0usize;
        // Loss and gradient norm of the previous step, read with the next download.
        let mut pending: Option<Tensor<1>> = None;
        let use_rollout =
            matches!(baseline, BaselineRuntime::Rollout { .. }) && epoch >= t.warmup_epochs;
        let progress = progress_bar(&config, epoch, opts.verbose);

        for step in 0..t.batches_per_epoch {
            let batch = times.time(Phase::Generate, || {
                generator.sample_batch(&mut train_rng, t.batch_size)
            });
            let rows = if pomo { batch.n } else { 1 };
            let problem = times.time(Phase::Upload, || {
                DeviceBatch::upload(
                    &batch,
                    Some((
                        NoiseShape {
                            rows_per_instance: rows,
                        },
                        &mut noise_rng,
                    )),
                    &train_device,
                )
            });
            let sampled = times.time(Phase::Forward, || {
                model.decode(
                    &problem,
                    &DecodeOptions::sample(1.0)
                        .with_multi_start(pomo)
                        .with_check_every(t.decode_check_every),
                )
            });
            let baseline_actions = times.time(Phase::Baseline, || match &baseline {
                BaselineRuntime::Rollout { rollout, .. } if use_rollout => Some(
                    rollout
                        .model
                        .decode(&problem.without_autodiff(), &greedy)
                        .actions,
                ),
                _ => None,
            });

            // One device read: the sampled actions, the baseline's actions, last step's stats.
            let (costs, baseline_values) =
                times.time(Phase::DownloadCost, || -> Result<_, CliError> {
                    let mut tx = Transaction::default()
                        .register(sampled.actions.clone().without_autodiff())
                        .register(sampled.log_likelihood.clone().without_autodiff().sum());
                    if let Some(a) = &baseline_actions {
                        tx = tx.register(a.clone());
                    }
                    if let Some(p) = pending.take() {
                        tx = tx.register(p);
                    }
                    let mut data = tx.execute().into_iter();
                    let actions = int_data_to_i64(data.next().expect("actions"));
                    let ll_sum: Vec<f32> = data
                        .next()
                        .expect("ll")
                        .try_into_vec_as::<f32>()
                        .expect("f32");
                    let bl_actions = baseline_actions
                        .as_ref()
                        .map(|_| int_data_to_i64(data.next().expect("baseline")));
                    // A policy with non-finite log-probabilities emits garbage; say why first.
                    if !ll_sum[0].is_finite() {
                        return Err(non_finite(
                            "log-likelihood",
                            ll_sum[0],
                            epoch,
                            step,
                            &checkpoints,
                        ));
                    }
                    if let Some(stats) = data.next() {
                        let s: Vec<f32> = stats.try_into_vec_as::<f32>().expect("f32 stats");
                        check_finite(s[0], epoch, step.saturating_sub(1), &checkpoints)?;
                        loss_sum += s[0] as f64;
                        grad_norm_sum += s[1] as f64;
                        stats_seen += 1;
                    }
                    let [_, steps] = sampled.actions.dims();
                    let costs = validated_costs(&batch, &actions, steps, rows)?;
                    let baseline_values: Vec<f64> = match &mut baseline {
                        BaselineRuntime::Pomo => {
                            // Each rollout's baseline is the mean over its instance's rollouts.
                            costs
                                .chunks(rows)
                                .flat_map(|c| std::iter::repeat_n(mean(c), rows))
                                .collect()
                        }
                        BaselineRuntime::Rollout { .. } if use_rollout => {
                            let bl_actions = bl_actions.expect("rollout baseline decoded");
                            let bl_steps = baseline_actions.as_ref().unwrap().dims()[1];
                            validated_costs(&batch, &bl_actions, bl_steps, 1)?
                        }
                        BaselineRuntime::Rollout { warmup: exp, .. }
                        | BaselineRuntime::Exponential(exp) => {
                            vec![exp.update(mean(&costs)); costs.len()]
                        }
                    };
                    Ok((costs, baseline_values))
                })?;

            let loss = times.time(Phase::Backward, || {
                let advantage: Vec<f32> = costs
                    .iter()
                    .zip(&baseline_values)
                    .map(|(c, b)| (c - b) as f32)
                    .collect();
                let r = advantage.len();
                let advantage =
                    Tensor::<1>::from_data(TensorData::new(advantage, [r]), &train_device);
                let loss = (advantage * sampled.log_likelihood.clone()).mean(); // [1]
                let grads = loss.backward();
                (loss, GradientsParams::from_grads(grads, &model))
            });
            let (loss, mut grads) = loss;
            times.time(Phase::Optimizer, || {
                let norm = clip_global_norm(&model, &mut grads, t.max_grad_norm)
                    .unwrap_or_else(|| Tensor::zeros([1], &device));
                model = optimizer.step(lr, model.clone(), grads);
                pending = Some(Tensor::cat(vec![loss.without_autodiff(), norm], 0));
            });

            cost_sum += costs.iter().sum::<f64>();
            baseline_sum += baseline_values.iter().sum::<f64>();
            rows_seen += costs.len();
            if let Some(pb) = &progress {
                pb.set_position(step as u64 + 1);
                let inst_per_s =
                    ((step + 1) * t.batch_size) as f64 / epoch_start.elapsed().as_secs_f64();
                pb.set_message(format!(
                    "{inst_per_s:.0} inst/s, cost {:.4}",
                    cost_sum / rows_seen as f64
                ));
            }
        }
        if let Some(p) = pending.take() {
            let s: Vec<f32> = p.into_data().try_into_vec_as::<f32>().expect("f32 stats");
            check_finite(s[0], epoch, t.batches_per_epoch - 1, &checkpoints)?;
            loss_sum += s[0] as f64;
            grad_norm_sum += s[1] as f64;
            stats_seen += 1;
        }
        if let Some(pb) = progress {
            pb.finish_and_clear();
        }
        let train_seconds = epoch_start.elapsed().as_secs_f64();

        // Validation, then the rollout baseline's end-of-epoch test.
        let inference_model = model.valid();
        let (val_cost, val_gap, baseline_updated) =
            times.time(Phase::Validation, || -> Result<_, CliError> {
                let (val_cost, gap) =
                    validation.evaluate(&inference_model, &validation_options, &device)?;
                let mut updated = false;
                if let BaselineRuntime::Rollout { rollout, .. } = &mut baseline {
                    let test = rollout.epoch_end(&inference_model, t.baseline_alpha, &eval_spec)?;
                    updated = test.replaced;
                    if opts.verbose {
                        eprintln!(
                            "  rollout baseline: candidate {:.4} vs baseline {:.4}, p = {}{}",
                            test.candidate_mean,
                            test.baseline_mean,
                            test.p_value.map_or("-".into(), |p| format!("{p:.4}")),
                            if test.replaced { " -> replaced" } else { "" }
                        );
                    }
                }
                Ok((val_cost, gap, updated))
            })?;

        let seconds = epoch_start.elapsed().as_secs_f64();
        let metrics = EpochMetrics {
            epoch: epoch + 1,
            train_cost: cost_sum / rows_seen as f64,
            baseline_cost: baseline_sum / rows_seen as f64,
            loss: loss_sum / stats_seen.max(1) as f64,
            grad_norm: grad_norm_sum / stats_seen.max(1) as f64,
            lr,
            val_cost,
            val_gap,
            baseline_updated,
            instances_per_second: (t.batches_per_epoch * t.batch_size) as f64 / train_seconds,
            seconds,
            elapsed_seconds: elapsed_before + run_start.elapsed().as_secs_f64(),
            phases: times,
        };
        let baseline_state = match &baseline {
            BaselineRuntime::Exponential(e) => BaselineState {
                exponential_value: e.value,
                rollout_rng: None,
                rollout_eval_seed: None,
            },
            BaselineRuntime::Rollout { rollout, warmup } => BaselineState {
                exponential_value: warmup.value,
                rollout_rng: Some(rollout.rng.clone()),
                rollout_eval_seed: Some(rollout.eval_seed),
            },
            BaselineRuntime::Pomo => BaselineState::none(),
        };
        let state = TrainState::after_epoch(
            &config,
            epoch,
            &train_rng,
            &noise_rng,
            baseline_state,
            &metrics,
        );
        end_epoch(
            &opts,
            &checkpoints,
            &metrics_path,
            &metrics,
            &state,
            |dir| {
                save_module(&model, &dir.join(MODEL_FILE), "model")?;
                let p = dir.join(OPTIMIZER_FILE);
                optimizer
                    .save(&p)
                    .map_err(|e| record_error(&p, "optimizer (saving)", e))?;
                if let BaselineRuntime::Rollout { rollout, .. } = &baseline {
                    save_module(&rollout.model, &dir.join(BASELINE_FILE), "baseline")?;
                }
                Ok(())
            },
        )?;
        history.push(metrics);
    }
    Ok(TrainSummary {
        run_dir: opts.run_dir,
        epochs: history,
    })
}

pub(crate) fn check_finite(
    loss: f32,
    epoch: usize,
    step: usize,
    checkpoints: &Checkpoints,
) -> Result<(), CliError> {
    if loss.is_finite() {
        Ok(())
    } else {
        Err(non_finite("loss", loss, epoch, step, checkpoints))
    }
}

pub(crate) fn non_finite(
    what: &str,
    value: f32,
    epoch: usize,
    step: usize,
    checkpoints: &Checkpoints,
) -> CliError {
    let value = if value.is_nan() {
        "NaN".to_string()
    } else {
        value.to_string()
    };
    CliError::Failed(format!(
        "the {what} became {value} at epoch {}, batch {}; stopping. The last good checkpoint in {} is intact: lower training.lr or training.max_grad_norm, then resume with --resume",
        epoch + 1,
        step + 1,
        checkpoints.dir.display()
    ))
}

pub(crate) fn progress_bar(config: &Config, epoch: usize, verbose: bool) -> Option<ProgressBar> {
    if !(verbose && config.logging.progress && std::io::stderr().is_terminal()) {
        return None;
    }
    let pb = ProgressBar::new(config.training.batches_per_epoch as u64);
    pb.set_style(
        ProgressStyle::with_template(
            "epoch {prefix} [{bar:30}] {pos}/{len} batches, eta {eta} | {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_prefix(format!("{}/{}", epoch + 1, config.training.epochs));
    Some(pb)
}

pub(crate) fn print_summary(m: &EpochMetrics, epochs: usize, kind: ModelKind) {
    let costs = match kind {
        ModelKind::GtRl => format!(
            "train {:.4} | baseline {:.4}",
            m.train_cost, m.baseline_cost
        ),
        ModelKind::PtrNet => format!("labels {:.4}", m.train_cost),
    };
    eprintln!(
        "epoch {}/{epochs}: {costs} | val {:.4}{} | loss {:.4} | grad norm {:.3} | {:.1}s, {:.0} inst/s",
        m.epoch,
        m.val_cost,
        m.val_gap.map_or(String::new(), |g| format!(" (gap {g:.2}%)")),
        m.loss,
        m.grad_norm,
        m.seconds,
        m.instances_per_second
    );
    eprintln!("  phases: {}", m.phases.summary());
}
