//! The run skeleton, generic over a [`TrainingMethod`]: it owns the run directory, the
//! device, seeding, resume, the epoch loop, the backward pass, global-norm clipping and
//! the Adam step, validation, metrics, progress and checkpoints. A method supplies only a
//! step's loss (`reinforce::Reinforce`, `supervised::Supervised`).
//!
//! Every step's loss and gradient norm stay on the device until the next step reads the
//! device anyway, so the NaN guard costs no sync; a NaN stops the run before the next
//! checkpoint, so the last good one stays intact.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::Module;
use burn::tensor::{Device, DeviceConfig, FloatDType, Tensor};
use indicatif::ProgressBar;
use routeburn_data::InstanceRng;
use routeburn_model::Backend;

use crate::adam::Adam;
use crate::atomic::write_atomic;
use crate::config::{Config, Precision};
use crate::error::TrainError;
use crate::run::averaging::WeightAverage;
use crate::run::checkpoint::{
    record_error, save_module, BaselineState, BestValidation, Checkpoints, EpochProgress,
    TrainState, MODEL_FILE, OPTIMIZER_FILE, TRAINING_MODEL_FILE,
};
use crate::run::interrupt;
use crate::run::lock::RunLock;
use crate::run::lr_schedule::{LrSchedule, RunPosition};
use crate::run::method::{RunRngs, Setup, StepContext, StepLoss, StepStats, TrainingMethod};
use crate::run::metrics::{append_metrics, truncate_metrics, EpochMetrics, Phase, PhaseTimes};
use crate::run::paths::pin_input_paths;
use crate::run::progress::{epoch_bar, print_summary};
use crate::run::validation::ValidationSet;
use crate::shards::ShardedStep;

/// Burn's seed is global per backend: [`seeded`] holds this from seeding to the end of an
/// initialisation, so runs in one process (tests) cannot interleave their draws.
pub(crate) static INIT_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Seeds of the independent random streams, derived from `training.seed`.
const TRAIN_STREAM: u64 = 0x7261_696e;
const NOISE_STREAM: u64 = 0x6e6f_6973;

/// Runs `f` holding [`INIT_LOCK`], after seeding Burn's RNG when `seed` is given.
pub(crate) fn seeded<T>(device: &Device, seed: Option<u64>, f: impl FnOnce() -> T) -> T {
    let _guard = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(seed) = seed {
        device.seed(seed);
    }
    f()
}

/// How to run a training run.
#[derive(Clone)]
pub struct TrainOptions {
    pub config: Config,
    pub run_dir: PathBuf,
    pub backend: Backend,
    /// Continue from the run directory's latest checkpoint.
    pub resume: bool,
    /// With `resume`: continue from this checkpoint (`epoch-NNNN`) instead of the latest.
    pub resume_from: Option<String>,
    /// Stop (as if killed) after this many epochs in total; for tests of resuming.
    pub stop_after_epochs: Option<usize>,
    /// Print progress and summaries.
    pub verbose: bool,
    /// Base directory for relative dataset paths in the config (the config's directory).
    pub config_dir: Option<PathBuf>,
    /// Start a fresh run from these weights (a burnpack file) instead of the seeded
    /// initialisation: `compare-backends` gives every backend the same start.
    pub init_weights: Option<PathBuf>,
    /// Validate the starting weights before the first epoch of a fresh run
    /// (`train --init-from`).
    pub validate_initial: bool,
    /// Called after each epoch with its metrics (`compare-backends --count-compiles` reads
    /// CubeCL's counters there).
    pub after_epoch: Option<EpochHook>,
}

/// What [`TrainOptions::after_epoch`] runs.
pub type EpochHook = std::sync::Arc<dyn Fn(&EpochMetrics) + Send + Sync>;

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct TrainSummary {
    pub run_dir: PathBuf,
    pub epochs: Vec<EpochMetrics>,
    /// Validation cost (and gap) of the starting weights, with `validate_initial`.
    pub initial_validation: Option<(f64, Option<f64>)>,
}

/// The device of a run, with its float type set by `training.precision`.
pub(crate) fn training_device(
    backend: Backend,
    precision: Precision,
) -> Result<Device, TrainError> {
    let mut device = backend.device()?;
    if precision != Precision::F32 {
        if backend != Backend::Cuda {
            return Err(TrainError::Input(format!(
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
            .map_err(|e| TrainError::Input(format!("training.precision: {e:?}")))?;
    }
    Ok(device)
}

/// Removes the run directory `made[0]` and its parents `made[1..]`, made by this run. A
/// parent goes only if it is empty: another run may have put its own directory there.
fn remove_made(made: &[PathBuf]) {
    if let Some((run_dir, parents)) = made.split_first() {
        let _ = std::fs::remove_dir_all(run_dir);
        for dir in parents {
            if std::fs::remove_dir(dir).is_err() {
                break;
            }
        }
    }
}

/// Runs (or resumes) a run of method `M` to completion.
pub(crate) fn run<M: TrainingMethod>(mut opts: TrainOptions) -> Result<TrainSummary, TrainError> {
    opts.config.training.shards = Some(resolve_shards(&opts));
    if !opts.resume {
        pin_input_paths(&mut opts.config, opts.config_dir.as_deref());
    }
    let t = &opts.config.training;
    let last_epoch = opts.stop_after_epochs.map_or(t.epochs, |s| s.min(t.epochs));
    // A run refused before it trains (bad precision, a missing validation file, unreadable
    // initial weights) leaves no directory behind that it made itself: neither its own nor
    // the parents made for it (`runs/` on a first run).
    let made_here: Vec<PathBuf> = opts
        .run_dir
        .ancestors()
        .take_while(|dir| !dir.as_os_str().is_empty() && !dir.exists())
        .map(Path::to_path_buf)
        .collect();
    let mut run = Run::<M>::start(opts).inspect_err(|_| remove_made(&made_here))?;
    let initial_validation = match run.opts.validate_initial && run.start_epoch == 0 {
        true => Some(run.validate_initial()?),
        false => None,
    };
    let mut history = Vec::new();
    if run.opts.resume && run.time_is_up_at(run.elapsed_before) {
        run.say_time_is_up(None);
    } else if run.opts.resume && run.start_epoch >= run.opts.config.training.epochs {
        run.say_epochs_done();
    } else {
        if run.opts.resume {
            announce_resume(&run.opts, &run.metrics_path, run.start_epoch)?;
        }
        for epoch in run.start_epoch..last_epoch {
            // The time recorded with the epoch is its checkpoint's, so a resume decides the
            // same way.
            let (metrics, stopped) = run.epoch(epoch)?;
            if let Some(hook) = &run.opts.after_epoch {
                hook(&metrics);
            }
            let time_up = stopped || run.time_is_up_at(metrics.elapsed_seconds);
            history.push(metrics);
            if time_up {
                run.say_time_is_up(history.last());
                break;
            }
        }
    }
    Ok(TrainSummary {
        run_dir: run.opts.run_dir,
        epochs: history,
        initial_validation,
    })
}

/// A run in progress.
struct Run<M: TrainingMethod> {
    opts: TrainOptions,
    /// The inference device, and the same with autodiff for training.
    device: Device,
    train_device: Device,
    checkpoints: Checkpoints,
    metrics_path: PathBuf,
    model: M::Model,
    /// With `training.average_from`, once begun: the mean of the weights at epochs' ends
    /// (inference copies), which validation scores and checkpoints hold as the model.
    average: Option<WeightAverage<M::Model>>,
    optimizer: Adam,
    rngs: RunRngs,
    method: M,
    validation: ValidationSet,
    start_epoch: usize,
    /// Where an interrupted epoch stood, for the run that resumes it.
    resume_progress: Option<EpochProgress>,
    /// The best validation so far, and the run's wall-clock budget in seconds.
    best: Option<BestValidation>,
    time_limit: Option<f64>,
    lr_schedule: LrSchedule,
    /// This process's claim on the run directory.
    _lock: RunLock,
    /// Wall time of earlier sessions of a resumed run, and when this one started.
    elapsed_before: f64,
    session_start: Instant,
}

/// Sums over an epoch's steps.
#[derive(Default)]
struct EpochTotals {
    cost_sum: f64,
    baseline_sum: f64,
    rows: usize,
    instances: usize,
}

impl<M: TrainingMethod> Run<M> {
    /// Model, optimizer, random streams and the method's state: fresh, or from the latest
    /// checkpoint.
    fn start(opts: TrainOptions) -> Result<Self, TrainError> {
        let lock = RunLock::acquire(&opts.run_dir)?;
        let config = &opts.config;
        let t = &config.training;
        let device = training_device(opts.backend, t.precision)?;
        let train_device = device.clone().autodiff();
        let checkpoints = Checkpoints::new(opts.run_dir.join(&config.checkpointing.dir));
        let metrics_path = opts.run_dir.join("metrics.csv");
        let mut model = seeded(&train_device, Some(t.seed), || {
            M::init_model(config, &train_device)
        })?;
        let weight_decay = (t.weight_decay > 0.0).then_some(t.weight_decay as f32);
        let mut optimizer = Adam::new(weight_decay, &device);
        let mut rngs = RunRngs {
            train: InstanceRng::new(t.seed ^ TRAIN_STREAM),
            noise: InstanceRng::new(t.seed ^ NOISE_STREAM),
        };
        let mut average = None;
        let resumed = (opts.resume)
            .then(|| resume_point(&checkpoints, config, opts.resume_from.as_deref()))
            .transpose()?;
        match &resumed {
            Some((dir, state)) => {
                (model, optimizer, average) =
                    load_training_state(model, optimizer, (dir, state), &device)?;
                rngs.train = state.train_rng.clone();
                rngs.noise = state.noise_rng.clone();
            }
            None => {
                if let Some(path) = &opts.init_weights {
                    model = model
                        .try_load_file(path)
                        .map_err(|e| record_error(path, "initial weights", e))?;
                }
                start_run_dir(&opts.run_dir, config, &metrics_path)?;
            }
        }
        let method = M::start(
            Setup {
                config,
                run_dir: &opts.run_dir,
                config_dir: opts.config_dir.as_deref(),
                device: &device,
                verbose: opts.verbose,
                resume: resumed.as_ref().map(|(d, s)| (d.as_path(), s)),
            },
            &model,
        )?;
        let start_epoch = resumed.as_ref().map_or(0, |(_, s)| s.epochs_completed);
        let validation = ValidationSet::load(
            config,
            &config.generator()?,
            opts.config_dir.as_deref(),
            opts.verbose,
        )?;
        Ok(Self {
            elapsed_before: resumed.as_ref().map_or(0.0, |(_, s)| s.elapsed_seconds),
            best: resumed.as_ref().and_then(|(_, s)| s.best),
            time_limit: t.time_limit_seconds(),
            lr_schedule: LrSchedule::new(t),
            resume_progress: resumed.and_then(|(_, s)| s.in_epoch),
            _lock: lock,
            opts,
            device,
            train_device,
            checkpoints,
            metrics_path,
            model,
            average,
            optimizer,
            rngs,
            method,
            validation,
            start_epoch,
            session_start: Instant::now(),
        })
    }

    /// The validation cost (and gap) of the weights the run starts from, printed.
    fn validate_initial(&self) -> Result<(f64, Option<f64>), TrainError> {
        let (cost, gap) = self
            .validation
            .evaluate(&self.model.valid(), &self.device)?;
        if self.opts.verbose {
            eprintln!(
                "initial weights: val {cost:.4}{}",
                gap.map_or(String::new(), |g| format!(" (gap {g:.2}%)"))
            );
        }
        Ok((cost, gap))
    }

    /// One epoch: the steps, validation, the method's end of epoch, metrics, checkpoint;
    /// and whether the time limit stopped it part-way.
    fn epoch(&mut self, epoch: usize) -> Result<(EpochMetrics, bool), TrainError> {
        let epoch_start = Instant::now();
        self.method.begin_epoch(epoch, &mut self.rngs);
        let (first_step, mut times, mut stats, mut totals, seconds_before) = self.epoch_sums();
        let steps = self.method.steps_per_epoch();
        let progress = epoch_bar(&self.opts.config, epoch, steps, self.opts.verbose);
        let mut steps_done = steps;
        let mut lr = 0.0;
        for step in first_step..steps {
            lr = self.lr_schedule.rate(RunPosition {
                epoch,
                step,
                steps_per_epoch: steps,
                elapsed_seconds: self.elapsed(),
            });
            let ctx = StepContext {
                epoch,
                step,
                device: &self.train_device,
                rngs: &mut self.rngs,
                times: &mut times,
                stats: &mut stats,
            };
            let out = self.method.step(&self.model, ctx)?;
            totals.add(&out);
            self.learn(out.learned, lr, &mut times, &mut stats)?;
            let left = self.time_left();
            show_progress(&progress, step, (&totals, &stats), epoch_start, left);
            interrupt::step_done();
            if let Some(signal) = interrupt::pending() {
                let seconds = seconds_before + epoch_start.elapsed().as_secs_f64();
                let sums = (&times, &mut stats, &totals, seconds);
                return Err(self.interrupted(signal, epoch, step + 1, sums));
            }
            if M::RESUMES_MID_EPOCH && step + 1 < steps && self.time_is_up() {
                steps_done = step + 1;
                break;
            }
        }
        stats.flush(epoch, steps_done.saturating_sub(1))?;
        if let Some(pb) = progress {
            pb.finish_and_clear();
        }
        let train_seconds = seconds_before + epoch_start.elapsed().as_secs_f64();

        let inference_model = self.model.valid();
        times.time(Phase::Optimizer, || {
            self.average_in(epoch, &inference_model)
        });
        let scored = self
            .average
            .as_ref()
            .map_or(&inference_model, WeightAverage::mean);
        let (val_cost, val_gap, baseline_updated) =
            times.time(Phase::Validation, || -> Result<_, TrainError> {
                let (cost, gap) = self.validation.evaluate(scored, &self.device)?;
                let updated = self.method.end_epoch(&inference_model, self.opts.verbose)?;
                Ok((cost, gap, updated))
            })?;
        let metrics = EpochMetrics {
            epoch: epoch + 1,
            train_cost: totals.cost_sum / totals.rows as f64,
            baseline_cost: totals.baseline_sum / totals.rows as f64,
            loss: stats.mean_loss(),
            grad_norm: stats.mean_grad_norm(),
            lr,
            val_cost,
            val_gap,
            baseline_updated,
            instances_per_second: totals.instances as f64 / train_seconds,
            seconds: seconds_before + epoch_start.elapsed().as_secs_f64(),
            elapsed_seconds: self.elapsed(),
            phases: times,
        };
        let stopped = steps_done < steps;
        let progress =
            stopped.then(|| totals.progress(steps_done, &stats, &metrics.phases, metrics.seconds));
        self.finish_epoch(epoch, &metrics, progress)?;
        Ok((metrics, stopped))
    }

    /// Adds the weights at the end of `epoch` (`model`, an inference copy) to the average,
    /// once the run is `training.average_from` of its way through.
    fn average_in(&mut self, epoch: usize, model: &M::Model) {
        let t = &self.opts.config.training;
        let Some(from) = t.average_from else {
            return;
        };
        let end = RunPosition {
            epoch: epoch + 1,
            step: 0,
            steps_per_epoch: 1,
            elapsed_seconds: self.elapsed(),
        };
        if end.progress(t.epochs, self.time_limit) < from {
            return;
        }
        match &mut self.average {
            Some(average) => average.add(model),
            None => {
                if self.opts.verbose {
                    eprintln!(
                        "averaging the weights from the end of epoch {} on (`training.average_from = {from}`): validation scores the average, and checkpoints hold it as the model",
                        epoch + 1
                    );
                }
                self.average = Some(WeightAverage::new(model));
            }
        }
    }

    /// Wall-clock seconds of the whole run, resumed sessions included.
    fn elapsed(&self) -> f64 {
        self.elapsed_before + self.session_start.elapsed().as_secs_f64()
    }

    /// Seconds of the time limit left (none without one).
    fn time_left(&self) -> Option<f64> {
        let spent = self.elapsed();
        self.time_limit.map(|limit| limit - spent)
    }

    fn time_is_up(&self) -> bool {
        self.time_left().is_some_and(|left| left <= 0.0)
    }

    /// Whether `elapsed` seconds (of the whole run) exhaust the time limit.
    fn time_is_up_at(&self, elapsed: f64) -> bool {
        self.time_limit.is_some_and(|limit| elapsed >= limit)
    }

    fn say_time_is_up(&self, last: Option<&EpochMetrics>) {
        if !self.opts.verbose {
            return;
        }
        let limit = self
            .opts
            .config
            .training
            .time_limit
            .as_deref()
            .unwrap_or("");
        let best = self
            .best
            .map_or(String::new(), |b| format!("; best: {}", b.describe()));
        match last {
            Some(m) => eprintln!(
                "time limit {limit} reached at epoch {} ({:.0} s in all): validated and checkpointed{best}",
                m.epoch, m.elapsed_seconds
            ),
            None => eprintln!("time limit {limit} already reached: nothing to train{best}"),
        }
    }

    /// A resumed run that had already trained all its epochs.
    fn say_epochs_done(&self) {
        if !self.opts.verbose {
            return;
        }
        let best = self
            .best
            .map_or(String::new(), |b| format!("; best: {}", b.describe()));
        let epochs = self.opts.config.training.epochs;
        eprintln!(
            "{} has finished its training (epochs = {epochs}): nothing to do; `--epochs N` with N > {epochs} continues it{best}",
            self.opts.run_dir.display(),
        );
    }

    /// Where an epoch starts: from scratch, or where an interrupted one stopped (first
    /// step, phase times, statistics, sums, seconds already spent).
    fn epoch_sums(&mut self) -> (usize, PhaseTimes, StepStats, EpochTotals, f64) {
        let dir = self.checkpoints.dir.clone();
        match self.resume_progress.take() {
            None => (
                0,
                PhaseTimes::default(),
                StepStats::new(dir),
                EpochTotals::default(),
                0.0,
            ),
            Some(p) => (
                p.steps_done,
                PhaseTimes::from_seconds(&p.phase_seconds),
                StepStats::restored(dir, p.stats_seen, p.loss_sum, p.grad_norm_sum),
                EpochTotals {
                    cost_sum: p.cost_sum,
                    baseline_sum: p.baseline_sum,
                    rows: p.rows,
                    instances: p.instances,
                },
                p.seconds,
            ),
        }
    }

    /// A signal arrived after `steps_done` steps of `epoch`: save that point when the
    /// method resumes from it exactly, and say how to go on.
    fn interrupted(
        &self,
        signal: i32,
        epoch: usize,
        steps_done: usize,
        (times, stats, totals, seconds): (&PhaseTimes, &mut StepStats, &EpochTotals, f64),
    ) -> TrainError {
        let run_dir = self.opts.run_dir.display();
        let saved = if M::RESUMES_MID_EPOCH {
            // Burn's running statistics (batch norm) show their last update only once
            // synced; `valid()` syncs them, as the end-of-epoch validation does.
            let _ = self.model.valid();
            let progress = stats
                .flush(epoch, steps_done - 1)
                .map(|()| totals.progress(steps_done, stats, times, seconds));
            let elapsed = self.elapsed_before + self.session_start.elapsed().as_secs_f64();
            match progress.and_then(|p| self.save_checkpoint(epoch, Some(p), false, elapsed)) {
                Ok(dir) => format!("saved {}", dir.display()),
                Err(e) => return e,
            }
        } else {
            format!(
                "epoch {} abandoned after {steps_done} batches; the last checkpoint stays",
                epoch + 1
            )
        };
        TrainError::Interrupted {
            signal,
            message: format!(
                "interrupted by {} in epoch {}, batch {steps_done}: {saved}. Resume with: routeburn train --resume {run_dir}",
                interrupt::name(signal),
                epoch + 1,
            ),
        }
    }

    /// Global-norm clip and the Adam step on the step's summed gradients; the loss and the
    /// norm are kept on the device for the next step's read.
    fn learn(
        &mut self,
        learned: ShardedStep,
        lr: f64,
        times: &mut PhaseTimes,
        stats: &mut StepStats,
    ) -> Result<(), TrainError> {
        let ShardedStep {
            loss,
            grads,
            running,
        } = learned;
        times.time(Phase::Optimizer, || {
            let model = running.apply(self.model.clone());
            let max_norm = self.opts.config.training.max_grad_norm;
            let (model, norm) = self.optimizer.step(lr, model, grads, max_norm)?;
            self.model = model;
            let norm = norm.unwrap_or_else(|| Tensor::zeros([1], &self.device));
            stats.set_pending(Tensor::cat(vec![loss.without_autodiff(), norm], 0));
            Ok(())
        })
    }

    /// The summary, the metrics row, then (at the checkpoint cadence, after the last epoch
    /// and when a time limit stopped this one part-way, `progress`) a checkpoint, and the
    /// best checkpoint when validation improved. Metrics come first: a resume drops rows
    /// past its checkpoint.
    fn finish_epoch(
        &mut self,
        epoch: usize,
        metrics: &EpochMetrics,
        progress: Option<EpochProgress>,
    ) -> Result<(), TrainError> {
        let config = &self.opts.config;
        if self.opts.verbose && config.logging.summary {
            print_summary(metrics, config.training.epochs, &M::describe_costs(metrics));
        }
        append_metrics(&self.metrics_path, metrics)?;
        let validation = BestValidation {
            epoch: metrics.epoch,
            val_cost: metrics.val_cost,
            val_gap: metrics.val_gap,
        };
        let improved = validation.beats(self.best.as_ref());
        if improved {
            self.best = Some(validation);
        }
        let (whole, steps) = match &progress {
            Some(p) => (epoch, Some(p.steps_done)),
            None => (epoch + 1, None),
        };
        let is_last = metrics.epoch == config.training.epochs;
        let every = config.checkpointing.every_epochs;
        if progress.is_some() || metrics.epoch.is_multiple_of(every) || is_last {
            self.save_checkpoint(whole, progress.clone(), false, metrics.elapsed_seconds)?;
        }
        if improved {
            self.save_checkpoint(whole, progress, true, metrics.elapsed_seconds)?;
            if self.opts.verbose && config.logging.summary {
                let name = Checkpoints::name(whole, steps);
                eprintln!("  best so far: checkpoints/best-{name}");
            }
        }
        Ok(())
    }

    /// A checkpoint after `epochs` whole epochs (and `in_epoch` of the next one): the
    /// newest (`latest`), or the best so far (`best`).
    fn save_checkpoint(
        &self,
        epochs: usize,
        in_epoch: Option<EpochProgress>,
        best: bool,
        elapsed: f64,
    ) -> Result<PathBuf, TrainError> {
        // A failed device surfaces at its next read, and the save's reads are Burn's, which
        // panic: wait for the device first, so that a failure is the run's error (and the
        // last checkpoint stays) rather than a panic halfway through writing this one.
        let ready = self.device.sync();
        ready.map_err(|e| TrainError::device("the model for its checkpoint", e))?;
        let config = &self.opts.config;
        let name = Checkpoints::name(epochs, in_epoch.as_ref().map(|p| p.steps_done));
        let write = |dir: &Path| {
            match &self.average {
                Some(average) => {
                    save_module(average.mean(), &dir.join(MODEL_FILE), "weight average")?;
                    save_module(&self.model, &dir.join(TRAINING_MODEL_FILE), "model")?;
                }
                None => save_module(&self.model, &dir.join(MODEL_FILE), "model")?,
            }
            let p = dir.join(OPTIMIZER_FILE);
            self.optimizer.save(&self.model, &p)?;
            let mut baseline = BaselineState::default();
            self.method.save(dir, &mut baseline)?;
            let rngs = [&self.rngs.train, &self.rngs.noise];
            let mut state =
                TrainState::new(config, epochs, rngs, baseline, elapsed, in_epoch, self.best);
            state.averaged_epochs = self.average.as_ref().map_or(0, WeightAverage::count);
            Ok(state)
        };
        match best {
            true => self.checkpoints.save_best(&name, write),
            false => self
                .checkpoints
                .save(&name, config.checkpointing.keep_last, write),
        }
    }
}

impl EpochTotals {
    /// Where an epoch stands after `steps_done` steps, for a checkpoint part-way through.
    fn progress(
        &self,
        steps_done: usize,
        stats: &StepStats,
        times: &PhaseTimes,
        seconds: f64,
    ) -> EpochProgress {
        EpochProgress {
            steps_done,
            cost_sum: self.cost_sum,
            baseline_sum: self.baseline_sum,
            rows: self.rows,
            instances: self.instances,
            stats_seen: stats.seen,
            loss_sum: stats.loss_sum,
            grad_norm_sum: stats.grad_norm_sum,
            phase_seconds: times.to_seconds(),
            seconds,
        }
    }

    fn add(&mut self, step: &StepLoss) {
        self.cost_sum += step.cost_sum;
        self.baseline_sum += step.baseline_sum;
        self.rows += step.rows;
        self.instances += step.instances;
    }
}

fn show_progress(
    progress: &Option<ProgressBar>,
    step: usize,
    (totals, stats): (&EpochTotals, &StepStats),
    epoch_start: Instant,
    time_left: Option<f64>,
) {
    if let Some(pb) = progress {
        pb.set_position(step as u64 + 1);
        let per_second = totals.instances as f64 / epoch_start.elapsed().as_secs_f64();
        let left = time_left.map_or(String::new(), |s| {
            let s = s.max(0.0) as u64;
            format!(", {}:{:02}:{:02} left", s / 3600, s / 60 % 60, s % 60)
        });
        pb.set_message(format!(
            "{per_second:.0} inst/s, cost {:.4}, loss {:.4}{left}",
            totals.cost_sum / totals.rows.max(1) as f64,
            stats.mean_loss()
        ));
    }
}

/// The run's shard count: the config's; else, resuming, the one the run directory's
/// config recorded (1 for a run written before shards existed, which trained with one);
/// else, for a new run, the machine's CPU threads on flex and ndarray (1 on CubeCL's
/// backends, whose device runs one stream).
fn resolve_shards(opts: &TrainOptions) -> usize {
    if let Some(shards) = opts.config.training.shards {
        return shards;
    }
    if opts.resume {
        return Config::load_run(&opts.run_dir.join("config.toml"))
            .ok()
            .and_then(|c| c.training.shards)
            .unwrap_or(1);
    }
    if !opts.backend.traits().runs_one_stream {
        rayon::current_num_threads()
    } else {
        1
    }
}

/// The model, optimizer and weight average of a checkpoint directory (`dir`, whose state
/// is `state`), read into copies of `fresh`.
fn load_training_state<T: Module>(
    fresh: T,
    optimizer: Adam,
    (dir, state): (&Path, &TrainState),
    device: &Device,
) -> Result<(T, Adam, Option<WeightAverage<T>>), TrainError> {
    let load = |file: &str, what: &str| {
        let path = dir.join(file);
        (fresh.clone().try_load_file(&path)).map_err(|e| record_error(&path, what, e))
    };
    let (model, average) = match state.averaged_epochs {
        0 => (load(MODEL_FILE, "model")?, None),
        count => {
            let mean = load(MODEL_FILE, "weight average")?.valid();
            let model = load(TRAINING_MODEL_FILE, "model")?;
            (model, Some(WeightAverage::restored(mean, count)))
        }
    };
    let opt_path = dir.join(OPTIMIZER_FILE);
    if !opt_path.exists() {
        return Err(TrainError::checkpoint(
            &opt_path,
            "no optimizer state to resume with (a model from `routeburn import`? start a run from it with `train --init-from`)",
        ));
    }
    let optimizer = optimizer.load(&model, &opt_path, device)?;
    Ok((model, optimizer, average))
}

/// The checkpoint a run resumes from (the latest, or `name`), checked to be of the
/// config's model.
fn resume_point(
    checkpoints: &Checkpoints,
    config: &Config,
    name: Option<&str>,
) -> Result<(PathBuf, TrainState), TrainError> {
    let (dir, state) = match name {
        Some(name) => checkpoints.named(name)?,
        None => checkpoints.latest()?,
    };
    if state.model_kind != config.model_kind() {
        return Err(TrainError::checkpoint(
            &dir,
            format!(
                "checkpoint is of model `{}`, the run's config says `{}`",
                state.model_kind,
                config.model_kind()
            ),
        ));
    }
    Ok((dir, state))
}

/// Drops metrics rows past the checkpoint a run resumes from, and says so.
fn announce_resume(
    opts: &TrainOptions,
    metrics_path: &Path,
    start_epoch: usize,
) -> Result<(), TrainError> {
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

/// Refuses an earlier run's directory for a new run, which would replace its metrics, best
/// checkpoint and initial weights.
pub(crate) fn check_new_run_dir(run_dir: &Path) -> Result<(), TrainError> {
    match run_dir.join("config.toml").exists() {
        true => Err(TrainError::Input(format!(
            "--run-dir {0}: already a run directory; continue it with `routeburn train --resume {0}`, or choose another (or delete it)",
            run_dir.display()
        ))),
        false => Ok(()),
    }
}

/// A fresh run directory: the resolved config, and no metrics of an earlier run.
fn start_run_dir(run_dir: &Path, config: &Config, metrics_path: &Path) -> Result<(), TrainError> {
    check_new_run_dir(run_dir)?;
    std::fs::create_dir_all(run_dir).map_err(|e| TrainError::io(run_dir, e))?;
    write_atomic(&run_dir.join("config.toml"), config.to_toml().as_bytes())?;
    if metrics_path.exists() {
        std::fs::remove_file(metrics_path).map_err(|e| TrainError::io(metrics_path, e))?;
    }
    Ok(())
}
