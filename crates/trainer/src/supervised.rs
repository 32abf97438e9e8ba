//! Supervised training of the pointer network on heuristic labels, by teacher forcing.
//!
//! 1. **Labels, ahead of training.** `supervised.labels` instances are drawn from the
//!    problem's generator and solved by the classical heuristic on every core
//!    (`routeburn_data::label_instances`), then written as a JSONL dataset; a run that
//!    finds the file reads it instead, so labels are computed once.
//! 2. **Batching beside training.** Each epoch shuffles the labels; a second thread builds
//!    the batches (instances and target tours) a few ahead of the training loop.
//! 3. **Per batch:** one upload (instances, targets and their valid mask in one buffer),
//!    the teacher-forced forward, the masked NLL loss, backward, global-norm clip, Adam.
//!    The loss and gradient norm of step k are read with step k+1's (the only download).
//! 4. **Per epoch:** greedy validation, metrics, checkpoint, exactly as the RL trainer.
//!
//! Dropout draws from Burn's global RNG; the run reseeds it at the start of every epoch,
//! so a run resumed between epochs continues exactly as if it had never stopped.

use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;
use std::time::Instant;

use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::Tensor;
use indicatif::{ProgressBar, ProgressStyle};
use routeburn_data::{label_instances, read_jsonl, write_jsonl, Batch, InstanceRng, Record};
use routeburn_model::{pointer_network_loss, DecodeOptions, DeviceBatch, PointerNetwork};

use crate::checkpoint::{
    record_error, save_module, BaselineState, Checkpoints, TrainState, MODEL_FILE, OPTIMIZER_FILE,
};
use crate::clip::clip_global_norm;
use crate::config::Config;
use crate::error::CliError;
use crate::evaluate::mean;
use crate::metrics::{EpochMetrics, Phase, PhaseTimes};
use crate::training::{
    announce_resume, check_finite, end_epoch, latest_checkpoint, load_validation, progress_bar,
    resolve, start_run_dir, training_device, TrainOptions, TrainSummary, INIT_LOCK, NOISE_STREAM,
    TRAIN_STREAM,
};

/// Batches the loader may build ahead of the training loop.
const PREFETCH: usize = 4;

/// One labelled training example in the form the loop needs.
struct Example {
    record: Record,
    /// The label as decoder actions: each route, then a depot visit.
    target: Vec<i64>,
}

/// A batch ready to upload.
struct LabelledBatch {
    batch: Batch,
    targets: Vec<Vec<i64>>,
    label_cost: f64,
}

/// Trains (or resumes) the pointer network; see the module docs.
pub fn train_supervised(opts: TrainOptions) -> Result<TrainSummary, CliError> {
    let config = opts.config.clone();
    let t = &config.training;
    let device = training_device(opts.backend, t.precision)?;
    let train_device = device.clone().autodiff();
    let generator = config.generator().map_err(CliError::Input)?;
    let checkpoints = Checkpoints::new(opts.run_dir.join(&config.checkpointing.dir));
    let metrics_path = opts.run_dir.join("metrics.csv");

    let mut model: PointerNetwork = {
        let _guard = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        train_device.seed(t.seed);
        config.model.pointer_network().init(&train_device)
    };
    let mut optimizer = AdamConfig::new().with_epsilon(1e-8).init();
    let mut train_rng = InstanceRng::new(t.seed ^ TRAIN_STREAM);
    let mut start_epoch = 0;
    let mut elapsed_before = 0.0;
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
        start_epoch = state.epochs_completed;
        elapsed_before = state.elapsed_seconds;
        announce_resume(&opts, &metrics_path, start_epoch)?;
    } else {
        start_run_dir(&opts.run_dir, &config, &metrics_path)?;
    }

    let examples = load_or_make_labels(&config, &opts)?;
    let validation = load_validation(&config, &generator, opts.config_dir.as_deref())?;
    let greedy = DecodeOptions::greedy().with_check_every(t.decode_check_every);
    let full_pass = examples.len().div_ceil(t.batch_size);
    let batches_per_epoch = match t.batches_per_epoch {
        0 => full_pass,
        cap => cap.min(full_pass),
    };
    let mut history = Vec::new();
    let run_start = Instant::now();
    let last_epoch = opts.stop_after_epochs.map_or(t.epochs, |s| s.min(t.epochs));

    for epoch in start_epoch..last_epoch {
        let epoch_start = Instant::now();
        {
            let _guard = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
            train_device.seed(t.seed ^ (epoch as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
        let lr = t.lr * t.lr_decay.powi(epoch as i32);
        let teacher_forcing = config.supervised.teacher_forcing_at(epoch);
        let mut times = PhaseTimes::default();
        let order = shuffled(examples.len(), &mut train_rng);
        let (mut label_cost_sum, mut instances_seen) = (0.0, 0usize);
        let (mut loss_sum, mut grad_norm_sum, mut stats_seen) = (0.0, 0.0, 0usize);
        let mut pending: Option<Tensor<1>> = None;
        let progress = progress_bar(&config, epoch, opts.verbose);
        if let Some(pb) = &progress {
            pb.set_length(batches_per_epoch as u64);
        }

        std::thread::scope(|scope| -> Result<(), CliError> {
            let (sender, batches) = sync_channel::<Result<LabelledBatch, CliError>>(PREFETCH);
            let examples = &examples;
            let order = &order;
            scope.spawn(move || {
                for chunk in order.chunks(t.batch_size).take(batches_per_epoch) {
                    let picked: Vec<&Example> = chunk.iter().map(|&i| &examples[i]).collect();
                    let built = Batch::from_instances(picked.iter().map(|e| &e.record.instance))
                        .map(|batch| LabelledBatch {
                            batch,
                            targets: picked.iter().map(|e| e.target.clone()).collect(),
                            label_cost: picked
                                .iter()
                                .map(|e| e.record.reference_cost.unwrap_or(f64::NAN))
                                .sum(),
                        })
                        .map_err(|e| CliError::Input(e.to_string()));
                    if sender.send(built).is_err() {
                        break; // the loop stopped early (an error); nothing more to build
                    }
                }
            });

            for step in 0..batches_per_epoch {
                let labelled = times.time(Phase::Generate, || {
                    batches.recv().expect("the batch loader sends every batch")
                })?;
                let (problem, targets) = times.time(Phase::Upload, || {
                    DeviceBatch::upload_with_targets(
                        &labelled.batch,
                        &labelled.targets,
                        &train_device,
                    )
                });
                let [_, steps] = targets.targets.dims();
                let teacher: Vec<bool> = (0..steps)
                    .map(|_| train_rng.unit() < teacher_forcing)
                    .collect();
                let loss = times.time(Phase::Forward, || {
                    let log_probs =
                        model.teacher_forced(&problem, targets.targets.clone(), &teacher);
                    pointer_network_loss(log_probs, targets.targets, targets.valid)
                });
                times.time(Phase::DownloadCost, || -> Result<(), CliError> {
                    if let Some(p) = pending.take() {
                        let s: Vec<f32> =
                            p.into_data().try_into_vec_as::<f32>().expect("f32 stats");
                        check_finite(s[0], epoch, step.saturating_sub(1), &checkpoints)?;
                        loss_sum += s[0] as f64;
                        grad_norm_sum += s[1] as f64;
                        stats_seen += 1;
                    }
                    Ok(())
                })?;
                let mut grads = times.time(Phase::Backward, || {
                    GradientsParams::from_grads(loss.backward(), &model)
                });
                times.time(Phase::Optimizer, || {
                    let norm = clip_global_norm(&model, &mut grads, t.max_grad_norm)
                        .unwrap_or_else(|| Tensor::zeros([1], &device));
                    model = optimizer.step(lr, model.clone(), grads);
                    pending = Some(Tensor::cat(vec![loss.without_autodiff(), norm], 0));
                });
                label_cost_sum += labelled.label_cost;
                instances_seen += labelled.batch.size;
                if let Some(pb) = &progress {
                    pb.set_position(step as u64 + 1);
                    let inst_per_s = instances_seen as f64 / epoch_start.elapsed().as_secs_f64();
                    pb.set_message(format!(
                        "{inst_per_s:.0} inst/s, loss {:.4}",
                        loss_sum / stats_seen.max(1) as f64
                    ));
                }
            }
            Ok(())
        })?;
        if let Some(p) = pending.take() {
            let s: Vec<f32> = p.into_data().try_into_vec_as::<f32>().expect("f32 stats");
            check_finite(s[0], epoch, batches_per_epoch - 1, &checkpoints)?;
            loss_sum += s[0] as f64;
            grad_norm_sum += s[1] as f64;
            stats_seen += 1;
        }
        if let Some(pb) = progress {
            pb.finish_and_clear();
        }
        let train_seconds = epoch_start.elapsed().as_secs_f64();

        let inference_model = model.valid();
        let (val_cost, val_gap) = times.time(Phase::Validation, || {
            validation.evaluate(&inference_model, &greedy, &device)
        })?;
        let label_cost = label_cost_sum / instances_seen.max(1) as f64;
        let metrics = EpochMetrics {
            epoch: epoch + 1,
            // A supervised run has no sampled tours: both columns hold the labels' cost.
            train_cost: label_cost,
            baseline_cost: label_cost,
            loss: loss_sum / stats_seen.max(1) as f64,
            grad_norm: grad_norm_sum / stats_seen.max(1) as f64,
            lr,
            val_cost,
            val_gap,
            baseline_updated: false,
            instances_per_second: instances_seen as f64 / train_seconds,
            seconds: epoch_start.elapsed().as_secs_f64(),
            elapsed_seconds: elapsed_before + run_start.elapsed().as_secs_f64(),
            phases: times,
        };
        let state = TrainState::after_epoch(
            &config,
            epoch,
            &train_rng,
            &InstanceRng::new(t.seed ^ NOISE_STREAM),
            BaselineState::none(),
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
                    .map_err(|e| record_error(&p, "optimizer (saving)", e))
            },
        )?;
        history.push(metrics);
    }
    Ok(TrainSummary {
        run_dir: opts.run_dir,
        epochs: history,
    })
}

/// A permutation of `0..len` drawn from the run's stream.
fn shuffled(len: usize, rng: &mut InstanceRng) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    rng.shuffle(&mut order);
    order
}

/// Where the run's labels live: `supervised.labels_file`, or `labels.jsonl` in the run.
fn labels_path(config: &Config, opts: &TrainOptions) -> PathBuf {
    match &config.supervised.labels_file {
        Some(p) => resolve(p, opts.config_dir.as_deref()),
        None => opts.run_dir.join("labels.jsonl"),
    }
}

/// Reads the labels file, or labels fresh instances and writes it.
fn load_or_make_labels(config: &Config, opts: &TrainOptions) -> Result<Vec<Example>, CliError> {
    let path = labels_path(config, opts);
    let records = if path.exists() {
        let records = read_jsonl(&path)?;
        check_labels(&records, config, &path)?;
        if opts.verbose {
            eprintln!(
                "{} labelled instances from {}",
                records.len(),
                path.display()
            );
        }
        records
    } else {
        make_labels(config, &path, opts.verbose)?
    };
    Ok(records
        .into_iter()
        .map(|record| {
            let target = record
                .reference_routes
                .as_ref()
                .expect("checked: every record has a label")
                .to_actions(0);
            Example { record, target }
        })
        .collect())
}

fn check_labels(records: &[Record], config: &Config, path: &Path) -> Result<(), CliError> {
    let n = config.problem.n;
    if records.is_empty() {
        return Err(CliError::Input(format!(
            "{}: no labelled instances",
            path.display()
        )));
    }
    for (i, r) in records.iter().enumerate() {
        if r.instance.n() != n {
            return Err(CliError::Input(format!(
                "{} line {}: instance `{}` has {} customers, but problem.n is {n}",
                path.display(),
                i + 1,
                r.instance.name(),
                r.instance.n()
            )));
        }
        if r.reference_routes.is_none() {
            return Err(CliError::Input(format!(
                "{} line {}: no `reference_routes`; a labels file needs a solution per instance",
                path.display(),
                i + 1
            )));
        }
    }
    Ok(())
}

fn make_labels(config: &Config, path: &Path, verbose: bool) -> Result<Vec<Record>, CliError> {
    let sup = &config.supervised;
    let generator = config.generator().map_err(CliError::Input)?;
    let instances =
        generator.sample_many(&mut InstanceRng::new(sup.label_seed), sup.labels, "label");
    let start = Instant::now();
    let pb = labelling_progress(instances.len(), verbose);
    let records = label_instances(&instances, &sup.heuristic(), &|_| pb.inc(1));
    pb.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| CliError::io(parent, e))?;
    }
    // Write beside, then rename: a killed run never leaves half a labels file.
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    write_jsonl(&tmp, &records)?;
    std::fs::rename(&tmp, path).map_err(|e| CliError::io(path, e))?;
    if verbose {
        let costs: Vec<f64> = records.iter().filter_map(|r| r.reference_cost).collect();
        eprintln!(
            "labelled {} instances in {seconds:.1}s ({:.2} ms each on {} threads), mean cost {:.4}; written to {}",
            records.len(),
            1000.0 * seconds / records.len().max(1) as f64 * rayon::current_num_threads() as f64,
            rayon::current_num_threads(),
            mean(&costs),
            path.display()
        );
    }
    Ok(records)
}

/// The labelling progress bar (hidden unless `visible`).
pub(crate) fn labelling_progress(len: usize, visible: bool) -> ProgressBar {
    if !visible {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len as u64);
    pb.set_style(
        ProgressStyle::with_template(
            "labelling [{bar:30}] {pos}/{len} instances, {per_sec}, eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb
}
